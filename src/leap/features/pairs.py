"""The pair model: how one job's throughput on type B compares with its throughput on type A,
and how a family's new shape on a type compares with the shapes it ran there.

That ratio depends on the job's shape as much as on the two spec sheets: a compute-bound job
gets a faster device's FLOP/s, a memory-bound one its bandwidth, a small batch per device
leaves a big device idle, an input-bound job gets nothing. A table of per-model-type medians
(:mod:`leap.features.transfer`) cannot see the shape; a small LightGBM regressor can. It is
trained on the window's configurations that ran on two types: groups of one family, one shape
(trainers, devices per trainer, batch, precision, parallel layout) and one type, median log
throughput each, paired within the group. Its target is ``r(B) - r(A)``, the log ratio
beyond the physics estimate's ratio, so with no evidence it falls back to physics; its
features are the job's shape, its physics estimates on both types and their spec ratios,
never the type names, so a type it never saw in a pair is read through its specs.

Its second part, the shape boosters, learn the other direction of a configuration pair: one
family on one type, two shapes (trainers, devices per trainer, batch: the shape of history's
keys), target ``r(B) - r(A)`` again, features both shapes, their physics estimates, the
type's specs and the job's public columns. A family that changes its trainers or batch on a
type it knows is then carried from the shapes it ran there (``xfer_s_r`` in
:mod:`leap.features.transfer`), not from the family's median over every shape: on the
default fleet's held-out day leap's accuracy on such attempts went from 61% within ±20% to
74% (see the closing note of issue 10).

Cross-fitting: families fall in :data:`FOLDS` halves by a hash of their id, each half's rows
are predicted by the booster trained on the other half only, in training and in serving
alike. A row therefore never sees a ratio learned from its own family: a training row whose
(family, type) history is masked cannot read that pair back through the pair model.

Point in time: pair models are refit every :data:`REFIT_DAYS` days (days aligned to the
epoch), each on the :data:`PAIR_DAYS` days before its refit day. A snapshot as of ``t``
reads the model of the last refit day at or before ``t`` (:class:`PairSchedule`), so a
training row, like a served job, only reads ratios learned before its own day, and
consecutive nights share their models. The snapshot a night serves (and its held-out day) is
the exception: its pair model is fit on the :data:`PAIR_DAYS` days just before it, so what
ran since the last refit (a new type's first days, trial jobs) teaches the ratios at once
rather than up to a week later. One setting is the night's, not its day's: the share of the
flat carry (:attr:`PairModel.neighbour_share`) every snapshot of a night's window reads is
the one its served pair model judged (:meth:`PairSchedule.night_share`), so the trees learn
on the blend they serve; like the trees' own split points, it is chosen on the whole window.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from functools import partial
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd

from leap.cache import DiskCache, digest, source_digest
from leap.catalog import Catalog
from leap.data.schema import PRECISIONS
from leap.data.usage import usable_mask
from leap.errors import ArtifactError
from leap.features.columns import Columns
from leap.features.pair_rows import (
    CATEGORICAL,
    FOLDS,
    JOB_FEATURE_COLUMNS,
    PAIR_FEATURES,
    SHAPE_CATEGORICAL,
    SHAPE_COLUMNS,
    SHAPE_FEATURES,
    family_fold,
    job_folds,
    pair_matrix,
    pair_training_rows,
    row_mean,
    row_median,
    shape_matrix,
    shape_parts,
    shape_training_rows,
)
from leap.metrics import within_log
from leap.threads import run_each

#: Days between refits of the pair model (see the module docstring).
REFIT_DAYS = 7
#: Days of history before its refit day that a pair model learns from.
PAIR_DAYS = 14
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The attempt columns :meth:`PairModel.fit` reads (any others are ignored).
FIT_COLUMNS = (*JOB_FEATURE_COLUMNS, "hardware", "throughput")


@dataclass(frozen=True)
class PairParams:
    """LightGBM settings of the pair boosters: a few settings each measured on the default
    and the harder fleet's held-out days (the figures beside them), not searched. A correction
    to the physics ratio between types needs few, shallow-ish trees; the shape boosters grow
    with the shape pairs they learn from (see the closing notes of issue 10)."""

    rounds: int = 200
    #: The shape boosters' rounds and leaves. Trained on each shape's nearest few others
    #: (:data:`~leap.features.pair_rows.SHAPE_PAIR_NEAREST`), 100 rounds of 63 leaves
    #: underfit: their estimate on new shapes landed within +-20% of the simulator's truth
    #: for 82.2% (default fleet, 898 held-out attempts) and 82.5% (the harder fleet, 15,205)
    #: of the rows, 300 rounds of 127 leaves 85.0% and 87.1% (600 rounds: 85.0% on the
    #: default fleet; 500 rounds: 87.5% on the harder fleet; 255 leaves: 86.2% on the
    #: default fleet).
    shape_rounds: int = 300
    shape_num_leaves: int = 127
    #: Rounds and leaves of the shape boosters once they learn from at least
    #: ``large_shape_pairs`` pairs: a fleet whose jobs are retuned often has many more shapes
    #: to learn from, and more of the boosters then pays. On the harder fleet (2.7 million
    #: pairs, all of them used) 600 rounds of 255 leaves took its held-out day from 76.4% to
    #: 77.3% within +-20% (new shapes 79.2 -> 80.4%; seed 2's harder fleet, the check out of
    #: sample, 78.9 -> 80.3% with every change of this version); on the default fleet
    #: (158,000 pairs) the same setting cost 3.9 points on the day's attempts with their own
    #: type's history masked (65.8 -> 61.9%), so below the threshold the boosters stay as
    #: they were.
    large_shape_pairs: int = 1_000_000
    large_shape_rounds: int = 600
    large_shape_num_leaves: int = 255
    num_leaves: int = 63
    learning_rate: float = 0.1
    min_data_in_leaf: int = 20
    max_bin: int = 63
    num_threads: int = 2
    seed: int = 0

    def lgb_params(self) -> dict[str, object]:
        # Huber: a pair of two noisy medians is sometimes far off; the loss caps its pull.
        return {"objective": "huber", "alpha": 0.3, "num_leaves": self.num_leaves,
                "learning_rate": self.learning_rate, "min_data_in_leaf": self.min_data_in_leaf,
                "feature_fraction": 0.9, "max_bin": self.max_bin,
                "num_threads": self.num_threads, "seed": self.seed, "deterministic": True,
                "force_row_wise": True, "verbosity": -1}


class PairModel:
    """One booster per family half, each trained on the other halves; :meth:`predict` gives
    ``r(B) - r(A)`` per row.

    Examples
    --------
    >>> PairModel.fit(pd.DataFrame(columns=["family_id", "hardware", "throughput"]),
    ...               Catalog.default()) is None
    True
    """

    def __init__(self, boosters: list[lgb.Booster], vocab: dict[str, list[str]],
                 shape_boosters: list[lgb.Booster] | None = None,
                 shape_reach: np.ndarray | None = None, neighbour_share: float = 0.0) -> None:
        shape_boosters = shape_boosters or []
        if len(boosters) != FOLDS or len(shape_boosters) not in (0, FOLDS):
            raise ArtifactError(f"the pair model needs {FOLDS} pair boosters and 0 or {FOLDS} "
                                f"shape boosters, got {len(boosters)} and {len(shape_boosters)}")
        if shape_boosters and (shape_reach is None or np.shape(shape_reach) != (3,)):
            raise ArtifactError("the pair model's shape boosters need their reach (3 moves)")
        self.boosters = boosters
        self.shape_boosters = shape_boosters
        #: The longest move of the shape boosters' training pairs in each direction of
        #: :func:`~leap.features.pair_rows.shape_parts` (log trainers, devices per trainer,
        #: batch per device): a tree cannot tell a longer move, or one along a direction
        #: no family moved in, from the longest it saw, so serving carries no further
        #: (:func:`~leap.features.pair_rows.within_reach`). On the public Lambda table no
        #: family changes its batch per device on a type; carrying its level on the older
        #: types to the newest ones' larger batches anyway took leap's estimate there from
        #: 59.0% within +-20% to 48.6%.
        self.shape_reach = np.full(3, np.inf) if shape_reach is None else \
            np.asarray(shape_reach, dtype=np.float64)
        #: Weight of the flat carry in a shape's level read from its family's nearest other
        #: shapes on the type (:meth:`TransferIndex._shape_carry
        #: <leap.features.transfer.TransferIndex._shape_carry>`): their throughput per
        #: device at the job's devices, against the shape boosters' carry. Judged at fit
        #: on the boosters' own out-of-fold carries (:func:`_neighbour_share`).
        self.neighbour_share = float(neighbour_share)
        self.vocab = vocab
        self._texts: list[str] | None = None
        #: Compiled scorers by booster name (:meth:`named_boosters`), set and checked by
        #: :mod:`leap.model.compiled`; empty: LightGBM scores. Replaced whole, never mutated.
        self.scorers_: dict[str, Callable[[np.ndarray], np.ndarray]] = {}

    def with_share(self, share: float) -> PairModel:
        """This model (the same boosters and compiled scorers) reading the flat carry at
        ``share``."""
        out = copy.copy(self)
        out.neighbour_share = float(share)
        return out

    def named_boosters(self) -> dict[str, lgb.Booster]:
        """Every booster by name (its file name in the snapshot, without ``.txt``)."""
        return {**{f"pairs_{k}": b for k, b in enumerate(self.boosters)},
                **{f"shapes_{k}": b for k, b in enumerate(self.shape_boosters)}}

    @classmethod
    def fit(cls, attempts: pd.DataFrame, catalog: Catalog,
            params: PairParams | None = None) -> PairModel | None:
        """Train on ``attempts`` (succeeded, positive throughput; only :data:`FIT_COLUMNS`
        are read); ``None`` when a half of
        the families has fewer than 50 pairs to learn from (the transfer tables alone serve).
        The shape boosters are left out where a half has fewer than 50 shape pairs.
        """
        p = params or PairParams()
        if attempts.empty:
            return None
        jobs, hw_a, hw_b, tw = pair_training_rows(attempts, catalog, seed=p.seed)
        # Distinct categories first: a Python pass over every row cost 0.3 s a fit.
        categories = pd.unique(attempts.get("model_category", pd.Series([], dtype=object)))
        vocab = {"vendor": sorted({catalog[n].vendor for n in catalog}),
                 "precision": list(PRECISIONS),
                 "model_category": sorted({str(c) for c in categories if isinstance(c, str)})}
        X = pair_matrix(Columns.from_frame(jobs), hw_a, hw_b, catalog, vocab)
        boosters = _fit_halves(X, tw, jobs["family_id"].to_numpy(), PAIR_FEATURES, CATEGORICAL,
                               p, p.rounds)
        if boosters is None:
            return None
        s_jobs, a_shape, s_tw = shape_training_rows(attempts, catalog, seed=p.seed)
        large = len(s_tw) >= p.large_shape_pairs
        X_shapes = shape_matrix(Columns.from_frame(s_jobs), a_shape, catalog, vocab)
        shapes = _fit_halves(X_shapes, s_tw, s_jobs["family_id"].to_numpy(), SHAPE_FEATURES,
                             SHAPE_CATEGORICAL, replace(p, num_leaves=p.large_shape_num_leaves
                                                        if large else p.shape_num_leaves),
                             p.large_shape_rounds if large else p.shape_rounds)
        if shapes is None:
            return cls(boosters, vocab)
        moves = np.abs(shape_parts(s_jobs[list(SHAPE_COLUMNS)].to_numpy(dtype=np.float64))
                       - shape_parts(a_shape))[np.isfinite(s_tw[:, 0])]
        share = _neighbour_share(shapes, X_shapes, s_tw, s_jobs["family_id"].to_numpy(),
                                 p.seed)
        return cls(boosters, vocab, shapes, moves.max(axis=0), share)

    def predict(self, jobs: Columns, hw_a: np.ndarray, hw_b: np.ndarray,
                catalog: Catalog, job: np.ndarray | None = None) -> np.ndarray:
        """``r(B) - r(A)`` of each job from ``hw_a`` to ``hw_b`` (row ``i`` is job ``job[i]``
        of ``jobs``, default row ``i``), by the booster of the other half of the families
        (see the module docstring)."""
        if len(hw_a) == 0:
            return np.zeros(0)
        job = np.arange(len(hw_a)) if job is None else np.asarray(job, dtype=np.int64)
        return _by_halves(self._scorers("pairs", self.boosters),
                          pair_matrix(jobs, hw_a, hw_b, catalog, self.vocab, job),
                          job_folds(jobs, job))

    def predict_shapes(self, jobs: Columns, a_shape: np.ndarray, catalog: Catalog,
                       job: np.ndarray | None = None) -> np.ndarray:
        """``r(B) - r(A)`` of each job from shape ``a_shape[i]`` to its own shape on its own
        type (row ``i`` is job ``job[i]``), cross-fitted like :meth:`predict`; NaN without
        shape boosters."""
        if not self.shape_boosters or len(a_shape) == 0:
            return np.full(len(a_shape), np.nan)
        job = np.arange(len(a_shape)) if job is None else np.asarray(job, dtype=np.int64)
        return _by_halves(self._scorers("shapes", self.shape_boosters),
                          shape_matrix(jobs, a_shape, catalog, self.vocab, job),
                          job_folds(jobs, job))

    def _scorers(self, kind: str, boosters: list[lgb.Booster]
                 ) -> list[Callable[[np.ndarray], np.ndarray]]:
        """How each of ``boosters`` (named ``<kind>_<k>``) scores: compiled, else LightGBM."""
        scorers = self.scorers_
        return [scorers.get(f"{kind}_{k}") or partial(_lgb_predict, b)
                for k, b in enumerate(boosters)]

    # Persistence (inside the snapshot of a model artifact) ----------------------------
    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [b.model_to_string() for b in (*self.boosters, *self.shape_boosters)]
        return self._texts

    def fingerprint(self) -> str:
        h = hashlib.sha256(json.dumps([self.vocab, self.shape_reach.tolist(),
                                       self.neighbour_share], sort_keys=True).encode())
        for t in self.texts():
            h.update(t.encode())
        return h.hexdigest()[:16]

    def save(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, text in zip(self.named_boosters(), self.texts(), strict=True):
            path = directory / f"{name}.txt"
            path.write_text(text)
            paths.append(path)
        meta = directory / "pairs.json"
        meta.write_text(json.dumps({"features": list(PAIR_FEATURES), "vocab": self.vocab,
                                    "shape_features": list(SHAPE_FEATURES),
                                    "shape_boosters": len(self.shape_boosters),
                                    # None without shape boosters (no Infinity in JSON).
                                    "shape_reach": self.shape_reach.tolist()
                                    if self.shape_boosters else None,
                                    "neighbour_share": self.neighbour_share}))
        return [*paths, meta]

    @classmethod
    def load(cls, directory: Path) -> PairModel | None:
        """The pair model saved in ``directory``, or ``None`` when it holds none."""
        meta = directory / "pairs.json"
        if not meta.exists():
            return None
        try:
            info = json.loads(meta.read_text())
            if tuple(info["features"]) != PAIR_FEATURES or \
                    tuple(info["shape_features"]) != SHAPE_FEATURES:
                raise ArtifactError(f"the pair model in {directory} was trained on other "
                                    "features; retrain with this leap version")
            boosters, shapes = ([lgb.Booster(model_str=(directory / f"{kind}_{k}.txt")
                                             .read_text()) for k in range(count)]
                                for kind, count in (("pairs", FOLDS),
                                                    ("shapes", int(info["shape_boosters"]))))
            reach = info.get("shape_reach")
            return cls(boosters, {k: list(v) for k, v in info["vocab"].items()}, shapes,
                       None if reach is None else np.asarray(reach, dtype=np.float64),
                       float(info.get("neighbour_share", 0.0)))
        except (OSError, ValueError, KeyError, TypeError, lgb.basic.LightGBMError) as exc:
            raise ArtifactError(f"the pair model in {directory} is unreadable: {exc}") from None


def _fit_halves(X: np.ndarray, tw: np.ndarray, family_id: np.ndarray, names: tuple[str, ...],
                categorical: tuple[str, ...], p: PairParams, rounds: int
                ) -> list[lgb.Booster] | None:
    """One booster per family half, each on the other halves' rows with a finite target;
    ``None`` when a half has fewer than 50 rows to learn from."""
    ok = np.isfinite(tw[:, 0])
    fold = family_fold(family_id) if len(family_id) else np.empty(0, np.int64)
    trains = [ok & (fold != k) for k in range(FOLDS)]
    if any(train.sum() < 50 for train in trains):
        return None

    def fit(train: np.ndarray, threads: int) -> lgb.Booster:
        data = lgb.Dataset(X[train], label=tw[train, 0], weight=tw[train, 1],
                           feature_name=list(names), categorical_feature=list(categorical),
                           params={"max_bin": p.max_bin, "verbosity": -1})
        return lgb.train(replace(p, num_threads=threads).lgb_params(), data,
                         num_boost_round=rounds).free_dataset()
    # The halves grow side by side, on a thread each (the same trees as one by one).
    return run_each([partial(fit, train) for train in trains], p.num_threads)


#: Shares of the flat carry :func:`_neighbour_share` tries.
NEIGHBOUR_SHARES = (0.0, 0.25, 0.5)
#: Shapes (carried from their nearest others) it judges on at most: a seeded sample beyond.
NEIGHBOUR_MAX_CELLS = 20_000


def _neighbour_share(boosters: list[lgb.Booster], X: np.ndarray, tw: np.ndarray,
                     family_id: np.ndarray, seed: int) -> float:
    """The share of :data:`NEIGHBOUR_SHARES` whose blend lands the most of the window's
    shapes within +-20% (ties: the smaller share), each shape read as serving reads a new one
    from the family's nearest other shapes on the type (rows of one group in ``tw``, see
    :func:`~leap.features.pair_rows.shape_training_rows`): the median of their residuals
    carried by the boosters of the other family half, against the mean of their throughput
    per device at the shape's devices (in residual terms the move ``-d_log_phys_sps +
    d_log_trainers + d_log_devices_per_trainer``)."""
    ok = np.isfinite(tw[:, 0])
    group = tw[:, 3].astype(np.int64)
    cells = np.unique(group[ok])
    if len(cells) > NEIGHBOUR_MAX_CELLS:
        cells = np.sort(np.random.default_rng(seed).choice(cells, NEIGHBOUR_MAX_CELLS,
                                                           replace=False))
    rows = np.flatnonzero(ok & np.isin(group, cells))
    if len(rows) == 0:
        return 0.0
    col = {n: i for i, n in enumerate(SHAPE_FEATURES)}
    Xr = X[rows]
    carried = _by_halves([partial(_lgb_predict, b) for b in boosters], Xr,
                         family_fold(family_id[rows]))
    flat = (Xr[:, col["d_log_trainers"]] + Xr[:, col["d_log_devices_per_trainer"]]
            - Xr[:, col["d_log_phys_sps"]])
    r_b = tw[rows, 2]
    r_a = r_b - tw[rows, 0]
    # As serving reads a new shape (TransferIndex._shape_carry): per shape, the median of
    # the boosters' carries and the mean of the flat ones.
    _, cell = np.unique(group[rows], return_inverse=True)
    n = int(cell.max()) + 1
    has_boost, boost, _ = row_median(cell, r_a + carried, n)
    has_flat, flat_c = row_mean(cell, r_a + flat, n)
    target = np.empty(n)
    target[cell] = r_b
    use = has_boost & has_flat
    if not use.any():
        return 0.0
    hits = [int(within_log((1 - w) * boost[use] + w * flat_c[use] - target[use]).sum())
            for w in NEIGHBOUR_SHARES]
    return float(NEIGHBOUR_SHARES[int(np.argmax(hits))])


def _lgb_predict(booster: lgb.Booster, X: np.ndarray) -> np.ndarray:
    # Waking OpenMP threads costs more than a launch-time request's rows.
    return np.asarray(booster.predict(X, num_threads=1 if len(X) < 2000 else 0),
                      dtype=np.float64)


def _by_halves(scorers: list[Callable[[np.ndarray], np.ndarray]], X: np.ndarray,
               fold: np.ndarray) -> np.ndarray:
    """Each row predicted by the scorer of its family's half (trained on the others)."""
    out = np.zeros(len(X))
    for k in range(FOLDS):
        rows = np.flatnonzero(fold == k)
        if len(rows):
            out[rows] = scorers[k](X[rows])
    return out


def refit_day(t: datetime) -> datetime:
    """The last pair-model refit day at or before ``t`` (UTC midnight, every
    :data:`REFIT_DAYS` days since the epoch)."""
    days = (t.astimezone(UTC) - _EPOCH) // timedelta(days=1)
    return _EPOCH + timedelta(days=days - days % REFIT_DAYS)


class PairSchedule:
    """The pair model as of any time: the one fit on the :data:`PAIR_DAYS` days of
    ``attempts`` before the last refit day (:func:`refit_day`); ``None`` where too few.

    ``attempts`` are in any state (each fit takes the usable ones of its days, so the
    schedule holds no filtered copy of a window all night). From ``fresh_at`` on (the
    time a night serves), the model is fit on the days just before that day instead. ``cache``
    (shared by consecutive nights) maps ``(fit day, rows, params)`` to a fitted model.
    """

    def __init__(self, attempts: pd.DataFrame, catalog: Catalog, params: PairParams | None = None,
                 cache: MutableMapping[tuple[str, int, str], PairModel | None] | None = None,
                 fresh_at: datetime | None = None, share: float | None = None,
                 store: PairStore | None = None) -> None:
        self.attempts = attempts
        self.catalog = catalog
        self.params = params or PairParams()
        self.fresh_at = fresh_at
        self.store = store
        self.cache: MutableMapping[tuple[str, int, str], PairModel | None] = \
            cache if cache is not None else {}
        self._at = pd.DatetimeIndex(pd.to_datetime(attempts["submitted_at"], utc=True))
        self._share = share
        # Snapshots of days encoded side by side may ask for a model not yet fit: it is fit
        # once, the other thread waiting for it.
        self._fitting = threading.Lock()

    def __call__(self, as_of: datetime) -> PairModel | None:
        """The pair model as of ``as_of``; before ``fresh_at``, reading the flat carry at
        the night's share (:meth:`night_share`)."""
        fresh = self.fresh_at is not None and as_of >= self.fresh_at
        model = self._fit(as_of, fresh)
        if model is None or fresh or self.fresh_at is None:
            return model
        share = self.night_share()
        return model if share == model.neighbour_share else model.with_share(share)

    def night_share(self) -> float:
        """The flat carry's share every snapshot of the night reads: the one the pair model
        served at ``fresh_at`` judged (0 without one), unless given at construction (a
        worker encoding some of a night's days, :mod:`leap.model.distributed`).

        Each refit's pair model judges a share of its own; training rows encoded with one
        share and served with another teach the trees a blend they never see. The public
        Sia table with a type's multi-device rows held out: 29.9% within +-20% with each
        refit's own share, 34.2% with the night's (FLOP/s ratio 38.5%); its held-out cells
        85.4 -> 84.5% (k-NN 85.3%); the default fleet's pair models all judge 0, so its
        model is unchanged (``docs/measurements.md``)."""
        if self._share is None:
            if self.fresh_at is None:
                raise ValueError("a pair schedule without a night to serve has no night share")
            served = self._fit(self.fresh_at, True)
            self._share = served.neighbour_share if served is not None else 0.0
        return self._share

    def _fit(self, as_of: datetime, fresh: bool) -> PairModel | None:
        day = refit_day(as_of)
        if fresh:
            day = _EPOCH + timedelta(days=(as_of.astimezone(UTC) - _EPOCH) // timedelta(days=1))
        rows = np.flatnonzero((self._at >= day - timedelta(days=PAIR_DAYS)) & (self._at < day))
        key = (day.date().isoformat(), len(rows), repr(self.params))
        if key not in self.cache:
            with self._fitting:
                if key not in self.cache:
                    self.cache[key] = self._fit_or_load(day, self._usable(rows))
        return self.cache[key]

    def _fit_or_load(self, day: datetime, rows: pd.DataFrame) -> PairModel | None:
        """The pair model of ``rows`` (its refit day's), from :attr:`store` when it has
        one fit on the same rows, else fit (and kept there)."""
        if self.store is None:
            return PairModel.fit(rows, self.catalog, self.params)
        key = self.store.key(day.date(), rows, self.catalog, self.params)
        model = self.store.get(key)
        if model is None:
            model = PairModel.fit(rows, self.catalog, self.params)
            if model is not None:
                self.store.put(key, model)
        return model

    def _usable(self, rows: np.ndarray) -> pd.DataFrame:
        """:func:`~leap.data.usage.usable_attempts` of ``rows``, only the columns a fit reads
        (:data:`FIT_COLUMNS`), in one copy instead of a copy of the two weeks' whole rows and
        then a filtered one: on a fleet four times the default, a fit's peak over its start
        fell from 0.85 to 0.70 GiB."""
        a = self.attempts
        judged = a.iloc[rows, [a.columns.get_loc(c) for c in ("status", "throughput",
                                                                "hardware")]]
        keep = rows[usable_mask(judged) & judged["hardware"].isin(list(self.catalog))
                    .to_numpy(dtype=bool)]
        out = a.iloc[keep, [a.columns.get_loc(c) for c in FIT_COLUMNS if c in a.columns]]
        out.index = pd.RangeIndex(len(out))
        return out


class PairStore:
    """Fitted pair models kept on disk from one night to the next (``leap train`` keeps them
    in ``<home>/cache/pairs``; see :mod:`leap.cache`).

    A night's window reads about five pair models: one per weekly refit day in it
    (:class:`PairSchedule`), and the one fit just before the night served. All but that last
    one are models the night before fit too, on the same rows, so a night that finds them
    here fits one or two instead of five (9 s each on the default fleet). An entry is found
    by a digest of everything its fit reads: the rows (every column, in order), the catalog,
    the settings, the refit day and the source of leap itself, so a late attempt, a catalog
    edit or another leap version fits afresh. It holds the model's own files
    (:meth:`PairModel.save`: LightGBM text and JSON; about 11 MB on the default fleet).
    """

    def __init__(self, directory: Path) -> None:
        self.disk = DiskCache(directory)

    @staticmethod
    def key(day: date, rows: pd.DataFrame, catalog: Catalog, params: PairParams) -> str:
        """The digest a fit on ``rows`` for ``day`` is kept under (the threads it grows on
        change its speed, not the model: one process's fit serves another's)."""
        return digest([day.isoformat(), list(map(str, rows.columns)), catalog.fingerprint(),
                       repr(replace(params, num_threads=1)), source_digest()],
                      pd.util.hash_pandas_object(rows, index=False).to_numpy().tobytes())

    def get(self, key: str) -> PairModel | None:
        """The model kept under ``key``, or ``None``."""
        return self.disk.read(key, PairModel.load)

    def put(self, key: str, model: PairModel) -> None:
        self.disk.write(key, model.save)

    def prune(self) -> int:
        """Remove every model this night neither read nor fit (:meth:`DiskCache.prune`):
        the next night reads the refit days of its window, each read or fit tonight."""
        return self.disk.prune()
