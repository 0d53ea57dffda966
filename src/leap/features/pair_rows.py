"""The rows the pair model learns from and scores (:mod:`leap.features.pairs`): features of one
job moving between two types (:func:`pair_matrix`) or between two shapes on one type
(:func:`shape_matrix`), and the training pairs of a window's configurations
(:func:`pair_training_rows`, :func:`shape_training_rows`).
"""

from __future__ import annotations

import functools
import logging
import os
import zlib
from types import ModuleType

import numpy as np
import pandas as pd

from leap.catalog import SPEC_COLUMNS, Catalog
from leap.features.columns import (
    Columns,
    factorize,
    nan_to,
    stack,
    vocab_codes,
    vocab_positions,
)
from leap.features.physics import (
    ACTIVATION_BYTES,
    ALLREDUCE_BYTES_PER_PARAM,
    PEAK_KIND,
    TRAIN_BYTES_PER_PARAM,
    activation_bytes,
    estimates_on_specs,
)


def _import_native() -> ModuleType | None:
    """The compiled kernels, built at install where a C compiler was found (pyproject.toml's
    ext-modules); None without them (NumPy computes every row)."""
    try:
        from leap.features import _native
    except ImportError:  # pragma: no cover - an install without a C compiler
        return None
    return _native


_native = _import_native()

log = logging.getLogger("leap.features")

#: How far the compiled kernels may be from the NumPy code, relative and absolute. They round
#: as NumPy does step for step and call the C library's log1p, log and exp; on a host with
#: AVX-512 NumPy takes its own SIMD code for those, which differs in the last bit (log1p for
#: 4.7% of values on session 56's host), so a spread of equal values came out 0 one way and
#: 5.6e-17 the other.
NATIVE_TOLERANCE = 1e-12


def native_agrees(want: np.ndarray, got: np.ndarray) -> bool:
    """Whether a compiled kernel's ``got`` equals the NumPy code's ``want`` within
    :data:`NATIVE_TOLERANCE` (NaN where it is NaN).

    >>> native_agrees(np.array([0.0, np.nan]), np.array([5.6e-17, np.nan]))
    True
    """
    return bool(np.allclose(want, got, rtol=NATIVE_TOLERANCE, atol=NATIVE_TOLERANCE,
                            equal_nan=True))

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
#: The shape boosters read where a step sits too (:data:`_STEP_FEATURES`, at both shapes):
#: how far a device is from saturation moves with the batch per device. On the harder
#: fleet's held-out day they took new shapes from 78.2% to 78.5% within +-20% (the default
#: fleet's day: 85.60% overall before, 85.51% after, its masked pairs 65.8% both).
SHAPE_FEATURES: tuple[str, ...] = (
    *(f"{s}_{k}" for k in (*_SHAPE_LOGS, *_SHAPE_PHYS) for s in ("a", "b")),
    *(f"d_{k}" for k in (*_SHAPE_LOGS, *_SHAPE_PHYS[:3])), "peak",
    *(f"hw_{k}" for k in _SPECS), *(f"log_{c}" for c in _SHAPE_JOB),
    "tensor_parallel", "pipeline_parallel", "num_layers", *SHAPE_CATEGORICAL,
    "a_step", "b_step", "a_mem_step", "b_mem_step", "ridge")
#: Configurations paired per fit at most (a seeded sample beyond it keeps the fit short).
MAX_PAIRS = 200_000
#: Shape pairs per fit at most. A fleet whose jobs are retuned often has far more than
#: :data:`MAX_PAIRS` (the harder fleet's window: 2.7 million), and the boosters keep learning
#: from them: on that fleet's held-out day, 200,000 / 1 million / all of them put 78.5 /
#: 79.2 / 79.2% of the attempts on new shapes within +-20% (300 rounds of 127 leaves).
SHAPE_MAX_PAIRS = 3_000_000
#: Shapes a family ran on the target type, nearest to the job's own first, that serving
#: carries its level from (``xfer_s_r``, :meth:`leap.features.transfer.TransferIndex.features`).
#: On the harder fleet's held-out day (``leap simulate --scenario novel``, seed 1; the shape
#: boosters trained on each shape's nearest this many plus one) their median landed within
#: +-20% of the simulator's truth for 81.6 / 84.3 / 86.8 / 87.1 / 87.0 / 85.9% of the day's
#: 15,205 attempts on new shapes with 1 / 2 / 3 / 5 / 8 / 12 shapes; on seed 2's fleet
#: (15,288) 88.2 / 88.9 / 88.2% with 3 / 5 / 8.
SHAPE_NEAREST = 5
#: The other shapes of a family on a type that each of its shapes is paired with for the
#: shape boosters, nearest first: those serving reads and one more. With the same 300 rounds
#: of 127 leaves (:class:`leap.features.pairs.PairParams`), pairing every two shapes instead
#: (sampled: 24 million pairs in the harder fleet's two weeks) put the boosters' estimate
#: within +-20% of the truth for 83.9% of those 15,205 attempts, against 86.8% with the
#: nearest 3 + 1 (80.3% with every pair and the earlier 100 rounds of 63 leaves).
SHAPE_PAIR_NEAREST = SHAPE_NEAREST + 1


def job_folds(jobs: Columns, job: np.ndarray) -> np.ndarray:
    """:func:`family_fold` of row ``job[i]`` of ``jobs`` for each ``i`` (rows numbered by
    job: hashed once a job, :meth:`Columns.per_job`)."""
    return jobs.per_job("fold", lambda c: family_fold(c.obj("family_id")))[job]


def family_fold(family_id: np.ndarray) -> np.ndarray:
    """Cross-fitting half (0 or 1) of each family id: a hash, stable across runs and machines
    (hashed once per distinct id: a block of rows repeats a few thousand families)."""
    codes, distinct = factorize(np.asarray(family_id, dtype=object))
    fold = np.fromiter((zlib.crc32(str(f).encode()) % FOLDS for f in distinct),
                       dtype=np.int64, count=len(distinct))
    return fold[codes]


def _vendors(names: np.ndarray, catalog: Catalog) -> np.ndarray:
    """The vendor of each type name (None for a type the catalog lacks)."""
    return np.array([catalog[h].vendor if h in catalog else None for h in names], dtype=object)


def _phys_r(jobs: Columns, catalog: Catalog) -> dict[str, np.ndarray]:
    return _phys_specs(jobs, catalog)[0]


def _phys_specs(jobs: Columns, catalog: Catalog
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """The physics estimates of ``jobs`` with a missing ``log_phys_sps`` read as 0 (as
    history's ``r`` is), each row's spec figures and its log peak FLOP/s."""
    est, specs, peak = estimates_on_specs(jobs, catalog)
    est["log_phys_sps"] = nan_to(est["log_phys_sps"])
    with np.errstate(divide="ignore"):
        return est, specs, np.log(peak)


def _step_terms(on: Columns, specs: dict[str, np.ndarray], peak: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where one step of each row sits on its type (:data:`_STEP_FEATURES`): ``step``,
    ``mem_step`` and ``ridge`` (``peak``: log peak FLOP/s)."""
    per_device = np.fmax(on.num("batch_size"), 1.0) / np.fmax(on.num("devices_per_trainer"),
                                                                1.0)
    flops, act = on.num("flops_per_sample"), activation_bytes(on)
    log_bw = np.log(specs["mem_bw_gb_per_s"] * 1e9)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.log(per_device * flops) - peak, np.log(per_device * act) - log_bw,
                np.log(flops / act) - (peak - log_bw))


def pair_matrix(jobs: Columns, hw_a: np.ndarray, hw_b: np.ndarray, catalog: Catalog,
                vocab: dict[str, list[str]], job: np.ndarray | None = None) -> np.ndarray:
    """Features (:data:`PAIR_FEATURES`) of each job moving from ``hw_a`` to ``hw_b``.

    Row ``i`` is job ``job[i]`` (a row of ``jobs``; default: row ``i``). Physics estimates
    are computed once per distinct (job, type) and job features once per job, then gathered:
    ranking one job over 20 types pairs it with every type its family ran on, and a day of
    training rows repeats a few thousand configurations. The rows are computed by the
    compiled kernel where it is built (:func:`native_kernels`).
    """
    return _pair_matrix(jobs, hw_a, hw_b, catalog, vocab, job,
                        native_kernels())


def _pair_matrix(jobs: Columns, hw_a: np.ndarray, hw_b: np.ndarray, catalog: Catalog,
                 vocab: dict[str, list[str]], job: np.ndarray | None,
                 native: ModuleType | None) -> np.ndarray:
    """:func:`pair_matrix` by the compiled kernels ``native``, or NumPy (None)."""
    n = len(hw_a)
    job = np.arange(n) if job is None else np.asarray(job, dtype=np.int64)
    hcode, names = factorize(np.concatenate([np.asarray(hw_a, dtype=object),
                                             np.asarray(hw_b, dtype=object)]))
    if native is not None:
        X = np.empty((n, len(PAIR_FEATURES)))
        native.pair_rows(*_job_inputs(native, jobs, vocab), *_type_inputs(names, catalog, vocab),
                         np.asarray(job, dtype=np.intp), np.asarray(hcode[:n], dtype=np.intp),
                         np.asarray(hcode[n:], dtype=np.intp), X)
        return X
    combo, inv = np.unique(np.concatenate([job, job]) * len(names) + hcode, return_inverse=True)
    on = jobs.take(combo // len(names)).with_hardware(np.asarray(names, dtype=object)[
        combo % len(names)])
    est, specs, peak = _phys_specs(on, catalog)
    ia, ib = inv[:n], inv[n:]
    f: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for k in _PHYS_DIFF:
            f[f"d_{k}"] = est[k][ib] - est[k][ia]
        for k in _PHYS_BOTH:
            f[f"a_{k}"], f[f"b_{k}"] = est[k][ia], est[k][ib]
        f["d_peak"], f["a_peak"] = peak[ib] - peak[ia], peak[ia]
        step, mem_step, ridge = _step_terms(on, specs, peak)
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
    vendor = vocab_codes(_vendors(names, catalog), vocab["vendor"])
    f["vendor_a"], f["vendor_b"] = vendor[hcode[:n]], vendor[hcode[n:]]
    f["precision"] = vocab_codes(jobs.obj("precision"), vocab["precision"])[job]
    f["model_category"] = vocab_codes(jobs.obj("model_category"), vocab["model_category"])[job]
    X = stack(f, PAIR_FEATURES, n)
    return np.where(np.isfinite(X), X, np.nan)


def log_shape(shape: np.ndarray) -> np.ndarray:
    """Log of ``(n, 3)`` shapes (:data:`SHAPE_COLUMNS`), a missing part (NaN, -1) read as 1."""
    return np.log(np.fmax(np.asarray(shape, dtype=np.float64), 1.0))


def shape_parts(shape: np.ndarray) -> np.ndarray:
    """``(n, 3)``: log trainers, log devices per trainer and log batch per device of ``(n, 3)``
    shapes (:data:`SHAPE_COLUMNS`; a missing part read as 1), the directions a shape moves in.

    >>> shape_parts(np.array([[2., 4., 64.]])).round(3).tolist()
    [[0.693, 1.386, 2.773]]
    """
    logs = log_shape(shape)
    return np.column_stack([logs[:, 0], logs[:, 1], logs[:, 2] - logs[:, 1]])


def within_reach(a_shape: np.ndarray, b_shape: np.ndarray, reach: np.ndarray) -> np.ndarray:
    """Whether each move from ``a_shape`` to ``b_shape`` (``(n, 3)`` shapes) is no longer in any
    direction of :func:`shape_parts` than ``reach`` (the longest the shape boosters learned).

    >>> within_reach(np.array([[1., 1., 8.], [1., 1., 8.]]), np.array([[1., 2., 16.],
    ...              [1., 1., 64.]]), np.array([1.0, 1.0, 1.0])).tolist()
    [True, False]
    """
    move = np.abs(shape_parts(b_shape) - shape_parts(a_shape))
    return (move <= np.asarray(reach)[None, :] + 1e-9).all(axis=1)


def shape_of(on: Columns) -> np.ndarray:
    """The ``(n, 3)`` shape of each row (:data:`SHAPE_COLUMNS`; NaN where missing): rows
    numbered by job parse it once a job."""
    return on.per_job("shape", lambda c: np.column_stack([c.num(x) for x in SHAPE_COLUMNS]))


def _shape_logs(on: Columns) -> dict[str, np.ndarray]:
    tc, dpt, bs = log_shape(shape_of(on)).T
    return {"log_trainers": tc, "log_devices_per_trainer": dpt, "log_batch": bs,
            "log_batch_per_device": bs - dpt}


def shape_matrix(jobs: Columns, a_shape: np.ndarray, catalog: Catalog,
                 vocab: dict[str, list[str]], job: np.ndarray | None = None) -> np.ndarray:
    """Features (:data:`SHAPE_FEATURES`) of each job moving from shape ``a_shape[i]``
    (trainers, devices per trainer, batch; -1 or NaN = missing) to its own shape on its own
    type; row ``i`` is job ``job[i]`` of ``jobs`` (default: row ``i``); by the compiled
    kernel where it is built (:func:`native_kernels`)."""
    return _shape_matrix(jobs, a_shape, catalog, vocab, job,
                         native_kernels())


def _shape_matrix(jobs: Columns, a_shape: np.ndarray, catalog: Catalog,
                  vocab: dict[str, list[str]], job: np.ndarray | None,
                  native: ModuleType | None) -> np.ndarray:
    """:func:`shape_matrix` by the compiled kernels ``native``, or NumPy (None)."""
    n = len(a_shape)
    job = np.arange(n) if job is None else np.asarray(job, dtype=np.int64)
    if native is not None:
        X = np.empty((n, len(SHAPE_FEATURES)))
        own, names = factorize(jobs.obj("hardware"))
        native.shape_rows(*_job_inputs(native, jobs, vocab), *_type_inputs(names, catalog, vocab),
                          np.asarray(own, dtype=np.intp), np.asarray(job, dtype=np.intp),
                          np.ascontiguousarray(a_shape, dtype=np.float64), X)
        return X
    on_b = jobs.take(job)
    a = np.where(np.asarray(a_shape, dtype=np.float64) > 0, a_shape, np.nan)
    # Shape A's rows, then the job's own (B): one pass of the physics for both.
    both = jobs.take(np.concatenate([job, job])).replace(
        {c: np.concatenate([a[:, i], on_b.num(c)]) for i, c in enumerate(SHAPE_COLUMNS)})
    est, specs, peak = _phys_specs(both, catalog)
    logs = _shape_logs(both)
    f: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for s, part in (("a", slice(0, n)), ("b", slice(n, 2 * n))):
            f.update({f"{s}_{k}": v[part] for k, v in logs.items()})
            f.update({f"{s}_{k}": est[k][part] for k in _SHAPE_PHYS})
        for k in (*_SHAPE_LOGS, *_SHAPE_PHYS[:3]):
            f[f"d_{k}"] = f[f"b_{k}"] - f[f"a_{k}"]
        hardware = on_b.obj("hardware")
        f["peak"] = peak[n:]
        for k in _SPECS:
            f[f"hw_{k}"] = np.log(specs[k][n:])
        for c in _SHAPE_JOB:
            f[f"log_{c}"] = np.log(on_b.num(c))
        step, mem_step, ridge = _step_terms(both, specs, peak)
        f["a_step"], f["b_step"] = step[:n], step[n:]
        f["a_mem_step"], f["b_mem_step"] = mem_step[:n], mem_step[n:]
        f["ridge"] = ridge[n:]
    for c in ("tensor_parallel", "pipeline_parallel", "num_layers"):
        f[c] = on_b.num(c)
    codes, names = factorize(hardware)
    f["vendor"] = vocab_codes(_vendors(names, catalog), vocab["vendor"])[codes]
    f["precision"] = vocab_codes(on_b.obj("precision"), vocab["precision"])
    f["model_category"] = vocab_codes(on_b.obj("model_category"), vocab["model_category"])
    X = stack(f, SHAPE_FEATURES, n)
    return np.where(np.isfinite(X), X, np.nan)


#: Set to 0 to compute a request's pair and shape rows with NumPy alone (the definition).
NATIVE_ENV = "LEAP_NATIVE"


@functools.cache
def native_kernels() -> ModuleType | None:
    """The compiled kernels of the pair and shape rows and row medians
    (:mod:`leap.features._native`), or None where the install built none, ``LEAP_NATIVE=0``
    is set, or they disagree with the NumPy code: laid out otherwise, or off by more than
    :data:`NATIVE_TOLERANCE` on :func:`_probe` (a compiler flag such as ``-ffast-math`` drops
    NaN checks).
    Checked once per process."""
    if _native is None or os.environ.get(NATIVE_ENV, "1") == "0":
        return None
    if (_native.PAIR_FEATURES, _native.SHAPE_FEATURES, _native.SPEC_COLUMNS) != (
            PAIR_FEATURES, SHAPE_FEATURES, SPEC_COLUMNS):
        log.warning("the compiled pair rows are laid out for another leap; NumPy computes "
                    "them (reinstall leap to rebuild them)")
        return None
    _native.set_constants(TRAIN_BYTES_PER_PARAM, ALLREDUCE_BYTES_PER_PARAM, ACTIVATION_BYTES)
    want, got = _probe(None), _probe(_native)
    if not all(native_agrees(w, g) for w, g in zip(want, got, strict=True)):
        log.warning("the compiled pair rows disagree with NumPy on a probe (was leap built "
                    "with unsafe math flags?); NumPy computes them")
        return None
    return _native


def _probe(native: ModuleType | None) -> tuple[np.ndarray, ...]:
    """Pair and shape rows of a few jobs on the default catalog's types, by ``native`` (None:
    NumPy): every precision, shapes with parts missing, a job without FLOPs; and the median
    and spread of each pair row's finite features."""
    catalog = Catalog.default()
    names = np.array(list(catalog), dtype=object)
    k = len(names)
    precisions = ["bf16", "fp32", "tf32", "fp16", None]
    jobs = Columns.concat([Columns.from_request(
        {"family_id": f"f{i}", "trainer_count": 1 + i % 3, "devices_per_trainer": 2 ** (i % 4),
         "batch_size": 16 * (i + 1), "precision": p, "model_category": "llm",
         "num_params": 1e8 * (i + 1), "flops_per_sample": None if i == 4 else 6e11 * (i + 1),
         "tensor_parallel": 1 + i % 2, "hidden_dim": 1024, "seq_len": 512 * (i % 2),
         "num_layers": 12}, [names[(3 * i) % k]]) for i, p in enumerate(precisions)])
    vocab = {"vendor": sorted({catalog[n].vendor for n in catalog}),
             "precision": ["bf16", "fp16", "fp32"], "model_category": ["llm"]}
    job = np.repeat(np.arange(len(jobs)), k)
    shapes = np.array([[2.0, 8.0, 64.0], [-1.0, 4.0, np.nan], [1.0, 1.0, 8.0]])
    pairs = _pair_matrix(jobs, names[np.tile(np.arange(k), len(jobs))],
                         names[np.tile(np.arange(k)[::-1], len(jobs))], catalog, vocab, job,
                         native)
    rows = np.repeat(np.arange(len(pairs)), pairs.shape[1])
    has, med, sd = _row_median(rows, pairs.ravel(), len(pairs) + 1, native)
    return (pairs, _shape_matrix(jobs, shapes[job % 3], catalog, vocab, job, native),
            has.astype(np.float64), med, sd)


def _job_inputs(native: ModuleType, jobs: Columns, vocab: dict[str, list[str]]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The job inputs of the compiled kernels, a row per row of ``jobs``: numbers, peak
    kind, vocabulary codes (rows numbered by job: computed once a job, then repeated)."""
    return (jobs.per_job("kernel numbers", lambda c: np.column_stack(
                [c.num(x) for x in native.JOB_COLUMNS])),
            jobs.per_job("peak kind", lambda c: np.array(
                [PEAK_KIND.get(p, 3) for p in c.obj("precision")], dtype=np.intp)),
            jobs.per_job(f"precision code {id(vocab)}", lambda c: vocab_codes(
                c.obj("precision"), vocab["precision"])),
            jobs.per_job(f"category code {id(vocab)}", lambda c: vocab_codes(
                c.obj("model_category"), vocab["model_category"])))


def _type_inputs(names: np.ndarray, catalog: Catalog, vocab: dict[str, list[str]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The type inputs of the compiled kernels: spec rows and vendor codes of ``names``."""
    pos = vocab_positions(vocab["vendor"])
    return (catalog.spec_matrix(names),
            np.array([pos.get(catalog[h].vendor, np.nan) for h in names], dtype=np.float64))


def shape_training_rows(attempts: pd.DataFrame, catalog: Catalog, *,
                        max_pairs: int = SHAPE_MAX_PAIRS, nearest: int = SHAPE_PAIR_NEAREST,
                        seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """``(jobs, shape A, targets)`` of each shape B one family ran on one type
    with each of the ``nearest`` other shapes A it ran there nearest to B (one row per
    ordered pair; ``jobs`` are shape B's columns, with ``hardware``).

    Serving carries a family's level on a type from the few shapes it ran there nearest to
    the job's own (:data:`SHAPE_NEAREST`), so the boosters learn those
    moves, not every pair: a family retuned often runs dozens of shapes on a type, and their
    every pair (24 million on the harder fleet's two weeks, where a seeded sample of 200,000
    was 0.8% of them) is mostly moves serving never makes. Distance is that of serving: the
    sum of absolute log differences of (trainers, devices per trainer, batch).

    ``attempts`` are succeeded attempts with a positive ``throughput``. Each (family, type,
    shape) group is its median log throughput over its physics estimate (the other job
    columns: the group's first row); weights are the square root of the smaller group's
    attempt count. Beyond ``max_pairs`` rows, a seeded sample. ``targets``' columns:
    ``r(B) - r(A)``, the weight, ``r(B)`` and shape B's group (rows of one group are one
    shape carried from its nearest others, as serving carries a job's).
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
    r = (groups["y"] - _phys_r(Columns.from_frame(groups), catalog)["log_phys_sps"]).to_numpy()
    shape = groups[list(SHAPE_COLUMNS)].to_numpy(dtype=np.float64)
    # Sorted by keys: each (family, type)'s shapes are one run of rows.
    run = groups.groupby(["family_id", "hardware"], sort=True).ngroup().to_numpy()
    b, a = nearest_in_runs(run, log_shape(shape), nearest)
    if len(b) > max_pairs:
        keep = np.sort(np.random.default_rng(seed).choice(len(b), max_pairs, replace=False))
        b, a = b[keep], a[keep]
    jobs = groups.iloc[b][[*cols, *SHAPE_COLUMNS, "hardware"]].reset_index(drop=True)
    n = groups["n"].to_numpy(dtype=np.float64)
    weight = np.sqrt(np.minimum(n[b], n[a]))
    return jobs, shape[a], np.column_stack([r[b] - r[a], weight, r[b], b])


def nearest_in_runs(run: np.ndarray, points: np.ndarray, k: int,
                    max_block: int = 2_000_000) -> tuple[np.ndarray, np.ndarray]:
    """``(b, a)``: each row ``b`` with the ``k`` other rows ``a`` of its run (equal values of
    the sorted ``run``) nearest to it by L1 distance of ``points`` (ties: the earlier row),
    grouped by ``b``. Runs are paired a block at a time, about ``max_block`` pairs each (a
    run of ``m`` rows has ``m (m - 1)``).

    >>> b, a = nearest_in_runs(np.array([0, 0, 0, 1]), np.array([[0.], [1.], [3.], [0.]]), 1)
    >>> list(zip(b.tolist(), a.tolist()))
    [(0, 1), (1, 0), (2, 1)]
    """
    first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    size = np.diff(np.r_[first, len(run)])
    cost = np.cumsum(size * (size - 1))
    out_b, out_a = [], []
    start = 0
    while start < len(first):
        # Whole runs up to about max_block pairs (at least one run).
        done = cost[start - 1] if start else 0
        stop = max(int(np.searchsorted(cost, done + max_block, side="right")), start + 1)
        lo = first[start]
        hi = first[stop] if stop < len(first) else len(run)
        a, b = ordered_pairs(run[lo:hi])
        a, b = a + lo, b + lo
        dist = np.abs(points[a] - points[b]).sum(axis=1)
        order = np.lexsort((a, dist, b))
        b, a = b[order], a[order]
        rank = np.arange(len(b)) - np.searchsorted(b, b, side="left")
        out_b.append(b[rank < k])
        out_a.append(a[rank < k])
        start = stop
    if not out_b:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(out_b), np.concatenate(out_a)


def ordered_pairs(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered pair ``(a, b)``, ``a != b``, of positions in one run of equal values of
    the sorted ``group``: row ``a`` meets each other row of its run.

    >>> a, b = ordered_pairs(np.array([0, 0, 1, 2, 2, 2]))
    >>> list(zip(a.tolist(), b.tolist()))[:4]
    [(0, 1), (1, 0), (3, 4), (3, 5)]
    """
    first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    size = np.diff(np.r_[first, len(group)])
    partners = np.repeat(size, size)
    a = np.repeat(np.arange(len(group)), partners)
    offset = np.arange(len(a)) - np.repeat(np.cumsum(partners) - partners, partners)
    b = np.repeat(np.repeat(first, size), partners) + offset
    return a[a != b], b[a != b]


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


def row_median(r: np.ndarray, est: np.ndarray, n_rows: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``n_rows``: whether it has estimates, their median and spread (``r``:
    each estimate's row, sorted; a few estimates a row). NaN estimates are left out, as by
    ``nanmedian`` and ``nanstd`` (written out: those cost a third of a millisecond on the
    handful of rows of one request).

    Examples
    --------
    >>> has, med, sd = row_median(np.array([0, 0, 0, 2]), np.array([3., 1., np.nan, 5.]), 3)
    >>> has.tolist(), med.tolist(), sd.tolist()
    ([True, False, True], [2.0, nan, 5.0], [1.0, nan, 0.0])

    The compiled kernel, where it is built (:func:`native_kernels`), computes the same
    values in one pass.
    """
    return _row_median(r, est, n_rows, native_kernels())


def _row_median(r: np.ndarray, est: np.ndarray, n_rows: int, native: ModuleType | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`row_median` by the compiled kernels ``native``, or NumPy (None)."""
    if native is not None:
        n = np.zeros(n_rows, dtype=np.intp)
        med, sd = np.empty(n_rows), np.empty(n_rows)
        native.row_median(np.ascontiguousarray(r, dtype=np.intp),
                          np.ascontiguousarray(est, dtype=np.float64), n, med, sd)
        return n > 0, med, sd
    ok = np.isfinite(est)
    r, est = r[ok], est[ok]
    n = np.bincount(r, minlength=n_rows)
    has = n > 0
    med, sd = np.full(n_rows, np.nan), np.full(n_rows, np.nan)
    if not has.any():
        return has, med, sd
    order = np.lexsort((est, r))
    srt = est[order]
    start = np.cumsum(n) - n
    h = np.flatnonzero(has)
    med[h] = 0.5 * (srt[start[h] + (n[h] - 1) // 2] + srt[start[h] + n[h] // 2])
    dev = est - (np.bincount(r, weights=est, minlength=n_rows) / np.maximum(n, 1))[r]
    sd[h] = np.sqrt(np.bincount(r, weights=dev * dev, minlength=n_rows)[h] / n[h])
    return has, med, sd


def row_mean(r: np.ndarray, est: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``n_rows``: whether it has estimates and their mean (``r``: each estimate's
    row; NaN estimates left out, as by :func:`row_median`).

    >>> has, mean = row_mean(np.array([0, 0, 2]), np.array([3., 1., np.nan]), 3)
    >>> has.tolist(), mean.tolist()
    ([True, False, False], [2.0, nan, nan])
    """
    ok = np.isfinite(est)
    n = np.bincount(r[ok], minlength=n_rows)
    has = n > 0
    mean = np.bincount(r[ok], weights=est[ok], minlength=n_rows) / np.maximum(n, 1)
    return has, np.where(has, mean, np.nan)
