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
rather than up to a week later.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.schema import PRECISIONS
from leap.errors import ArtifactError
from leap.features.columns import Columns
from leap.features.physics import activation_bytes, estimates, hardware_specs, peak_flops

#: Family halves for cross-fitting.
FOLDS = 2
#: Columns that make one configuration of a family (with ``hardware``, one group).
CONFIG_COLUMNS = ("family_id", "trainer_count", "devices_per_trainer", "batch_size", "precision",
                  "tensor_parallel", "pipeline_parallel")
#: Job columns the pair features read (launch-time, all optional but ``family_id``).
JOB_FEATURE_COLUMNS = (*CONFIG_COLUMNS, "model_category", "num_params", "flops_per_sample",
                       "embedding_params", "hidden_dim", "seq_len", "num_layers")
_PHYS_DIFF = ("log_phys_sps", "log_compute_sps", "log_weight_stream_sps")
_PHYS_BOTH = ("comm_to_compute", "mem_fit", "log_compute_sps", "log_weight_stream_sps")
_SPECS = ("mem_bw_gb_per_s", "intra_node_bw_gb_per_s", "inter_node_bw_gbit_per_s", "memory_gb",
          "devices_per_host")
_LOG_JOB = ("trainer_count", "batch_size", "num_params", "flops_per_sample", "embedding_params",
            "hidden_dim", "seq_len")
_RAW_JOB = ("devices_per_trainer", "tensor_parallel", "pipeline_parallel", "num_layers")
CATEGORICAL = ("vendor_a", "vendor_b", "precision", "model_category")
#: Where one step of the job sits on each type: ``step``, log seconds of a device's compute
#: per step at peak (little work per step leaves a big device idle: launch overheads,
#: unsaturated kernels); ``mem_step``, log seconds of its activation traffic per step
#: (:func:`~leap.features.physics.activation_bytes` over the memory bandwidth); ``ridge``,
#: the job's FLOPs per activation byte over the type's peak FLOP/s per byte/s (above 0:
#: compute-bound). On the default fleet's held-out day they took the pair model's error on
#: pairs of one vendor from 0.088 to 0.081 (median absolute log error against the
#: simulator's truth; the harder fleet, in a prototype, 0.077 to 0.071); the pair estimate
#: on the day's 611 attempts on types new to their family moved within training noise
#: (58.1-60.7% within +-20% between two fits, against 58.6%).
_STEP_FEATURES = ("a_step", "b_step", "d_step", "a_ridge", "b_ridge", "a_mem_step",
                  "b_mem_step")
PAIR_FEATURES: tuple[str, ...] = (
    *(f"d_{k}" for k in _PHYS_DIFF), *(f"{s}_{k}" for k in _PHYS_BOTH for s in ("a", "b")),
    "d_peak", "a_peak", *(f"{s}_{k}" for k in _SPECS for s in ("d", "a")),
    *(f"log_{c}" for c in _LOG_JOB), *_RAW_JOB, "log_batch_per_device", *CATEGORICAL,
    *_STEP_FEATURES)
#: A configuration's shape, as history keys it (:func:`leap.features.history.shape_keys`).
SHAPE_COLUMNS = ("trainer_count", "devices_per_trainer", "batch_size")
_SHAPE_LOGS = ("log_trainers", "log_devices_per_trainer", "log_batch", "log_batch_per_device")
_SHAPE_PHYS = ("log_phys_sps", "log_compute_sps", "log_weight_stream_sps", "comm_to_compute",
               "mem_fit")
_SHAPE_JOB = ("num_params", "flops_per_sample", "embedding_params", "hidden_dim", "seq_len")
SHAPE_CATEGORICAL = ("vendor", "precision", "model_category")
SHAPE_FEATURES: tuple[str, ...] = (
    *(f"{s}_{k}" for k in (*_SHAPE_LOGS, *_SHAPE_PHYS) for s in ("a", "b")),
    *(f"d_{k}" for k in (*_SHAPE_LOGS, *_SHAPE_PHYS[:3])), "peak",
    *(f"hw_{k}" for k in _SPECS), *(f"log_{c}" for c in _SHAPE_JOB),
    "tensor_parallel", "pipeline_parallel", "num_layers", *SHAPE_CATEGORICAL)
#: Configurations paired per fit at most (a seeded sample beyond it keeps the fit short).
MAX_PAIRS = 200_000
#: Days between refits of the pair model (see the module docstring).
REFIT_DAYS = 7
#: Days of history before its refit day that a pair model learns from.
PAIR_DAYS = 14
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class PairParams:
    """LightGBM settings of the pair boosters (set once, not tuned: a correction to the
    physics ratio needs few, shallow-ish trees; see the closing notes of issue 10)."""

    rounds: int = 200
    #: The shape boosters' rounds: on the default fleet's held-out day 100 rounds carried new
    #: shapes within 0.2 points of 200 (72.4% vs 72.6%) at half the fitting time.
    shape_rounds: int = 100
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


def family_fold(family_id: np.ndarray) -> np.ndarray:
    """Cross-fitting half (0 or 1) of each family id: a hash, stable across runs and machines."""
    return np.fromiter((zlib.crc32(str(f).encode()) % FOLDS for f in family_id),
                       dtype=np.int64, count=len(family_id))


def _phys_r(jobs: Columns, catalog: Catalog) -> dict[str, np.ndarray]:
    est = estimates(jobs, catalog)
    est["log_phys_sps"] = np.nan_to_num(est["log_phys_sps"], nan=0.0)  # as history's ``r``
    return est


def pair_matrix(jobs: Columns, hw_a: np.ndarray, hw_b: np.ndarray, catalog: Catalog,
                vocab: dict[str, list[str]], job: np.ndarray | None = None) -> np.ndarray:
    """Features (:data:`PAIR_FEATURES`) of each job moving from ``hw_a`` to ``hw_b``.

    Row ``i`` is job ``job[i]`` (a row of ``jobs``; default: row ``i``). Physics estimates
    are computed once per distinct (job, type) and job features once per job, then gathered:
    ranking one job over 20 types pairs it with every type its family ran on, and a day of
    training rows repeats a few thousand configurations.
    """
    n = len(hw_a)
    job = np.arange(n) if job is None else np.asarray(job, dtype=np.int64)
    hcode, names = pd.factorize(np.concatenate([np.asarray(hw_a, dtype=object),
                                                np.asarray(hw_b, dtype=object)]))
    combo, inv = np.unique(np.concatenate([job, job]) * len(names) + hcode, return_inverse=True)
    on = jobs.take(combo // len(names)).with_hardware(np.asarray(names, dtype=object)[
        combo % len(names)])
    est = _phys_r(on, catalog)
    specs = hardware_specs(catalog, on.obj("hardware"))
    ia, ib = inv[:n], inv[n:]
    f: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in _PHYS_DIFF:
            f[f"d_{k}"] = est[k][ib] - est[k][ia]
        for k in _PHYS_BOTH:
            f[f"a_{k}"], f[f"b_{k}"] = est[k][ia], est[k][ib]
        peak = np.log(peak_flops(on.obj("precision"), specs))
        f["d_peak"], f["a_peak"] = peak[ib] - peak[ia], peak[ia]
        per_device = np.fmax(on.num("batch_size"), 1.0) / np.fmax(
            on.num("devices_per_trainer"), 1.0)
        flops, act = on.num("flops_per_sample"), activation_bytes(on)
        log_bw = np.log(specs["mem_bw_gb_per_s"] * 1e9)
        step = np.log(per_device * flops) - peak
        mem_step = np.log(per_device * act) - log_bw
        ridge = np.log(flops / act) - (peak - log_bw)
        f["a_step"], f["b_step"], f["d_step"] = step[ia], step[ib], step[ib] - step[ia]
        f["a_ridge"], f["b_ridge"] = ridge[ia], ridge[ib]
        f["a_mem_step"], f["b_mem_step"] = mem_step[ia], mem_step[ib]
        for k in _SPECS:
            spec = np.log(specs[k])
            f[f"d_{k}"], f[f"a_{k}"] = spec[ib] - spec[ia], spec[ia]
        for c in _LOG_JOB:
            f[f"log_{c}"] = np.log(jobs.num(c))[job]
        for c in _RAW_JOB:
            f[c] = jobs.num(c)[job]
        f["log_batch_per_device"] = (np.log(jobs.num("batch_size")) - np.log(
            np.fmax(jobs.num("devices_per_trainer"), 1.0)))[job]
    vendor = _codes([catalog[h].vendor if h in catalog else None for h in names],
                    vocab["vendor"])
    f["vendor_a"], f["vendor_b"] = vendor[hcode[:n]], vendor[hcode[n:]]
    f["precision"] = _codes(jobs.obj("precision"), vocab["precision"])[job]
    f["model_category"] = _codes(jobs.obj("model_category"), vocab["model_category"])[job]
    X = np.column_stack([f[name] for name in PAIR_FEATURES])
    return np.where(np.isfinite(X), X, np.nan)


def log_shape(shape: np.ndarray) -> np.ndarray:
    """Log of ``(n, 3)`` shapes (:data:`SHAPE_COLUMNS`), a missing part (NaN, -1) read as 1."""
    return np.log(np.fmax(np.asarray(shape, dtype=np.float64), 1.0))


def shape_of(on: Columns) -> np.ndarray:
    """The ``(n, 3)`` shape of each row (:data:`SHAPE_COLUMNS`; NaN where missing)."""
    return np.column_stack([on.num(c) for c in SHAPE_COLUMNS])


def _shape_logs(on: Columns) -> dict[str, np.ndarray]:
    tc, dpt, bs = log_shape(shape_of(on)).T
    return {"log_trainers": tc, "log_devices_per_trainer": dpt, "log_batch": bs,
            "log_batch_per_device": bs - dpt}


def shape_matrix(jobs: Columns, a_shape: np.ndarray, catalog: Catalog,
                 vocab: dict[str, list[str]], job: np.ndarray | None = None) -> np.ndarray:
    """Features (:data:`SHAPE_FEATURES`) of each job moving from shape ``a_shape[i]``
    (trainers, devices per trainer, batch; -1 or NaN = missing) to its own shape on its own
    type; row ``i`` is job ``job[i]`` of ``jobs`` (default: row ``i``)."""
    n = len(a_shape)
    job = np.arange(n) if job is None else np.asarray(job, dtype=np.int64)
    on_b = jobs.take(job)
    a = np.where(np.asarray(a_shape, dtype=np.float64) > 0, a_shape, np.nan)
    on_a = on_b.replace({c: a[:, i] for i, c in enumerate(SHAPE_COLUMNS)})
    f: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for s, on in (("a", on_a), ("b", on_b)):
            f.update({f"{s}_{k}": v for k, v in _shape_logs(on).items()})
            est = _phys_r(on, catalog)
            f.update({f"{s}_{k}": est[k] for k in _SHAPE_PHYS})
        for k in (*_SHAPE_LOGS, *_SHAPE_PHYS[:3]):
            f[f"d_{k}"] = f[f"b_{k}"] - f[f"a_{k}"]
        hardware = on_b.obj("hardware")
        specs = hardware_specs(catalog, hardware)
        f["peak"] = np.log(peak_flops(on_b.obj("precision"), specs))
        for k in _SPECS:
            f[f"hw_{k}"] = np.log(specs[k])
        for c in _SHAPE_JOB:
            f[f"log_{c}"] = np.log(on_b.num(c))
    for c in ("tensor_parallel", "pipeline_parallel", "num_layers"):
        f[c] = on_b.num(c)
    f["vendor"] = _codes([catalog[h].vendor if h in catalog else None for h in hardware],
                         vocab["vendor"])
    f["precision"] = _codes(on_b.obj("precision"), vocab["precision"])
    f["model_category"] = _codes(on_b.obj("model_category"), vocab["model_category"])
    X = np.column_stack([f[name] for name in SHAPE_FEATURES])
    return np.where(np.isfinite(X), X, np.nan)


def shape_training_rows(attempts: pd.DataFrame, catalog: Catalog, *,
                        max_pairs: int = MAX_PAIRS, seed: int = 0
                        ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """``(jobs, shape A, r(B) - r(A) and weight)`` of every two shapes one family ran on one
    type (one row per ordered pair; ``jobs`` are shape B's columns, with ``hardware``).

    ``attempts`` are succeeded attempts with a positive ``throughput``. Each (family, type,
    shape) group is its median log throughput over its physics estimate (the other job
    columns: the group's first row); weights are the square root of the smaller group's
    attempt count.
    """
    ok = attempts[attempts["hardware"].isin(list(catalog))]
    cols = [c for c in JOB_FEATURE_COLUMNS if c in ok.columns and c not in SHAPE_COLUMNS]
    frame = ok[[*cols, "hardware"]].copy()
    for c in SHAPE_COLUMNS:
        frame[c] = pd.to_numeric(ok[c], errors="coerce").fillna(-1.0) if c in ok.columns \
            else -1.0
    frame["y"] = np.log(ok["throughput"].to_numpy(dtype=np.float64))
    keys = ["family_id", "hardware", *SHAPE_COLUMNS]
    others = {c: (c, "first") for c in cols if c not in keys}
    groups = frame.groupby(keys, sort=True).agg(y=("y", "median"), n=("y", "size"),
                                                **others).reset_index()
    groups["r"] = groups["y"] - _phys_r(Columns.from_frame(groups), catalog)["log_phys_sps"]
    pairs = groups.merge(groups[[*keys, "r", "n"]], on=["family_id", "hardware"],
                         suffixes=("", "_a"))
    differ = np.zeros(len(pairs), dtype=bool)
    for c in SHAPE_COLUMNS:
        differ |= (pairs[c] != pairs[f"{c}_a"]).to_numpy()
    pairs = pairs[differ].reset_index(drop=True)
    if len(pairs) > max_pairs:
        keep = np.sort(np.random.default_rng(seed).choice(len(pairs), max_pairs, replace=False))
        pairs = pairs.iloc[keep].reset_index(drop=True)
    jobs = pairs[[*cols, *SHAPE_COLUMNS, "hardware"]]
    a_shape = pairs[[f"{c}_a" for c in SHAPE_COLUMNS]].to_numpy(dtype=np.float64)
    target = (pairs["r"] - pairs["r_a"]).to_numpy()
    weight = np.sqrt(np.minimum(pairs["n"], pairs["n_a"]).to_numpy(dtype=np.float64))
    return jobs, a_shape, np.column_stack([target, weight])


def _codes(values: object, vocab: list[str]) -> np.ndarray:
    pos = {v: float(i) for i, v in enumerate(vocab)}
    return np.array([pos.get(v, np.nan) if isinstance(v, str) else np.nan
                     for v in values], dtype=np.float64)  # type: ignore[attr-defined]


def pair_training_rows(attempts: pd.DataFrame, catalog: Catalog, *, max_pairs: int = MAX_PAIRS,
                       seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """``(jobs, hw_a, hw_b, r(B) - r(A) and weight)`` of every configuration run on two types.

    ``attempts`` are succeeded attempts with a positive ``throughput``. Each (configuration,
    type) group is its median log throughput; weights are the square root of the smaller
    group's attempt count. Returns the job columns of each pair (one row per ordered pair),
    the two type arrays, and a ``(n, 2)`` array of target and weight.
    """
    ok = attempts[attempts["hardware"].isin(list(catalog))]
    cols = [c for c in JOB_FEATURE_COLUMNS if c in ok.columns]
    frame = ok[[*cols, "hardware"]].copy()
    frame["y"] = np.log(ok["throughput"].to_numpy(dtype=np.float64))
    keys = [c for c in CONFIG_COLUMNS if c in frame.columns]
    others = {c: (c, "first") for c in cols if c not in keys}
    groups = frame.groupby([*keys, "hardware"], dropna=False, sort=True).agg(
        y=("y", "median"), n=("y", "size"), **others).reset_index()
    pairs = groups.merge(groups[[*keys, "hardware", "y", "n"]], on=keys, suffixes=("_a", "_b"))
    pairs = pairs[pairs["hardware_a"] != pairs["hardware_b"]].reset_index(drop=True)
    if len(pairs) > max_pairs:
        keep = np.sort(np.random.default_rng(seed).choice(len(pairs), max_pairs, replace=False))
        pairs = pairs.iloc[keep].reset_index(drop=True)
    jobs = pairs[[c for c in cols if c in pairs.columns]]
    hw_a = pairs["hardware_a"].to_numpy(dtype=object)
    hw_b = pairs["hardware_b"].to_numpy(dtype=object)
    cj = Columns.from_frame(jobs)
    phys_a = _phys_r(cj.with_hardware(hw_a), catalog)["log_phys_sps"]
    phys_b = _phys_r(cj.with_hardware(hw_b), catalog)["log_phys_sps"]
    target = (pairs["y_b"] - pairs["y_a"]).to_numpy() - (phys_b - phys_a)
    weight = np.sqrt(np.minimum(pairs["n_a"], pairs["n_b"]).to_numpy(dtype=np.float64))
    return jobs, hw_a, hw_b, np.column_stack([target, weight])


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
                 shape_boosters: list[lgb.Booster] | None = None) -> None:
        shape_boosters = shape_boosters or []
        if len(boosters) != FOLDS or len(shape_boosters) not in (0, FOLDS):
            raise ArtifactError(f"the pair model needs {FOLDS} pair boosters and 0 or {FOLDS} "
                                f"shape boosters, got {len(boosters)} and {len(shape_boosters)}")
        self.boosters = boosters
        self.shape_boosters = shape_boosters
        self.vocab = vocab
        self._texts: list[str] | None = None

    @classmethod
    def fit(cls, attempts: pd.DataFrame, catalog: Catalog,
            params: PairParams | None = None) -> PairModel | None:
        """Train on ``attempts`` (succeeded, positive throughput); ``None`` when a half of
        the families has fewer than 50 pairs to learn from (the transfer tables alone serve).
        The shape boosters are left out where a half has fewer than 50 shape pairs.
        """
        p = params or PairParams()
        if attempts.empty:
            return None
        jobs, hw_a, hw_b, tw = pair_training_rows(attempts, catalog, seed=p.seed)
        vocab = {"vendor": sorted({catalog[n].vendor for n in catalog}),
                 "precision": list(PRECISIONS),
                 "model_category": sorted({str(c) for c in attempts.get("model_category", [])
                                           if isinstance(c, str)})}
        X = pair_matrix(Columns.from_frame(jobs), hw_a, hw_b, catalog, vocab)
        boosters = _fit_halves(X, tw, jobs["family_id"].to_numpy(), PAIR_FEATURES, CATEGORICAL,
                               p, p.rounds)
        if boosters is None:
            return None
        s_jobs, a_shape, s_tw = shape_training_rows(attempts, catalog, seed=p.seed)
        shapes = _fit_halves(shape_matrix(Columns.from_frame(s_jobs), a_shape, catalog, vocab),
                             s_tw, s_jobs["family_id"].to_numpy(), SHAPE_FEATURES,
                             SHAPE_CATEGORICAL, p, p.shape_rounds)
        return cls(boosters, vocab, shapes)

    def predict(self, jobs: Columns, hw_a: np.ndarray, hw_b: np.ndarray,
                catalog: Catalog, job: np.ndarray | None = None) -> np.ndarray:
        """``r(B) - r(A)`` of each job from ``hw_a`` to ``hw_b`` (row ``i`` is job ``job[i]``
        of ``jobs``, default row ``i``), by the booster of the other half of the families
        (see the module docstring)."""
        if len(hw_a) == 0:
            return np.zeros(0)
        job = np.arange(len(hw_a)) if job is None else np.asarray(job, dtype=np.int64)
        return _by_halves(self.boosters, pair_matrix(jobs, hw_a, hw_b, catalog, self.vocab, job),
                          family_fold(jobs.obj("family_id"))[job])

    def predict_shapes(self, jobs: Columns, a_shape: np.ndarray, catalog: Catalog,
                       job: np.ndarray | None = None) -> np.ndarray:
        """``r(B) - r(A)`` of each job from shape ``a_shape[i]`` to its own shape on its own
        type (row ``i`` is job ``job[i]``), cross-fitted like :meth:`predict`; NaN without
        shape boosters."""
        if not self.shape_boosters or len(a_shape) == 0:
            return np.full(len(a_shape), np.nan)
        job = np.arange(len(a_shape)) if job is None else np.asarray(job, dtype=np.int64)
        return _by_halves(self.shape_boosters,
                          shape_matrix(jobs, a_shape, catalog, self.vocab, job),
                          family_fold(jobs.obj("family_id"))[job])

    # Persistence (inside the snapshot of a model artifact) ----------------------------
    def texts(self) -> list[str]:
        if self._texts is None:
            self._texts = [b.model_to_string() for b in (*self.boosters, *self.shape_boosters)]
        return self._texts

    def fingerprint(self) -> str:
        h = hashlib.sha256(json.dumps(self.vocab, sort_keys=True).encode())
        for t in self.texts():
            h.update(t.encode())
        return h.hexdigest()[:16]

    def save(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        names = [*(f"pairs_{k}.txt" for k in range(FOLDS)),
                 *(f"shapes_{k}.txt" for k in range(len(self.shape_boosters)))]
        for name, text in zip(names, self.texts(), strict=True):
            path = directory / name
            path.write_text(text)
            paths.append(path)
        meta = directory / "pairs.json"
        meta.write_text(json.dumps({"features": list(PAIR_FEATURES), "vocab": self.vocab,
                                    "shape_features": list(SHAPE_FEATURES),
                                    "shape_boosters": len(self.shape_boosters)}))
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
            return cls(boosters, {k: list(v) for k, v in info["vocab"].items()}, shapes)
        except (OSError, ValueError, KeyError, TypeError, lgb.basic.LightGBMError) as exc:
            raise ArtifactError(f"the pair model in {directory} is unreadable: {exc}") from None


def _fit_halves(X: np.ndarray, tw: np.ndarray, family_id: np.ndarray, names: tuple[str, ...],
                categorical: tuple[str, ...], p: PairParams, rounds: int
                ) -> list[lgb.Booster] | None:
    """One booster per family half, each on the other halves' rows with a finite target;
    ``None`` when a half has fewer than 50 rows to learn from."""
    ok = np.isfinite(tw[:, 0])
    fold = family_fold(family_id) if len(family_id) else np.empty(0, np.int64)
    boosters = []
    for k in range(FOLDS):
        train = ok & (fold != k)
        if train.sum() < 50:
            return None
        data = lgb.Dataset(X[train], label=tw[train, 0], weight=tw[train, 1],
                           feature_name=list(names), categorical_feature=list(categorical),
                           params={"max_bin": p.max_bin, "verbosity": -1})
        boosters.append(lgb.train(p.lgb_params(), data, num_boost_round=rounds)
                        .free_dataset())
    return boosters


def _by_halves(boosters: list[lgb.Booster], X: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Each row predicted by the booster of its family's half (trained on the others)."""
    out = np.zeros(len(X))
    for k in range(FOLDS):
        rows = np.flatnonzero(fold == k)
        if len(rows):
            # Waking OpenMP threads costs more than a launch-time request's rows.
            out[rows] = boosters[k].predict(X[rows], num_threads=1 if len(rows) < 2000 else 0)
    return out


def refit_day(t: datetime) -> datetime:
    """The last pair-model refit day at or before ``t`` (UTC midnight, every
    :data:`REFIT_DAYS` days since the epoch)."""
    days = (t.astimezone(UTC) - _EPOCH) // timedelta(days=1)
    return _EPOCH + timedelta(days=days - days % REFIT_DAYS)


class PairSchedule:
    """The pair model as of any time: the one fit on the :data:`PAIR_DAYS` days of
    ``attempts`` before the last refit day (:func:`refit_day`); ``None`` where too few.

    ``attempts`` are succeeded attempts with positive throughput. From ``fresh_at`` on (the
    time a night serves), the model is fit on the days just before that day instead. ``cache``
    (shared by consecutive nights) maps ``(fit day, rows, params)`` to a fitted model.
    """

    def __init__(self, attempts: pd.DataFrame, catalog: Catalog, params: PairParams | None = None,
                 cache: MutableMapping[tuple[str, int, str], PairModel | None] | None = None,
                 fresh_at: datetime | None = None) -> None:
        self.attempts = attempts
        self.catalog = catalog
        self.params = params or PairParams()
        self.fresh_at = fresh_at
        self.cache: MutableMapping[tuple[str, int, str], PairModel | None] = \
            cache if cache is not None else {}
        self._at = pd.DatetimeIndex(pd.to_datetime(attempts["submitted_at"], utc=True))

    def __call__(self, as_of: datetime) -> PairModel | None:
        day = refit_day(as_of)
        if self.fresh_at is not None and as_of >= self.fresh_at:
            day = _EPOCH + timedelta(days=(as_of.astimezone(UTC) - _EPOCH) // timedelta(days=1))
        rows = np.flatnonzero((self._at >= day - timedelta(days=PAIR_DAYS)) & (self._at < day))
        key = (day.date().isoformat(), len(rows), repr(self.params))
        if key not in self.cache:
            self.cache[key] = PairModel.fit(self.attempts.iloc[rows], self.catalog, self.params)
        return self.cache[key]
