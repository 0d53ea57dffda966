"""Nightly training on a Dask cluster: features built where the data is, trees grown by
``lightgbm.dask``, the same artifact as a one-machine run.

The path, for a window too large for one machine (or a cluster already at hand):

1. The store's attempts of the window (and the history before it) are exported once to
   Parquet, a directory a day (:func:`leap.data.export.export_parquet`), on a file system
   every worker reaches.
2. The window's days are split into tasks of up to a week (one pair-model refit each). A
   worker reads, with DuckDB, only the days its task's snapshots need
   (:func:`~leap.model.window.history_start`), builds the history snapshot of each day and
   encodes that day's rows and masked rows (:func:`~leap.model.window.encode_days`: the very
   code of a one-machine run, so the rows are the same). The encoded rows stay in the
   workers' memory; only targets, days and flags (a few bytes a row) come back. Another
   worker builds the serving snapshot and the held-out day the same way.
3. The rows are dealt over the workers (:func:`deal_rows`: each holds every W-th row, so
   each bins its features on a sample of the whole window) and the model is fit on them
   where they lie: each specialist and the novel-rows model are grown by ``lightgbm.dask``
   (data-parallel, every worker on its own rows); the router,
   fit on a 100,000-row sample, and the early-stopping and interval rows (the last day) are
   small and come to the client.
4. The artifact is written by the same code as ever.

Early stopping: distributed LightGBM has no safe early-stopping callback (each worker would
judge its own rows and could stop at a different round). :class:`DaskFitter` grows the full
``max_rounds`` and then cuts the model where LightGBM's early stopping would have stopped, on
the same validation rows and metric, so the artifact holds the same kind of model.

Reproducibility: a one-machine run gives the same model to the bit every time; a Dask run
does not. ``lightgbm.dask`` numbers the workers in the order the scheduler lists the data's
parts (not fixed from run to run), and each worker bins some of the features on its own rows,
so two runs on the same rows can bin a feature differently. On the tests' small fleet 14 runs
spread 0.8 points of held-out accuracy, inside the spread of one machine's seeds (1.3 points).

Dask is imported only here, so ``import leap`` stays cheap.
"""

from __future__ import annotations

import functools
import logging
import operator
import os
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np

from leap.catalog import Catalog
from leap.data.export import ParquetAttempts, export_parquet
from leap.data.store import Store
from leap.errors import ModelError, ParamError
from leap.features.encode import FEATURE_NAMES, FeatureSpec
from leap.features.pairs import PAIR_DAYS, refit_day
from leap.model.cascade import GBMParams
from leap.model.train import WindowModel, fit_window
from leap.model.window import (
    TRAIN_DTYPE,
    CacheUse,
    DayBlocks,
    HeldOut,
    NightCache,
    Progress,
    TrainConfig,
    day_start,
    encode_days,
    held_out_day,
    history_builder,
    history_start,
    load_attempts,
    pair_schedule,
    succeeded_attempts,
    training_set,
    window_spec,
)

#: Columns the client reads of the whole window (for the feature spec).
_SPEC_COLUMNS = ("submitted_at", "status", "throughput", "hardware", "model_category")


@contextmanager
def dask_client(address: str, workers: int = 2) -> Iterator[Any]:
    """A ``distributed`` client, closed on exit (with the LocalCluster it started).

    ``address`` is ``"local"`` (a LocalCluster of ``workers`` processes, one thread each:
    each task already runs LightGBM's own threads) or a scheduler's ``tcp://HOST:PORT``.
    """
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError as exc:  # an optional extra in some installs
        raise ParamError(f"{{dask}} needs dask[distributed] ({exc}); pip install "
                         "'dask[distributed]'") from None
    if address == "local":
        # A free port for the scheduler's web server: None still takes :8787, and two local
        # clusters at once (say, two test processes) warned that it was in use.
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                          dashboard_address=":0", silence_logs=40) as cluster, \
                Client(cluster) as client:
            client.run(_mute_stdout)
            yield client
        return
    if "://" not in address:
        raise ParamError(f"{{dask}} must be 'local' or a scheduler address like "
                         f"tcp://10.0.0.5:8786, got {address!r}")
    try:
        client = Client(address, timeout="20s")
    except OSError as exc:
        raise ParamError(f"cannot reach the Dask scheduler at {address} ({exc}); start one "
                         "with `dask scheduler` or use {dask} local") from None
    with client:
        yield client


def _mute_stdout() -> None:
    """In a worker of our LocalCluster: its standard output (LightGBM's native network log,
    which no Python logger can reach) goes to /dev/null rather than to the user's terminal."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


@dataclass(frozen=True)
class EncodeTask:
    """Some consecutive days of a window for one worker to encode (plain data: it
    travels)."""

    directory: str
    catalog: Catalog
    cfg: TrainConfig
    spec: FeatureSpec
    window_start: datetime
    days: tuple[int, ...]
    #: The client's :class:`~leap.model.window.NightCache` folder, where the workers can
    #: reach it (``None``: nothing is kept).
    cache_dir: str | None = None

    def night_cache(self) -> NightCache | None:
        return NightCache.at(Path(self.cache_dir)) if self.cache_dir is not None else None


@dataclass(frozen=True)
class NightShare:
    """The flat carry's share of the night's pair model (``None`` without pair models), and
    what judging it did with the :class:`~leap.model.window.NightCache`."""

    share: float | None
    cached: CacheUse = field(default_factory=CacheUse)


def _night_share_task(task: EncodeTask) -> NightShare:
    """Runs on a worker: the flat carry's share of the night's pair model
    (:meth:`~leap.features.pairs.PairSchedule.night_share`)."""
    if not (task.cfg.pair_model and task.cfg.use_history):
        return NightShare(None)
    as_of = task.window_start + timedelta(days=task.cfg.window_days)
    attempts = load_attempts(ParquetAttempts(Path(task.directory)),
                             as_of - timedelta(days=PAIR_DAYS), as_of)
    cache = task.night_cache()
    schedule = pair_schedule(attempts, task.catalog, as_of, task.cfg,
                             store=cache.pairs if cache is not None else None)
    share = schedule.night_share() if schedule is not None else None
    return NightShare(share, cache.used() if cache is not None else CacheUse())


def _encode_task(task: EncodeTask, night: NightShare) -> DayBlocks:
    """Runs on a worker: read the days the task's snapshots need, encode its days, reading
    the flat carry at the night's ``share``."""
    first = task.window_start + timedelta(days=task.days[0])
    end = task.window_start + timedelta(days=task.days[-1] + 1)
    attempts = load_attempts(ParquetAttempts(Path(task.directory)),
                             history_start(first, task.cfg), end)
    cache = task.night_cache()
    builder = history_builder(attempts, task.catalog, end, task.cfg, share=night.share,
                              pair_store=cache.pairs if cache is not None else None)
    try:
        blocks = encode_days(attempts, builder, task.catalog, task.window_start, task.days,
                             task.cfg, task.spec,
                             day_store=cache.days if cache is not None else None)
    finally:
        builder.close()
    return replace(blocks, cached=cache.used()) if cache is not None else blocks


def _held_out_task(task: EncodeTask) -> HeldOut:
    """Runs on a worker: the serving snapshot and the held-out day after the window
    (``task.days`` is not read)."""
    as_of = task.window_start + timedelta(days=task.cfg.window_days)
    # From the history of the first validation day: its rows calibrate a new type's interval
    # (:func:`~leap.model.window.new_type_rows`).
    first_val = as_of - timedelta(days=task.cfg.validation_days)
    attempts = load_attempts(ParquetAttempts(Path(task.directory)),
                             history_start(first_val, task.cfg), as_of + timedelta(days=1))
    cache = task.night_cache()
    builder = history_builder(attempts, task.catalog, as_of, task.cfg,
                              pair_store=cache.pairs if cache is not None else None)
    try:
        held = held_out_day(attempts, builder, task.catalog, as_of, task.cfg, task.spec)
    finally:
        builder.close()
    return replace(held, cached=cache.used()) if cache is not None else held


def _small(blocks: DayBlocks) -> DayBlocks:
    """The task's result without its feature rows (what comes back to the client)."""
    return replace(blocks, X=np.empty((len(blocks.y), 0)))


def _tasks(window_start: datetime, cfg: TrainConfig) -> list[tuple[int, ...]]:
    """The window's days, cut where the pair model is refit (at most a week a task)."""
    groups: dict[datetime, list[int]] = {}
    for d in range(cfg.window_days):
        groups.setdefault(refit_day(window_start + timedelta(days=d)), []).append(d)
    return [tuple(days) for _, days in sorted(groups.items())]


def train_window_dask(directory: Path, catalog: Catalog, as_of: datetime, client: Any,
                      cfg: TrainConfig | None = None,
                      progress: Progress | None = None,
                      disk_cache: NightCache | None = None) -> WindowModel:
    """:func:`~leap.model.train.train_window` over an export (:func:`export_parquet`) on the
    cluster behind ``client``: same features, same kind of artifact, evaluated the same way.

    The client only directs and fits what is small: every heavy step runs in a worker, on
    one LightGBM thread a task (a worker runs one task a thread), so nothing fights over
    the cores. With ``disk_cache`` (its folder where every worker reaches it, as the
    export's) the workers read and keep pair models and encoded days there as one machine
    does, and the entries they used are counted as used in ``disk_cache`` (pruning it is
    the caller's).
    """
    cfg = cfg or TrainConfig()
    as_of = day_start(as_of)
    window_start = as_of - timedelta(days=cfg.window_days)
    source = ParquetAttempts(directory)
    t0 = time.perf_counter()
    head = source.attempts(window_start, as_of, columns=list(_SPEC_COLUMNS)).to_pandas()
    spec = window_spec(succeeded_attempts(head, catalog), catalog, cfg, window_start, as_of)
    del head
    task_cfg = replace(cfg, threads=1)
    cache_dir = str(disk_cache.directory) if disk_cache is not None else None
    night = EncodeTask(str(directory), catalog, task_cfg, spec, window_start, (), cache_dir)
    # Every day reads the served pair model's share, fit on a worker before the days' tasks
    # start. The held-out task fits that model again for the snapshot it serves: the two
    # run side by side, so the days need not wait for the held-out day's encode.
    share = client.submit(_night_share_task, night, pure=False)
    futures = client.map(_encode_task, [
        EncodeTask(str(directory), catalog, task_cfg, spec, window_start, days, cache_dir)
        for days in _tasks(window_start, cfg)], night=share, pure=False)
    held_future = client.submit(_held_out_task, night, pure=False)
    small = client.map(_small, futures)
    parts: list[DayBlocks] = []
    for i, fut in enumerate(small):
        parts.append(fut.result())
        if progress:
            progress("features", i + 1, len(small) + 1)
    held = held_future.result()
    if disk_cache is not None:
        disk_cache.keep(functools.reduce(operator.or_, (p.cached for p in parts),
                                         held.cached | share.result().cached))
    X, order = deal_rows(client, client.map(operator.attrgetter("X"), futures),
                         [len(p.y) for p in parts], len(FEATURE_NAMES))
    del futures
    blocks = DayBlocks(X=X, y=np.concatenate([p.y for p in parts])[order],
                       day=np.concatenate([p.day for p in parts])[order],
                       masked=np.concatenate([p.masked for p in parts])[order],
                       group=np.concatenate([p.group for p in parts])[order],
                       family=np.concatenate([p.family for p in parts])[order])
    timings = {"features_wall_s": time.perf_counter() - t0,
               "snapshot_s": sum(p.snapshot_s for p in parts) + held.snapshot_s,
               "features_s": sum(p.features_s for p in parts) + held.features_s}
    if progress:
        progress("features", len(small) + 1, len(small) + 1)
    ts = training_set(blocks, held, spec, timings)
    return fit_window(ts, catalog, as_of, cfg, progress, DaskFitter(client))


def deal_rows(client: Any, blocks: list[Any], sizes: list[int],
              n_cols: int) -> tuple[BlockRows, np.ndarray]:
    """Deal the rows of ``blocks`` (futures of matrices, ``sizes`` rows each) over the
    cluster's workers like cards: row ``i`` of all of them, in order, to worker ``i % W``.

    ``lightgbm.dask`` grows trees on the rows where they lie, and each worker bins some of
    the features from its own rows alone. Rows left where they were encoded (a week a task)
    would give a feature its bins from one week: a category that week never saw (a type,
    a family new since) would share a bin with others, and the model would lose about 4
    points of accuracy (measured on the test fleet). Dealt, each worker holds a sample of
    every day and the bins are those of one machine. Returns the dealt rows and ``order``,
    the position each came from: index the client's per-row arrays with it.
    """
    workers = sorted(client.nthreads())
    n, w = int(sum(sizes)), len(workers)
    starts = np.cumsum([0, *sizes])
    dealt, dealt_sizes = [], []
    for k, worker in enumerate(workers):
        if k >= n:
            break
        # Rows of block b dealt to worker k: its i with (starts[b] + i) % w == k.
        hands = [client.submit(_every, block, (k - int(starts[b])) % w, w)
                 for b, block in enumerate(blocks) if sizes[b]]
        dealt.append(client.submit(np.concatenate, hands, workers=[worker],
                                   allow_other_workers=False))
        dealt_sizes.append(len(range(k, n, w)))
    order = np.concatenate([np.arange(k, n, w) for k in range(w)])
    return BlockRows.from_futures(dealt, dealt_sizes, n_cols), order


def _every(X: np.ndarray, first: int, step: int) -> np.ndarray:
    """Rows ``first``, ``first + step``, ... of ``X`` (a copy: only they travel)."""
    return X[first::step].copy()


def train_store_dask(store: Store, catalog: Catalog, as_of: datetime, client: Any,
                     cfg: TrainConfig | None = None, export_dir: Path | None = None,
                     progress: Progress | None = None,
                     disk_cache: NightCache | None = None) -> WindowModel:
    """Export what the window needs from ``store`` to ``export_dir`` (default: a temporary
    directory, which only a cluster on this machine can reach) and train on ``client``
    (``disk_cache``: see :func:`train_window_dask`)."""
    cfg = cfg or TrainConfig()
    as_of = day_start(as_of)
    start = history_start(as_of - timedelta(days=cfg.window_days), cfg)
    with ExitStack() as stack:
        directory = export_dir if export_dir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="leap-export-"))) / "attempts"
        export_parquet(store, directory, start, as_of + timedelta(days=1))
        return train_window_dask(directory, catalog, as_of, client, cfg, progress, disk_cache)


class BlockRows:
    """Rows of a feature matrix kept on the workers, in blocks (one per encoding task).

    Indexes as the fitting code indexes a NumPy matrix (``X[rows]``, ``X[:, j]``,
    ``np.asarray(X)``), so :mod:`leap.model.cascade` needs no second code path, with two
    differences that make it fit for :class:`DaskFitter`: selecting rows selects within each
    block (a block never moves, and blocks left empty are dropped: a worker must not be handed
    zero rows), and a single column or ``np.asarray`` brings the values to the client.
    """

    def __init__(self, blocks: list[Any], sizes: list[int], n_cols: int) -> None:
        self.blocks = blocks  # dask arrays, one chunk each
        self.sizes = sizes
        self.shape = (int(sum(sizes)), n_cols)

    @classmethod
    def from_futures(cls, futures: list[Any], sizes: list[int], n_cols: int) -> BlockRows:
        import dask.array as da

        kept = [(f, n) for f, n in zip(futures, sizes, strict=True) if n]
        return cls([da.from_delayed(f, shape=(n, n_cols), dtype=TRAIN_DTYPE) for f, n in kept],
                   [n for _, n in kept], n_cols)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> Any:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        if isinstance(cols, int | np.integer):  # one column: to the client
            if rows != slice(None):
                raise IndexError("BlockRows takes one column of every row only")
            return np.asarray(self.to_dask()[:, int(cols)].compute())
        blocks = self.blocks if cols == slice(None) else [b[:, cols] for b in self.blocks]
        n_cols = len(range(self.shape[1])[cols]) if isinstance(cols, slice) else len(cols)
        if isinstance(rows, slice) and rows == slice(None):
            return BlockRows(blocks, list(self.sizes), n_cols)
        idx = np.asarray(rows)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        if np.any(np.diff(idx) < 0):
            raise IndexError("BlockRows selects rows in order only")
        starts = np.cumsum([0, *self.sizes])
        cut = np.searchsorted(idx, starts)
        kept, sizes = [], []
        for i, block in enumerate(blocks):
            if cut[i + 1] > cut[i]:
                kept.append(block[idx[cut[i]:cut[i + 1]] - starts[i]])
                sizes.append(int(cut[i + 1] - cut[i]))
        return BlockRows(kept, sizes, n_cols)

    def to_dask(self) -> Any:
        """One dask array, a chunk per block."""
        import dask.array as da

        if not self.blocks:
            raise ModelError("no rows to fit on")
        return da.concatenate(self.blocks)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        import dask

        if not self.blocks:
            return np.empty(self.shape, dtype=dtype or np.float64)
        out = np.concatenate(dask.compute(*self.blocks))
        return out if dtype is None else out.astype(dtype)


def quiet_lightgbm() -> None:
    """Send LightGBM's Python-side messages in this process ("Finding random open ports")
    to the debug level of the ``leap.lightgbm`` logger."""
    lgb.register_logger(logging.getLogger("leap.lightgbm"), info_method_name="debug",
                        warning_method_name="debug")


class DaskFitter:
    """Grows boosters with ``lightgbm.dask`` on the rows of a dask array, where they lie.

    The validation rows (NumPy, on the client) pick the number of rounds as LightGBM's early
    stopping would (:func:`early_stop_rounds`); the returned booster holds just those.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        quiet_lightgbm()

    def train(self, params: GBMParams, X: Any, y: np.ndarray, init: np.ndarray,
              names: list[str], categorical: list[str],
              val: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> lgb.Booster:
        import dask.array as da
        from lightgbm.dask import DaskLGBMRegressor

        if not isinstance(X, BlockRows):
            raise ModelError(f"DaskFitter fits BlockRows, got {type(X).__name__}")
        chunks = (tuple(X.sizes),)
        lgb_params = params.lgb_params()
        del lgb_params["num_threads"]  # each worker uses its own threads
        est = DaskLGBMRegressor(client=self.client, n_estimators=params.max_rounds,
                                **lgb_params)
        with warnings.catch_warnings():  # "n_jobs ignored": the sklearn wrapper's own default
            warnings.simplefilter("ignore", UserWarning)
            est.fit(X.to_dask(), da.from_array(y, chunks=chunks),
                    init_score=da.from_array(init, chunks=chunks),
                    feature_name=names, categorical_feature=categorical)
        booster = est.booster_
        if val is None or len(val[1]) == 0:
            return booster
        rounds = early_stop_rounds(booster, val, params)
        return lgb.Booster(model_str=booster.model_to_string(num_iteration=rounds))


def early_stop_rounds(booster: lgb.Booster, val: tuple[np.ndarray, np.ndarray, np.ndarray],
                      params: GBMParams) -> int:
    """The rounds LightGBM's early stopping would keep: the best round on ``val`` by the
    objective's own metric, stopping ``params.early_stopping_rounds`` rounds without a
    strict improvement.

    >>> import lightgbm as lgb
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(400, 3)); y = X[:, 0] + rng.normal(scale=0.1, size=400)
    >>> p = GBMParams(objective="l2", min_data_in_leaf=5)
    >>> b = lgb.train(p.lgb_params(), lgb.Dataset(X[:300], y[:300]), 40)
    >>> 1 <= early_stop_rounds(b, (X[300:], y[300:], np.zeros(100)), p) <= 40
    True
    """
    Xv, yv, init = val
    n = booster.num_trees()
    pred = init.astype(np.float64).copy()
    best, best_loss = 0, np.inf
    for t in range(n):
        pred += booster.predict(Xv, start_iteration=t, num_iteration=1, raw_score=True)
        err = yv - pred
        loss = float(np.mean(np.maximum(0.5 * err, -0.5 * err))) \
            if params.objective == "quantile" else float(np.mean(err ** 2))
        if loss < best_loss:
            best, best_loss = t, loss
        elif t - best >= params.early_stopping_rounds:
            break
    return best + 1
