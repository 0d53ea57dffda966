"""The training set of a window: attempts -> point-in-time history snapshots -> encoded rows.

For each day of the window, the rows of that day are encoded against a snapshot of the
history before it (never their own day), and a share of them again with their own (family,
type) history masked (what serving sees on a type the family never ran on); the held-out day
is encoded against the snapshot as of its start, as serving will see it. The pieces
(:func:`history_builder`, :func:`encode_days`, :func:`held_out_day`, :func:`training_set`)
are what :func:`build_training_set` composes on one machine and what
:mod:`leap.model.distributed` runs on Dask workers.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap.cache import DiskCache, digest, source_digest
from leap.catalog import Catalog
from leap.data.store import Store
from leap.data.usage import usable_attempts
from leap.errors import ModelError, ParamError
from leap.features.encode import (
    FEATURE_NAMES,
    FeatureSpec,
    encode,
    new_trainer_count,
    novelty,
)
from leap.features.history import LEVELS, HistoryBuilder, Snapshot, prepare_history
from leap.features.pairs import (
    PAIR_DAYS,
    PairModel,
    PairParams,
    PairSchedule,
    PairStore,
    refit_day,
)
from leap.features.transfer import TRANSFER_FEATURES
from leap.memory import release_free_memory
from leap.threads import map_in_order, run_each

Progress = Callable[[str, int, int], None]

#: History features (and the estimate built from them): what the no-history ablation drops.
HISTORY_FEATURES = frozenset([s for lv in LEVELS for s in lv.stats] + list(TRANSFER_FEATURES)
                             + ["xfer_est", "xfer_g_est", "xfer_p_est", "has_family_history",
                                "hist_level", "hist_est"])
#: The dtype of the window's training matrix, set as each day is encoded
#: (:func:`encode_days`): the matrix is the largest thing training holds, float32 halves it,
#: and LightGBM bins float32 without a copy. Measured: held-out accuracy unchanged at 1x
#: (84.6%) and 4x (87.6%); serving still encodes float64.
TRAIN_DTYPE = np.float32
#: Folds of (family, type) pairs masked in turn on the held-out day (evaluation only).
EVAL_MASK_FOLDS = 4
#: Types hidden, one at a time, on each validation day to calibrate the interval of a type
#: nobody ran on in the window (:func:`new_type_rows`): at least this many, and more until
#: their rows number :data:`NEW_TYPE_MIN_ROWS` (a public table's day has a few rows a type).
NEW_TYPE_FOLDS = 4
NEW_TYPE_MIN_ROWS = 200
#: Model types hidden, one at a time, on each validation day to calibrate the interval of a
#: model type nobody ran in the window (:func:`new_model_type_rows`; and more until
#: :data:`NEW_TYPE_MIN_ROWS` rows). A model type's rows miss together, so the interval needs
#: more of them than a type's: on the default fleet's day 31, 54 model types left out of
#: training were covered 75.2% of the time with 4 a day, 76.4% with 10 (71.0% without the
#: cell; weighing each model type once instead of each row: 94.4%).
NEW_MODEL_TYPE_FOLDS = 10
#: Runs (family, type, trainer count) of a validation day hidden from their pair to calibrate
#: the interval of a trainer count new to its pair (:func:`new_trainer_count_rows`): in up to
#: this many folds (one run of a pair a fold: a public table's day has few pairs, each with
#: several trainer counts), of at most :data:`NEW_TRAINER_COUNT_PAIRS` runs each, so the cost
#: stays a few snapshots and encodes of a few thousand rows a day.
NEW_TRAINER_COUNT_FOLDS = 4
NEW_TRAINER_COUNT_PAIRS = 2_000


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one nightly training run (the CLI builds it once).

    ``model_kind`` is ``"cascade"`` (default, K specialists) or ``"global"`` (one model, the
    ablation). ``objective`` is ``"quantile"`` (median, default) or ``"l2"`` (mean, ablation).
    ``validation_days`` trailing days of the window serve for early stopping (a time-based
    split, never a random one) and for calibrating the prediction intervals.
    ``mask_share`` of each day's (family, type) pairs with history also enter training as a
    second row encoded with that pair's own history removed (see
    :func:`masked_rows`), so the trees learn to transfer to types a family never ran on.
    ``interval_coverage`` is the nominal coverage of the prediction intervals.
    ``pair_model`` carries a family's level to types it never ran on with the pair models
    (:mod:`leap.features.pairs`, refit weekly on the two weeks before); off, with the
    transfer tables alone (the ablation); ``pair_params`` are their boosters' settings
    (``None``: :class:`~leap.features.pairs.PairParams`' defaults; the seed and threads are
    always this configuration's). ``threads`` is the cores training uses in this
    process: that many days encoded at once, and that many boosters grown side by side
    (:mod:`leap.threads`). Fits are deterministic and each day is encoded alone, so it
    changes the speed, never the model (where several trainings run at once, as in a
    backtest or on Dask workers, the caller lowers it so they do not oversubscribe the
    cores).
    """

    window_days: int = 30
    lookback_days: int = 30
    model_kind: str = "cascade"
    n_specialists: int = 13
    objective: str = "quantile"
    use_history: bool = True
    validation_days: int = 1
    quality_margin: float = 0.02
    mask_share: float = 0.3
    interval_coverage: float = 0.8
    pair_model: bool = True
    pair_params: PairParams | None = None
    seed: int = 0
    threads: int = 2

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainConfig:
        """The configuration ``dataclasses.asdict`` wrote (pair settings included)."""
        pair = saved.get("pair_params")
        return cls(**{**saved, "pair_params": PairParams(**pair) if pair else None})

    def __post_init__(self) -> None:
        if self.window_days < 2:
            raise ModelError(f"window_days must be >= 2, got {self.window_days}")
        if self.model_kind not in ("cascade", "global"):
            raise ModelError(f"model kind must be 'cascade' or 'global', got {self.model_kind!r}")
        if self.objective not in ("quantile", "l2"):
            raise ModelError(f"objective must be 'quantile' or 'l2', got {self.objective!r}")
        if not 0 < self.validation_days < self.window_days:
            raise ModelError("validation_days must be between 1 and window_days - 1")
        if not 0 <= self.mask_share <= 1:
            raise ModelError(f"mask_share must be in [0, 1], got {self.mask_share}")
        if not 0 < self.interval_coverage < 1:
            raise ModelError(f"interval_coverage must be in (0, 1), got "
                             f"{self.interval_coverage}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) \
                or self.threads < 1:
            raise ModelError(f"threads must be a whole number >= 1, got {self.threads!r}")


@dataclass
class TrainingSet:
    """Encoded rows of a window (``day`` = days since the window start) and the eval day.

    ``group`` is each row's novelty group (index into
    :data:`~leap.features.encode.NOVELTY_GROUPS`) and ``masked`` marks the rows encoded with
    their own (family, type) history removed. ``eval_masked_X`` holds the held-out day's rows
    encoded that way (``eval_masked_rows`` are their positions in ``eval_jobs``).
    ``new_type_X`` and ``new_type_y`` are validation rows encoded as if nobody had run on
    their type (:func:`new_type_rows`): never fitted on, they calibrate a new type's interval;
    ``new_model_type_X`` and ``new_model_type_y`` the same for a model type nobody ran
    (:func:`new_model_type_rows`), and ``new_trainer_count_X`` and ``new_trainer_count_y``
    for a trainer count new to its (family, type) pair (:func:`new_trainer_count_rows`).
    ``family`` is each row's family code (:func:`family_codes`).
    """

    X: np.ndarray
    y: np.ndarray
    day: np.ndarray
    spec: FeatureSpec
    fallback_log_tp: float
    serving_snapshot: Snapshot
    eval_jobs: pd.DataFrame
    eval_X: np.ndarray
    group: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    masked: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=bool))
    eval_group: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    eval_masked_X: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    eval_masked_rows: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    eval_masked_group: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    new_type_X: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    new_type_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    new_model_type_X: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    new_model_type_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    new_trainer_count_X: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    new_trainer_count_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    family: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    timings: dict[str, float] = field(default_factory=dict)



def day_start(d: date | datetime) -> datetime:
    if isinstance(d, datetime):
        d = d.astimezone(UTC).date()
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def default_as_of(store: Store, now: datetime | None = None) -> datetime:
    """The day after the last full day in the store, never after ``now``.

    The last day with attempts counts as full when its latest attempt is after 20:00 UTC;
    otherwise that partial day becomes the as-of day (and is the held-out day). With ``now``
    (the wall clock, passed by ``leap train``), attempts stamped after it are ignored, so one
    row dated in the future cannot move training into an empty window.
    """
    rng = store.time_range(until=now)
    if rng is None:
        raise ParamError("the store has no attempts" + (
            f" submitted before {now:%Y-%m-%d %H:%M} UTC" if now is not None else "")
            + "; ingest or simulate some first (or pass {as_of})")
    last = rng[1].astimezone(UTC)
    as_of = day_start(last) + (timedelta(days=1) if last.hour >= 20 else timedelta(0))
    return as_of if now is None else min(as_of, day_start(now))


def load_attempts(source: Any, start: datetime, end: datetime) -> pd.DataFrame:
    """Attempts submitted in ``[start, end)`` of ``source`` (a :class:`Store` or
    :class:`~leap.data.export.ParquetAttempts`) in a stable order (time, then id: both read
    through :func:`leap.data.store.read_attempts`, which orders them)."""
    frame = source.attempts(start, end).to_pandas()
    release_free_memory()  # the Arrow buffers of the columns copied out into NumPy
    if len(frame):
        frame["submitted_at"] = pd.to_datetime(frame["submitted_at"], utc=True)
    return frame


def window_attempts(source: Any, as_of: datetime, cfg: TrainConfig) -> pd.DataFrame:
    """What training the window before ``as_of`` reads from ``source`` (a store or
    :class:`~leap.data.export.ParquetAttempts`): the window, the history its first day's
    snapshot needs (:func:`history_start`), and the held-out day."""
    as_of = day_start(as_of)
    return load_attempts(source, history_start(as_of - timedelta(days=cfg.window_days), cfg),
                         as_of + timedelta(days=1))


def succeeded_attempts(frame: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """The window's attempts that measured a throughput on a ``catalog`` type
    (:func:`leap.data.usage.usable_attempts`)."""
    return usable_attempts(frame, catalog)


@dataclass
class EncodeCache:
    """What consecutive nightly windows share (a backtest worker keeps one across nights).

    A day's encoded rows depend only on the attempts before that day and on the feature spec
    (``blocks``, keyed by day and spec); a day's prepared history rows depend only on that
    day's attempts and the catalog (``history``, keyed by day and catalog); a pair model
    depends only on the attempts before its refit day (``pairs``, see
    :class:`~leap.features.pairs.PairSchedule`). Each entry also records its row count, so
    a day that gained rows is rebuilt.
    """

    blocks: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    history: dict[tuple[str, str], tuple[int, pd.DataFrame]] = field(default_factory=dict)
    masked: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    pairs: dict[tuple[str, int, str], PairModel | None] = field(default_factory=dict)

    def prune(self, as_of: datetime, cfg: TrainConfig) -> None:
        """Forget what no window ending at or after ``as_of`` can use."""
        window = (as_of - timedelta(days=cfg.window_days)).date().isoformat()
        lookback = (as_of - timedelta(days=cfg.window_days + cfg.lookback_days)).date().isoformat()
        for k in [k for k in self.blocks if k[0] < window]:
            del self.blocks[k]
        for k in [k for k in self.masked if k[0] < window]:
            del self.masked[k]
        for h in [h for h in self.history if h[0] < lookback]:
            del self.history[h]
        oldest_refit = refit_day(as_of - timedelta(days=cfg.window_days)).date().isoformat()
        for p in [p for p in self.pairs if p[0] < oldest_refit]:
            del self.pairs[p]


def _prepared_history(past: pd.DataFrame, catalog: Catalog,
                      cache: EncodeCache | None) -> pd.DataFrame:
    """:func:`prepare_history` of ``past``, day by day through ``cache`` when given."""
    if cache is None or past.empty:
        return prepare_history(past, catalog)
    fingerprint = catalog.fingerprint()
    parts = []
    for day, rows in past.groupby(past["submitted_at"].dt.floor("D"), sort=True):
        key = (day.date().isoformat(), fingerprint)
        hit = cache.history.get(key)
        if hit is None or hit[0] != len(rows):
            hit = cache.history[key] = (len(rows), prepare_history(rows, catalog))
        parts.append(hit[1])
    return pd.concat(parts, ignore_index=True)


def masked_rows(rows: pd.DataFrame, X_full: np.ndarray, builder: HistoryBuilder,
                as_of: datetime, catalog: Catalog, spec: FeatureSpec, rng: np.random.Generator,
                *, share: float = 1.0, folds: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Re-encode rows with their own (family, type) history removed: what serving sees on a
    type the family never ran on.

    Among the distinct (family, type) pairs of ``rows`` that have history as of ``as_of``
    (``X_full`` is ``rows`` encoded with every feature), ``share`` are drawn and split into
    ``folds``; each fold's rows are encoded against a snapshot built without any attempt of
    that fold's pairs (:meth:`HistoryBuilder.snapshot` with ``exclude``), so nothing of the
    masked pair's own history can reach its row.

    Returns the encoded rows (every feature) and their positions in ``rows``.
    """
    full = FeatureSpec(names=FEATURE_NAMES, vocab=spec.vocab)
    has_pair = np.isfinite(X_full[:, FEATURE_NAMES.index("fam_hw_n")])
    if share <= 0 or not has_pair.any():
        return np.empty((0, len(FEATURE_NAMES))), np.empty(0, dtype=np.int64)
    pair_key = rows["family_id"].astype(str) + "\x1f" + rows["hardware"].astype(str)
    pairs = pd.unique(pair_key[has_pair])
    chosen = pairs[rng.random(len(pairs)) < share]
    fold_of = dict(zip(chosen, rng.integers(0, folds, len(chosen)), strict=True))
    row_fold = pair_key.map(fold_of).to_numpy(dtype=np.float64, na_value=np.nan)
    blocks, where = [], []
    for k in range(folds):
        idx = np.flatnonzero((row_fold == k) & has_pair)
        if len(idx) == 0:
            continue
        sub = rows.iloc[idx]
        snap = builder.snapshot(as_of, exclude=sub[["family_id", "hardware"]].drop_duplicates())
        blocks.append(encode(sub, snap, catalog, full))
        where.append(idx)
    if not blocks:
        return np.empty((0, len(FEATURE_NAMES))), np.empty(0, dtype=np.int64)
    return np.vstack(blocks), np.concatenate(where)


def history_start(t: datetime, cfg: TrainConfig) -> datetime:
    """The earliest attempt a snapshot as of ``t`` reads: its lookback window, and the pair
    model's fitting days before its refit day (:class:`~leap.features.pairs.PairSchedule`)
    when there is one."""
    start = t - timedelta(days=cfg.lookback_days)
    if cfg.pair_model and cfg.use_history:
        start = min(start, refit_day(t) - timedelta(days=PAIR_DAYS))
    return start


def submitted_in(attempts: pd.DataFrame, start: datetime | None, end: datetime) -> pd.DataFrame:
    """The rows of ``attempts`` submitted in ``[start, end)`` (``start`` None: every row
    before ``end``): a slice, not a copy, when they are in time order (as
    :func:`load_attempts` gives them; a 4x window's copy was 0.5 GiB, and a filter over it
    took 0.2 s a day).

    >>> at = pd.to_datetime(["2026-01-01", "2026-01-02", "2026-01-03"], utc=True)
    >>> frame = pd.DataFrame({"submitted_at": at})
    >>> len(submitted_in(frame, None, at[2])), len(submitted_in(frame, at[1], at[2]))
    (2, 1)
    """
    at = attempts["submitted_at"]
    if at.is_monotonic_increasing:
        lo = 0 if start is None else int(at.searchsorted(start, side="left"))
        return attempts.iloc[lo:int(at.searchsorted(end, side="left"))]
    return attempts[(at < end) if start is None else (at >= start) & (at < end)]


def history_builder(attempts: pd.DataFrame, catalog: Catalog, until: datetime,
                    cfg: TrainConfig, cache: EncodeCache | None = None,
                    share: float | None = None,
                    pair_store: PairStore | None = None) -> HistoryBuilder:
    """Snapshots (and pair models) from the attempts of ``attempts`` before ``until``; the
    snapshot as of ``until`` itself (the night served) reads a pair model fit just before it
    (see :class:`~leap.features.pairs.PairSchedule`), and every earlier snapshot its share of
    the flat carry, or ``share`` where given (``until`` is then not the night served)."""
    past = submitted_in(attempts, None, until)
    prepared = _prepared_history(past, catalog, cache)
    return HistoryBuilder(prepared, lookback_days=cfg.lookback_days,
                          pairs=pair_schedule(past, catalog, until, cfg, cache, share,
                                              pair_store))


def pair_schedule(past: pd.DataFrame, catalog: Catalog, until: datetime, cfg: TrainConfig,
                  cache: EncodeCache | None = None, share: float | None = None,
                  store: PairStore | None = None) -> PairSchedule | None:
    """The pair models of the night served at ``until``, from ``past`` (the attempts before
    it), found in ``store`` where it kept them; ``None`` where ``cfg`` trains without them."""
    if not (cfg.pair_model and cfg.use_history):
        return None
    params = replace(cfg.pair_params or PairParams(), seed=cfg.seed, num_threads=cfg.threads)
    return PairSchedule(past, catalog, params,
                        cache.pairs if cache is not None else None, fresh_at=until,
                        share=share, store=store)


def window_spec(train_rows: pd.DataFrame, catalog: Catalog, cfg: TrainConfig,
                window_start: datetime, as_of: datetime) -> FeatureSpec:
    """The feature spec of a window's succeeded attempts (refusing a window too small)."""
    if len(train_rows) < 50:
        raise ModelError(f"only {len(train_rows)} succeeded attempts in the window "
                         f"{window_start:%Y-%m-%d}..{as_of:%Y-%m-%d}; need at least 50 "
                         "(check the as-of day and the window length)")
    spec = FeatureSpec.fit(train_rows, catalog)
    if not cfg.use_history:
        spec = replace(spec, names=tuple(n for n in FEATURE_NAMES if n not in HISTORY_FEATURES))
    return spec


@dataclass(frozen=True)
class CacheUse:
    """What one night's processes did with its :class:`NightCache`: every key asked for
    (what :meth:`NightCache.prune` keeps), and of them the days and pair models read from
    it or made and kept in it. Workers' uses are joined with ``|``."""

    asked: frozenset[str] = frozenset()
    days_read: frozenset[str] = frozenset()
    days_made: frozenset[str] = frozenset()
    pairs_read: frozenset[str] = frozenset()
    pairs_made: frozenset[str] = frozenset()

    def __or__(self, other: CacheUse) -> CacheUse:
        return CacheUse(**{f.name: getattr(self, f.name) | getattr(other, f.name)
                           for f in fields(self)})

    def counts(self) -> dict[str, int]:
        """How many days were read (made on an earlier night) or encoded, and pair models
        read or fit and kept (``leap train`` prints them; on Dask, an entry one worker made
        and another then read counts as made, once)."""
        return {"days_read": len(self.days_read - self.days_made),
                "days_encoded": len(self.days_made),
                "pair_models_read": len(self.pairs_read - self.pairs_made),
                "pair_models_fit": len(self.pairs_made)}


@dataclass
class DayBlocks:
    """Some days of a window, encoded: every feature (``X``), log throughput, the day (since
    the window start), whether the row is a masked copy, and its novelty group.

    ``X`` is NumPy, or on the Dask path rows kept on the workers
    (:class:`~leap.model.distributed.BlockRows`), which index alike.
    """

    X: Any
    y: np.ndarray
    day: np.ndarray
    masked: np.ndarray
    group: np.ndarray
    family: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    snapshot_s: float = 0.0
    features_s: float = 0.0
    #: What encoding these days did with the :class:`NightCache` (on the Dask path).
    cached: CacheUse = field(default_factory=CacheUse)


class DayStore:
    """Encoded training days kept on disk from one night to the next (``leap train`` keeps
    them in ``<home>/cache/days``; see :mod:`leap.cache`).

    A day's rows and masked rows depend only on the attempts from :func:`history_start` of
    that day to its end, the feature spec, the settings, the catalog and leap's code
    (:func:`encode_days`). Consecutive nights' windows share all but one day, so a night that
    finds them here encodes one day, not thirty. An entry is found by a digest of all of
    those, the attempts digested a day at a time (every column, in order), and holds the
    day's rows, its masked rows and their positions as ``.npy`` files (float32 rows, as the
    window's matrix; about 11 MB a day on the default fleet).
    """

    def __init__(self, directory: Path) -> None:
        self.disk = DiskCache(directory)

    def get(self, key: str) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None:
        """The rows and ``(masked rows, their positions)`` kept under ``key``, or ``None``."""
        return self.disk.read(key, _load_day)

    def put(self, key: str, X: np.ndarray, masked: tuple[np.ndarray, np.ndarray]) -> None:
        def save(folder: Path) -> None:
            for name, a in (("rows", X), ("masked", masked[0]), ("masked_rows", masked[1])):
                np.save(folder / f"{name}.npy", a, allow_pickle=False)
        self.disk.write(key, save)

    def prune(self) -> int:
        """Remove every day this night neither read nor encoded (:meth:`DiskCache.prune`):
        the next night reads the days of this window but its first, unless their attempts
        changed."""
        return self.disk.prune()


def _load_day(folder: Path) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    X, masked, where = (np.load(folder / f"{name}.npy", allow_pickle=False)
                        for name in ("rows", "masked", "masked_rows"))
    width = len(FEATURE_NAMES)
    if X.shape[1:] != (width,) or masked.shape != (len(where), width) or where.ndim != 1:
        raise ValueError(f"the day kept in {folder} has arrays of other shapes")
    return X, (masked, where)


@dataclass(frozen=True)
class NightCache:
    """What ``leap train`` keeps on disk for the next night (``<home>/cache``): the pair
    models (:class:`~leap.features.pairs.PairStore`) and the encoded days
    (:class:`DayStore`). The model is the same with or without them."""

    pairs: PairStore
    days: DayStore

    @classmethod
    def at(cls, directory: Path) -> NightCache:
        return cls(PairStore(directory / "pairs"), DayStore(directory / "days"))

    @property
    def directory(self) -> Path:
        """The folder :meth:`at` was given (for a worker's own :class:`NightCache`)."""
        return self.days.disk.directory.parent

    def used(self) -> CacheUse:
        """What this object asked for, read and made (a Dask worker's, sent back to the
        client)."""
        days, pairs = self.days.disk, self.pairs.disk
        return CacheUse(frozenset(days.used | pairs.used), frozenset(days.found),
                        frozenset(days.made), frozenset(pairs.found), frozenset(pairs.made))

    def keep(self, use: CacheUse) -> None:
        """Count what another process did with the cache this night as done here: its
        entries are kept by :meth:`prune` and counted by :meth:`used`. Keys are digests of
        their entries' inputs: a day's never names a pair model's entry, nor the reverse."""
        days, pairs = self.days.disk, self.pairs.disk
        for disk in (days, pairs):
            disk.used.update(use.asked)
        days.found.update(use.days_read)
        days.made.update(use.days_made)
        pairs.found.update(use.pairs_read)
        pairs.made.update(use.pairs_made)

    def prune(self) -> None:
        """Remove what this night neither read nor made (another window's training in
        between, an experiment on an older day, leaves the next night to make its own)."""
        self.pairs.prune()
        self.days.prune()


def _day_keys(attempts: pd.DataFrame, catalog: Catalog, starts: dict[int, datetime],
              cfg: TrainConfig, mask_key: str) -> dict[int, str]:
    """The :class:`DayStore` key of each day (``starts``: its first moment by number):
    the digests of the calendar days of ``attempts`` it reads (:func:`history_start` to its
    own end), with the encoding's settings (``mask_key``, ``cfg``), the catalog and leap's
    source."""
    if not starts:
        return {}
    at = pd.DatetimeIndex(attempts["submitted_at"])
    first = history_start(min(starts.values()), cfg)
    number = np.asarray((at - first) // timedelta(days=1), dtype=np.int64)
    rows = pd.util.hash_pandas_object(attempts, index=False).to_numpy()
    order = np.argsort(number, kind="stable")
    last = (max(starts.values()) - first).days  # the number of the latest day asked
    bounds = np.searchsorted(number[order], np.arange(last + 2))
    by_day = [digest([], rows[order[lo:hi]].tobytes()) for lo, hi in pairwise(bounds)]
    # Threads change the speed, never the rows: a Dask worker's day serves one machine's.
    fixed = [catalog.fingerprint(), mask_key, repr(replace(cfg, threads=1)), source_digest()]
    return {d: digest([*fixed, by_day[(history_start(t, cfg) - first).days:
                                      (t - first).days + 1]])
            for d, t in starts.items()}


def encode_days(attempts: pd.DataFrame, builder: HistoryBuilder, catalog: Catalog,
                window_start: datetime, days: Sequence[int], cfg: TrainConfig,
                spec: FeatureSpec, progress: Progress | None = None,
                cache: EncodeCache | None = None,
                day_store: DayStore | None = None) -> DayBlocks:
    """Encode the succeeded attempts of each day ``d`` in ``days`` (``window_start + d``)
    with history as of that day, and that day's masked rows (:func:`masked_rows`,
    ``cfg.mask_share`` of its pairs, drawn with the day's own seed).

    A day's rows depend only on the attempts before it, so any subset of days can be
    encoded apart (by a Dask worker, :mod:`leap.model.distributed`) with the same result,
    or read from ``day_store`` where an earlier night kept them.
    """
    full = FeatureSpec(names=FEATURE_NAMES, vocab=spec.vocab)
    # A cached day read the pair models at one night's share; another share re-encodes it.
    share = builder.pairs.night_share() if isinstance(builder.pairs, PairSchedule) else None
    spec_key = hashlib.sha256((full.to_json() + f"pairs={cfg.pair_model}-{share}").encode()
                              ).hexdigest()[:16]
    mask_key = f"{spec_key}-mask{cfg.mask_share:g}-{cfg.seed}"
    starts = {d: window_start + timedelta(days=d) for d in days}
    stored = _day_keys(attempts, catalog, starts, cfg, mask_key) if day_store is not None \
        else {}
    day_attempts = {d: submitted_in(attempts, t, t + timedelta(days=1)) for d, t in starts.items()}
    # The pair models of the days to encode (not those kept) are fit or read now, one after
    # the other, before the days' threads, which then find them in the schedule's cache.
    t0 = time.perf_counter()
    if builder.pairs is not None:
        for d, t in starts.items():
            if len(day_attempts[d]) and not (day_store is not None
                                             and day_store.disk.has(stored[d])):
                builder.pairs(t)
    pair_s = time.perf_counter() - t0
    # The matrix is filled day by day in place: reserved for every attempt of these days and
    # one masked copy of each (pages never written cost no memory), so no day is held twice.
    X = np.empty((2 * sum(len(a) for a in day_attempts.values()), len(FEATURE_NAMES)),
                 dtype=TRAIN_DTYPE)

    def encode_day(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                    tuple[np.ndarray, np.ndarray], float, float]:
        """Day ``d``'s log throughputs, family codes, rows and masked rows, and the seconds
        its snapshots and its encoding took."""
        start = starts[d]
        rows = succeeded_attempts(day_attempts[d], catalog)
        y = np.log(rows["throughput"].to_numpy(dtype=np.float64))
        fam = family_codes(rows["family_id"])
        if len(rows) == 0:
            none = np.empty((0, len(FEATURE_NAMES)), dtype=TRAIN_DTYPE)
            return y, fam, none, (none, np.empty(0, dtype=np.int64)), 0.0, 0.0
        kept = day_store.get(stored[d]) if day_store is not None else None
        if kept is not None and len(kept[0]) == len(rows):
            return y, fam, kept[0], kept[1], 0.0, 0.0
        snap_s = enc_s = 0.0
        key = (start.date().isoformat(), spec_key)
        hit = cache.blocks.get(key) if cache is not None else None
        if hit is None or len(hit) != len(rows):
            t1 = time.perf_counter()
            snap = builder.snapshot(start)
            t2 = time.perf_counter()
            hit = encode(rows, snap, catalog, full, dtype=TRAIN_DTYPE)
            snap_s += t2 - t1
            enc_s += time.perf_counter() - t2
            if cache is not None:
                cache.blocks[key] = hit
        mkey = (start.date().isoformat(), mask_key)
        mhit = cache.masked.get(mkey) if cache is not None else None
        if mhit is None or (len(mhit[1]) and mhit[1].max() >= len(rows)):
            t1 = time.perf_counter()
            # Seeded by the day itself, so every window that holds this day (and a cache
            # shared by consecutive nights) masks the same pairs.
            rng = np.random.default_rng([cfg.seed, start.toordinal()])
            mX, mrows = masked_rows(rows, hit, builder, start, catalog, spec, rng,
                                    share=cfg.mask_share)
            mhit = (mX.astype(TRAIN_DTYPE), mrows)
            snap_s += time.perf_counter() - t1
            if cache is not None:
                cache.masked[mkey] = mhit
        if day_store is not None:
            day_store.put(stored[d], hit, mhit)
        return y, fam, hit, mhit, snap_s, enc_s

    filled = 0
    ys: list[np.ndarray] = []
    fams: list[np.ndarray] = []
    day_of: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    snap_s = enc_s = 0.0
    t0 = time.perf_counter()
    # Days are encoded ``cfg.threads`` at a time (the same rows as one by one: a day reads
    # only the builder, and each masks with its own seed), each copied into the matrix in
    # day order as soon as it is ready.
    encoded = map_in_order(encode_day, days, cfg.threads)
    for i, (d, (y, fam, hit, mhit, day_snap_s, day_enc_s)) in enumerate(
            zip(days, encoded, strict=True)):
        if progress:
            progress("features", i + 1, len(days) + 1)
        snap_s += day_snap_s
        enc_s += day_enc_s
        if len(y) == 0:
            continue
        for block in (hit, mhit[0]):
            X[filled:filled + len(block)] = block
            filled += len(block)
        ys += [y, y[mhit[1]]]
        fams += [fam, fam[mhit[1]]]
        day_of += [np.full(len(y), d), np.full(len(mhit[1]), d)]
        masks += [np.zeros(len(y), dtype=bool), np.ones(len(mhit[1]), dtype=bool)]
        release_free_memory()  # what the day's snapshots left in the threads' heaps
    # Days side by side: their seconds, summed, are shared out over the loop's wall time.
    busy = snap_s + enc_s
    if busy > 0:
        wall = time.perf_counter() - t0
        snap_s, enc_s = wall * snap_s / busy, wall * enc_s / busy
    snap_s += pair_s
    X = X[:filled]
    return DayBlocks(X=X, y=np.concatenate(ys) if ys else np.empty(0),
                     day=np.concatenate(day_of) if day_of else np.empty(0, dtype=np.int64),
                     masked=np.concatenate(masks) if masks else np.empty(0, dtype=bool),
                     group=novelty(X, FEATURE_NAMES),
                     family=np.concatenate(fams) if fams else np.empty(0, dtype=np.uint64),
                     snapshot_s=snap_s, features_s=enc_s)


def family_codes(family: pd.Series) -> np.ndarray:
    """A 64-bit code per row of its family (equal names, equal codes), for grouping rows by
    family without carrying the text."""
    return pd.util.hash_pandas_object(family.astype(str), index=False).to_numpy()


@dataclass
class HeldOut:
    """The serving snapshot as of the held-out day and that day's rows encoded against it
    (every feature), plainly and each with its own (family, type) history masked; and the
    validation days' rows on a few types encoded as if nobody had run on those types
    (:func:`new_type_rows`), on a few model types as if nobody had run those
    (:func:`new_model_type_rows`), and at trainer counts hidden from their (family, type)
    pairs (:func:`new_trainer_count_rows`)."""

    snapshot: Snapshot
    jobs: pd.DataFrame
    X: np.ndarray
    masked_X: np.ndarray
    masked_rows: np.ndarray
    snapshot_s: float = 0.0
    features_s: float = 0.0
    new_type_X: np.ndarray = field(default_factory=lambda: np.empty((0, len(FEATURE_NAMES))))
    new_type_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    new_model_type_X: np.ndarray = field(
        default_factory=lambda: np.empty((0, len(FEATURE_NAMES))))
    new_model_type_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    new_trainer_count_X: np.ndarray = field(
        default_factory=lambda: np.empty((0, len(FEATURE_NAMES))))
    new_trainer_count_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    #: What building it did with the :class:`NightCache` (on the Dask path).
    cached: CacheUse = field(default_factory=CacheUse)


def held_out_day(attempts: pd.DataFrame, builder: HistoryBuilder, catalog: Catalog,
                 as_of: datetime, cfg: TrainConfig, spec: FeatureSpec) -> HeldOut:
    full = FeatureSpec(names=FEATURE_NAMES, vocab=spec.vocab)
    t1 = time.perf_counter()
    serving = builder.snapshot(as_of)
    snap_s = time.perf_counter() - t1
    jobs = succeeded_attempts(submitted_in(attempts, as_of, as_of + timedelta(days=1)),
                              catalog)
    t2 = time.perf_counter()
    X = encode(jobs, serving, catalog, full)
    enc_s = time.perf_counter() - t2
    t1 = time.perf_counter()
    # Four independent sets of rows, each from snapshots with something hidden: run
    # ``cfg.threads`` at a time, the longest first (the same rows as one after the other;
    # on the default fleet 21-23 s of the night on one core otherwise).
    (new_mt_X, new_mt_y), (masked_X, rows), (new_X, new_y), (new_tc_X, new_tc_y) = run_each([
        lambda _: new_model_type_rows(attempts, builder, catalog, as_of, cfg, spec),
        lambda _: masked_rows(jobs, X, builder, as_of, catalog, spec,
                              np.random.default_rng(cfg.seed), folds=EVAL_MASK_FOLDS),
        lambda _: new_type_rows(attempts, builder, catalog, as_of, cfg, spec),
        lambda _: new_trainer_count_rows(attempts, builder, catalog, as_of, cfg, spec),
    ], cfg.threads)
    snap_s += time.perf_counter() - t1
    return HeldOut(serving, jobs, X, masked_X, rows, snap_s, enc_s, new_X, new_y, new_mt_X,
                   new_mt_y, new_tc_X, new_tc_y)


def new_type_rows(attempts: pd.DataFrame, builder: HistoryBuilder, catalog: Catalog,
                  as_of: datetime, cfg: TrainConfig, spec: FeatureSpec
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the window's validation days (the last ``cfg.validation_days`` before
    ``as_of``) on some of each day's types, taken in an order drawn with the day's seed
    until there are :data:`NEW_TYPE_FOLDS` types and :data:`NEW_TYPE_MIN_ROWS` rows (or no
    more types), each type's rows encoded against that day's snapshot without any attempt on it
    (:meth:`HistoryBuilder.snapshot` with ``exclude_hardware``): what serving sees on a type
    nobody ran on in the window. Returns the rows (every feature) and their log throughputs.

    The model and the pair model were fit on the window with those types in it, so these
    rows are easier than a truly new type; the masked (family, type) rows that calibrate the
    unobserved-pair groups are easier still (the type itself is known to the snapshot).
    """
    return _hidden_rows(attempts, catalog, as_of, cfg, spec, "hardware", (),
                        lambda day, hw: builder.snapshot(day, exclude_hardware=[hw]),
                        NEW_TYPE_FOLDS)


def new_model_type_rows(attempts: pd.DataFrame, builder: HistoryBuilder, catalog: Catalog,
                        as_of: datetime, cfg: TrainConfig, spec: FeatureSpec
                        ) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`new_type_rows`, for :data:`NEW_MODEL_TYPE_FOLDS` model types or more: each
    drawn model type's rows of a validation day encoded against that day's snapshot without
    any attempt of its families (``exclude_families``), so neither they nor the model type
    have history: what serving sees for a job of a model type nobody ran in the window.
    Those rows are new families, but a day's natural new families (and the families masked
    whole) still have their model type's history to go by; a new model type has none, and
    the trees never trained on such a row. The caveat of :func:`new_type_rows` holds: the
    model was fit with these model types in the window.
    """
    start = as_of - timedelta(days=cfg.validation_days + builder.lookback_days)
    window = submitted_in(attempts, start, as_of)
    # Distinct pairs first: the window's own columns are millions of rows on a large fleet.
    families = window[["model_type", "family_id"]].drop_duplicates().dropna().astype(str)
    of_type = families.groupby("model_type")["family_id"].agg(list).to_dict()
    return _hidden_rows(attempts, catalog, as_of, cfg, spec, "model_type", (1,),
                        lambda day, mt: builder.snapshot(day,
                                                         exclude_families=of_type.get(mt, [])),
                        NEW_MODEL_TYPE_FOLDS)


def new_trainer_count_rows(attempts: pd.DataFrame, builder: HistoryBuilder, catalog: Catalog,
                           as_of: datetime, cfg: TrainConfig, spec: FeatureSpec
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the window's validation days at a trainer count hidden from their (family,
    type) pair. Each day's (family, type, trainer count) runs are dealt, in an order drawn
    with the day's seed, into up to :data:`NEW_TRAINER_COUNT_FOLDS` folds, one run of a pair
    a fold and at most :data:`NEW_TRAINER_COUNT_PAIRS` runs a fold; each fold's runs, and every
    larger trainer count of their pairs, are removed from the day's snapshot
    (:meth:`HistoryBuilder.snapshot` with ``exclude_trainer_counts_from``) and their rows
    encoded against it. Only rows whose family still ran on the type at a smaller trainer
    count are kept (:func:`new_trainer_count`): a job scaled out beyond anything its family
    ran there, the usual way a trainer count is new to its pair, and what Sia's public
    multi-device rows ask. Hiding the run alone left mostly counts between two the pair ran,
    easier: on Sia's multi-device scaling (each type's multi-device rows held out) its
    intervals covered 43% of those rows, against 57% so (session 45). Returns the rows (every
    feature) and their log throughputs.

    As for :func:`new_type_rows`, the model was fit on the window with those runs in it.
    """
    full = FeatureSpec(names=FEATURE_NAMES, vocab=spec.vocab)
    blocks, ys = [], []
    key = ["family_id", "hardware", "trainer_count"]
    for start, rows in _validation_days(attempts, catalog, as_of, cfg):
        rows = rows[rows["family_id"].notna() & rows["trainer_count"].notna()]
        runs = rows[key].drop_duplicates()
        rng = np.random.default_rng([cfg.seed, start.toordinal(), NEW_TYPE_FOLDS, 2])
        runs = runs.iloc[rng.permutation(len(runs))]
        fold = runs.groupby(["family_id", "hardware"], sort=False, observed=True).cumcount()
        for k in range(NEW_TRAINER_COUNT_FOLDS):
            hide = runs[fold.to_numpy() == k].iloc[:NEW_TRAINER_COUNT_PAIRS]
            if hide.empty:
                break
            sub = rows.merge(hide, on=key)
            X = encode(sub, builder.snapshot(start, exclude_trainer_counts_from=hide), catalog,
                       full)
            keep = new_trainer_count(X, FEATURE_NAMES)
            blocks.append(X[keep])
            ys.append(np.log(sub["throughput"].to_numpy(dtype=np.float64)[keep]))
    return _stacked(blocks, ys)


def _validation_days(attempts: pd.DataFrame, catalog: Catalog, as_of: datetime,
                     cfg: TrainConfig) -> Iterator[tuple[datetime, pd.DataFrame]]:
    """Each validation day's start and its succeeded attempts, oldest first."""
    for back in range(cfg.validation_days, 0, -1):
        start = as_of - timedelta(days=back)
        yield start, succeeded_attempts(submitted_in(attempts, start,
                                                     start + timedelta(days=1)), catalog)


def _stacked(blocks: list[np.ndarray], ys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Encoded blocks and their log throughputs as one matrix and one vector."""
    if not blocks:
        return np.empty((0, len(FEATURE_NAMES))), np.empty(0)
    return np.vstack(blocks), np.concatenate(ys)


def _hidden_rows(attempts: pd.DataFrame, catalog: Catalog, as_of: datetime, cfg: TrainConfig,
                 spec: FeatureSpec, column: str, salt: tuple[int, ...],
                 snapshot: Callable[[datetime, str], Snapshot], folds: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The validation days' rows of ``folds`` or more values of ``column`` (each value
    hidden in turn by ``snapshot(day, value)``; the draw seeded by the day and ``salt``),
    encoded, and their log throughputs (:func:`new_type_rows`)."""
    full = FeatureSpec(names=FEATURE_NAMES, vocab=spec.vocab)
    blocks, ys = [], []
    for start, rows in _validation_days(attempts, catalog, as_of, cfg):
        known = rows[column].notna().to_numpy(dtype=bool)
        rows = rows[known]
        on = rows[column].astype(str).to_numpy()
        values = np.array(sorted(set(on)), dtype=object)
        rng = np.random.default_rng([cfg.seed, start.toordinal(), NEW_TYPE_FOLDS, *salt])
        taken = 0
        for i, value in enumerate(rng.permutation(values)):
            if i >= folds and taken >= NEW_TYPE_MIN_ROWS:
                break
            sub = rows[on == value]
            blocks.append(encode(sub, snapshot(start, value), catalog, full))
            ys.append(np.log(sub["throughput"].to_numpy(dtype=np.float64)))
            taken += len(sub)
    return _stacked(blocks, ys)


def training_set(blocks: DayBlocks, held: HeldOut, spec: FeatureSpec,
                 timings: dict[str, float]) -> TrainingSet:
    """A :class:`TrainingSet` of a window's encoded days (``blocks.X`` may be a dask array,
    see :mod:`leap.model.distributed`) and its held-out day."""
    model_X = spec.from_full
    return TrainingSet(
        X=model_X(blocks.X), y=blocks.y, day=blocks.day,
        spec=spec, fallback_log_tp=float(np.median(blocks.y[~blocks.masked])),
        serving_snapshot=held.snapshot, eval_jobs=held.jobs, eval_X=model_X(held.X),
        group=blocks.group, masked=blocks.masked, eval_group=novelty(held.X, FEATURE_NAMES),
        eval_masked_X=model_X(held.masked_X), eval_masked_rows=held.masked_rows,
        eval_masked_group=novelty(held.masked_X, FEATURE_NAMES),
        new_type_X=model_X(held.new_type_X), new_type_y=held.new_type_y,
        new_model_type_X=model_X(held.new_model_type_X), new_model_type_y=held.new_model_type_y,
        new_trainer_count_X=model_X(held.new_trainer_count_X),
        new_trainer_count_y=held.new_trainer_count_y,
        family=blocks.family, timings=timings)


def build_training_set(attempts: pd.DataFrame, catalog: Catalog, as_of: datetime,
                       cfg: TrainConfig, progress: Progress | None = None,
                       cache: EncodeCache | None = None,
                       disk_cache: NightCache | None = None) -> TrainingSet:
    """Encode the window's succeeded attempts, each with history as of its own day.

    Each day also contributes masked rows (:func:`masked_rows`, ``cfg.mask_share`` of its
    pairs). Consecutive nightly windows share most of this work: pass the same ``cache`` to
    reuse each day's encoded blocks and prepared history instead of rebuilding them, or (from
    one process to the next) a ``disk_cache`` to reuse the pair models fit and the days
    encoded from the same attempts.
    """
    window_start = as_of - timedelta(days=cfg.window_days)
    t0 = time.perf_counter()
    builder = history_builder(attempts, catalog, as_of, cfg, cache,
                              pair_store=disk_cache.pairs if disk_cache is not None else None)
    timings = {"history_prepare_s": time.perf_counter() - t0}
    # The pair models the held-out day reads (the served night's fresh fit and the
    # validation days' refit) are fit now, before the window's matrix is built, and
    # :func:`encode_days` fits those of the days it encodes before it fills the matrix: a
    # fit's working memory (0.7 GiB on a fleet four times the default) then never adds to
    # the matrix at the night's peak. Days read from ``disk_cache`` need no pair model.
    t0 = time.perf_counter()
    if builder.pairs is not None:
        for back in range(cfg.validation_days + 1):
            builder.pairs(as_of - timedelta(days=back))
    pair_s = time.perf_counter() - t0
    spec = window_spec(succeeded_attempts(submitted_in(attempts, window_start, as_of), catalog),
                       catalog, cfg, window_start, as_of)
    blocks = encode_days(attempts, builder, catalog, window_start, range(cfg.window_days), cfg,
                         spec, progress, cache,
                         disk_cache.days if disk_cache is not None else None)
    held = held_out_day(attempts, builder, catalog, as_of, cfg, spec)
    builder.close()
    release_free_memory()  # the builder's sorted rows, before the fit's peak
    if progress:
        progress("features", cfg.window_days + 1, cfg.window_days + 1)
    timings["snapshot_s"] = blocks.snapshot_s + held.snapshot_s + pair_s
    timings["features_s"] = blocks.features_s + held.features_s
    return training_set(blocks, held, spec, timings)

