"""The one feature path: (jobs, candidate hardware, snapshot) -> model rows, for train and serve.

Training calls :func:`encode` on past attempts (their outcome columns are simply not read);
serving calls it on job requests. A job needs only launch-time columns
(:data:`leap.data.schema.JOB_COLUMNS` plus the candidate ``hardware``); every optional
architecture column may be absent and becomes a missing value.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from leap.catalog import Catalog
from leap.data.schema import ALL_COLUMNS, JOB_COLUMNS, PRECISIONS
from leap.errors import ArtifactError, DataError
from leap.features.columns import (
    CACHED_ROWS,
    SMALL,
    Columns,
    factorize,
    nan_to,
    stack,
    vocab_codes,
)
from leap.features.history import LEVELS, Snapshot, shape_keys
from leap.features.physics import estimates, hardware_specs
from leap.features.transfer import TRANSFER_FEATURES
from leap.threads import map_in_order

FEATURE_VERSION = 18

#: Rows :func:`encode` computes at a time (the result is the same for any block size); a
#: block's columns keep what they read (:data:`~leap.features.columns.CACHED_ROWS`).
ENCODE_CHUNK_ROWS = CACHED_ROWS
#: Distinct rows from which :func:`encode` with ``threads`` >= 2 deals them into that many
#: blocks, computed at once (much of a block's work is NumPy on whole arrays, which releases
#: the GIL); below it, one block.
THREADED_MIN_ROWS = 8_192
#: What a row's features are a function of: rows equal in these are encoded once.
DISTINCT_KEY: tuple[str, ...] = (*JOB_COLUMNS, "hardware")
#: Columns a serving request must be able to supply (everything else is optional).
REQUEST_COLUMNS: tuple[str, ...] = ("family_id", "model_type", "trainer_count", "batch_size",
                                    "hardware")

_LOG_JOB = ("trainer_count", "batch_size", "num_params", "flops_per_sample",
            "embedding_params", "hidden_dim", "seq_len")
_RAW_JOB = ("devices_per_trainer", "num_layers", "num_dense_features", "num_sparse_features",
            "data_parallel", "tensor_parallel", "pipeline_parallel")
_HW = ("year", "devices_per_host", "peak_bf16_tflops", "peak_fp32_tflops", "memory_gb",
       "mem_bw_gb_per_s", "intra_node_bw_gb_per_s", "inter_node_bw_gbit_per_s")
_PHYS = ("log_compute_sps", "log_weight_stream_sps", "log_comm_s", "comm_to_compute",
         "mem_fit", "log_phys_sps", "log_devices")
CATEGORICAL: tuple[str, ...] = ("hardware", "vendor", "precision", "model_category")
#: The accelerator's specification columns (what the no-specs ablation drops).
HARDWARE_SPEC_FEATURES: tuple[str, ...] = _HW

# Residual estimates in order of specificity: the first one with history gives `hist_est`.
# "xfer_s" is the family's level in the shapes it ran on this type, carried to this shape by
# the pair model's shape boosters; "xfer" is the family's level on the types it ran on,
# carried to this one (:mod:`leap.features.transfer`): by the pair model where the snapshot
# has one, else by the transfer tables.
_RESIDUAL_PRIORITY = ("fam_hw_shape", "xfer_s", "fam_hw_tc", "fam_hw", "xfer", "fam_shape",
                      "fam_vendor", "fam", "mt_hw", "mt")
#: The family's levels on the row's own type over other shapes. Where the pair model has
#: shape boosters and none of the family's shapes on the type is within their reach of the
#: job's (so ``xfer_s`` is missing: :func:`leap.features.pair_rows.within_reach`), these stand
#: for shapes too far off, and ``hist_est`` starts from ``xfer``, the family's level at this
#: shape on the types that ran it, instead. Public Sia's multi-device scaling (each type's
#: multi-device rows held out, its single-device rows kept): the family's single-device level
#: on the type overshot its 2-64-device figures (predicted / measured median 1.45x), and
#: 24.0% of the rows were within +-20%, 31.0% with this (FLOP/s ratio 38.5%); Lambda
#: PyTorch's scaling 79.0 -> 79.4%; the default fleet's nightly model is bit-identical (no
#: such rows).
_SHAPE_BOUND_LEVELS = ("fam_hw_tc", "fam_hw")
#: How many attempts of a configuration's own the family's other shapes on the type, carried
#: to it (``xfer_s_r``), count as in its ``hist_est``. A configuration run once or twice has
#: a noisy median: on the harder fleet's held-out day (``leap simulate --scenario novel``,
#: 2,730 attempts of configurations seen before, scored against the simulator's truth) the
#: blend was within +-20% for 90.7 / 90.9 / 91.0 / 90.8 / 90.2% of them at 0.5 / 1 / 2 / 4 /
#: 8 attempts' worth, the configuration's median alone 89.1% and the shapes carried alone
#: 87.8%.
SHAPE_BLEND_ATTEMPTS = 2.0
#: Novelty groups of a (job, type) row, judged on the history before it (spec.md 5b).
NOVELTY_GROUPS: tuple[str, ...] = ("seen_config", "seen_pair_new_shape", "unobserved_pair_1",
                                   "unobserved_pair_2", "unobserved_pair_3plus", "new_family")


def _history_names() -> list[str]:
    return [s for lv in LEVELS for s in lv.stats]


FEATURE_NAMES: tuple[str, ...] = (
    *[f"log_{c}" for c in _LOG_JOB], *_RAW_JOB, *CATEGORICAL, *_HW, *_PHYS,
    *_history_names(), *TRANSFER_FEATURES, "xfer_est", "xfer_g_est", "xfer_p_est",
    "has_family_history",
    "hist_level",
    "hist_est",
)


@dataclass(frozen=True)
class FeatureSpec:
    """What the model was trained on: feature names and categorical vocabularies.

    Categorical values unseen at training time encode as missing (NaN), never as a new code.
    """

    names: tuple[str, ...] = FEATURE_NAMES
    vocab: dict[str, list[str]] = field(default_factory=dict)
    version: int = FEATURE_VERSION

    @property
    def categorical(self) -> list[str]:
        return [c for c in CATEGORICAL if c in self.names]

    def from_full(self, X: Any) -> Any:
        """This spec's columns of rows that hold every feature (:data:`FEATURE_NAMES`, e.g.
        ``encode`` with the full spec; NumPy or Dask); ``X`` itself, not a copy, when the
        spec reads every column in order (a 100,000-row copy costs 0.1 s)."""
        if self.names == FEATURE_NAMES:
            return X
        return X[:, [FEATURE_NAMES.index(n) for n in self.names]]

    @classmethod
    def fit(cls, jobs: pd.DataFrame, catalog: Catalog) -> FeatureSpec:
        """Vocabularies: hardware and vendor from the catalog, precision from the schema,
        model categories from the training rows (so consecutive windows share one spec)."""
        vocab = {
            "hardware": sorted(catalog),
            "vendor": sorted({catalog[n].vendor for n in catalog}),
            "precision": list(PRECISIONS),
            "model_category": _levels(jobs, "model_category"),
        }
        return cls(vocab=vocab)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FeatureSpec:
        try:
            d = json.loads(text)
            spec = cls(names=tuple(d["names"]), vocab=d["vocab"], version=int(d["version"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"feature spec is unreadable: {exc}") from None
        if spec.version != FEATURE_VERSION:
            raise ArtifactError(f"feature spec version {spec.version} does not match this leap "
                                f"(feature version {FEATURE_VERSION}); retrain the model")
        unknown = set(spec.names) - set(FEATURE_NAMES)
        if unknown:
            raise ArtifactError(f"the model uses features this leap cannot compute: "
                                f"{sorted(unknown)}; retrain the model")
        return spec


def _levels(jobs: pd.DataFrame, col: str) -> list[str]:
    if col not in jobs.columns:
        return []
    return sorted(str(v) for v in jobs[col].dropna().unique())


def jobs_frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Job requests (dicts of launch-time fields) as a frame typed exactly like stored attempts.

    Fields outside :data:`~leap.data.schema.JOB_COLUMNS` (and ``hardware``) are ignored, so an
    outcome that a caller sends by mistake can never reach the features.
    """
    return values_frame(job_values(records))


def job_values(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Each launch-time field (and ``hardware``) some record has: the records' values, in
    order (None where a record lacks it)."""
    wanted = [c for c in ALL_COLUMNS if c in JOB_COLUMNS or c == "hardware"]
    return {c: [r.get(c) for r in records] for c in wanted if any(c in r for r in records)}


def values_frame(values: Mapping[str, Sequence[Any]]) -> pd.DataFrame:
    """:func:`job_values` as a frame typed exactly like stored attempts."""
    schema = pa.schema([(c, ALL_COLUMNS[c]) for c in values])
    try:  # by column: 5,000 jobs in 15 ms, against 36 by row
        table = pa.Table.from_pydict(dict(values), schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"job fields have the wrong type: {exc}") from None
    return table.to_pandas()


def check_request_columns(jobs: Columns | pd.DataFrame) -> None:
    present = jobs.columns if isinstance(jobs, pd.DataFrame) else jobs
    missing = [c for c in REQUEST_COLUMNS if c not in present]
    if missing:
        raise DataError(f"job rows lack required column(s) {', '.join(missing)}")


def encode(jobs: Columns | pd.DataFrame, snapshot: Snapshot, catalog: Catalog,
           spec: FeatureSpec, dtype: type[np.floating[Any]] = np.float64,
           threads: int = 1) -> np.ndarray:
    """Model rows for ``jobs`` (one row each, on the hardware in its ``hardware`` column).

    Parameters
    ----------
    jobs : Columns or DataFrame
        Launch-time job columns plus ``hardware``; outcome columns, if any, are ignored.
    snapshot : Snapshot
        History as of the prediction time.
    catalog : Catalog
        Must contain every ``hardware`` value.
    spec : FeatureSpec
        Feature names and vocabularies of the model.
    dtype : float type
        Of the result (training keeps its matrix in float32).
    threads : int
        Blocks computed at once, from :data:`THREADED_MIN_ROWS` distinct rows (the result is
        the same; each block in flight holds its own intermediates).

    Returns
    -------
    ndarray of ``dtype``, shape (len(jobs), len(spec.names)); NaN is a missing value.

    Every row depends only on its own columns and the snapshot, so rows equal in
    :data:`DISTINCT_KEY` are encoded once (a day of the default fleet has about half as many
    distinct rows as attempts, four times that fleet about a quarter), and many rows are
    encoded :data:`ENCODE_CHUNK_ROWS` at a time into the one result: the per-row
    intermediates (a row by every type, for the transfer features) stay a few hundred
    megabytes on a large fleet's day instead of growing with it.

    Examples
    --------
    Not run here (it needs a workspace)::

        X = encode(Columns.from_request(job, ["H100-SXM", "T4"]), art.snapshot, cat, spec)
    """
    check_request_columns(jobs)
    cols_in = jobs if isinstance(jobs, Columns) else Columns.from_frame(jobs)
    if len(cols_in) > SMALL:
        # A row's features depend only on its launch-time columns: each distinct one is
        # encoded once (a day of a fleet's attempts repeats most of its configurations),
        # and what depends on its job alone once a job (rows of many types a job, as a
        # batch prediction's).
        cols_in = cols_in.by_job()
        row, first = cols_in.codes(DISTINCT_KEY)
        if len(first) < len(cols_in):
            return _encode_blocks(cols_in.take(first), snapshot, catalog, spec, dtype,
                                  threads)[row]
    return _encode_blocks(cols_in, snapshot, catalog, spec, dtype, threads)


def _encode_blocks(cols_in: Columns, snapshot: Snapshot, catalog: Catalog, spec: FeatureSpec,
                   dtype: type[np.floating[Any]], threads: int) -> np.ndarray:
    """:func:`encode` of every row of ``cols_in``, :data:`ENCODE_CHUNK_ROWS` at a time, or in
    ``threads`` blocks or more at once from :data:`THREADED_MIN_ROWS` rows."""
    n = len(cols_in)
    size = ENCODE_CHUNK_ROWS if threads < 2 or n < THREADED_MIN_ROWS else \
        min(ENCODE_CHUNK_ROWS, -(-n // threads))
    if n <= size:
        return _encode_rows(cols_in, snapshot, catalog, spec).astype(dtype, copy=False)
    out = np.empty((n, len(spec.names)), dtype=dtype)
    starts = range(0, n, size)

    def block(start: int) -> np.ndarray:
        return _encode_rows(cols_in.take(np.arange(start, min(start + size, n))), snapshot,
                            catalog, spec)

    for start, X in zip(starts, map_in_order(block, starts, threads), strict=True):
        out[start:start + len(X)] = X
    return out


def _encode_rows(cols_in: Columns, snapshot: Snapshot, catalog: Catalog,
                 spec: FeatureSpec) -> np.ndarray:
    """:func:`encode` of one block of rows (float64)."""
    n = len(cols_in)
    cols: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in _LOG_JOB:
            v = np.log(cols_in.num(c))
            cols[f"log_{c}"] = np.where(np.isfinite(v), v, np.nan)
    for c in _RAW_JOB:
        cols[c] = cols_in.num(c)
    hardware = cols_in.obj("hardware")
    specs = hardware_specs(catalog, hardware)
    cols.update({c: specs[c] for c in _HW})
    hw_codes, hw_names = factorize(hardware)
    vendors = np.array([catalog[name].vendor for name in hw_names], dtype=object)
    vendor = vendors[hw_codes]
    cols["hardware"] = vocab_codes(hw_names, spec.vocab.get("hardware", []))[hw_codes]
    cols["vendor"] = vocab_codes(vendors, spec.vocab.get("vendor", []))[hw_codes]
    for c in ("precision", "model_category"):
        cols[c] = vocab_codes(cols_in.obj(c), spec.vocab.get(c, []))
    phys = estimates(cols_in, catalog)
    cols.update(phys)

    # History keys as Python strings (NumPy's own strings are made and hashed anew at each
    # lookup: a request's eight levels took 71 us against 47); trainer_count as a whole
    # number so 4 and 4.0 find the same key.
    keys = {"family_id": cols_in.text("family_id"), "model_type": cols_in.text("model_type"),
            "hardware": hardware, "vendor": vendor,
            "trainer_count": cols_in.num("trainer_count").astype(np.int64).astype(str)
            .astype(object),
            "shape": shape_keys(cols_in)}
    jobs = cols_in.job_groups()
    for lv in LEVELS:
        block = snapshot.lookup(keys, lv, jobs)
        for j, name in enumerate(lv.stats):
            cols[name] = block[:, j]
    keys["model_category"] = cols_in.text("model_category")
    keys["precision"] = cols_in.text("precision")
    phys0 = nan_to(phys["log_phys_sps"])  # finite or NaN: no infinities
    cols.update(snapshot.transfer.features(keys, hardware, catalog, phys0, cols_in))
    best = np.full(n, np.nan)
    level_used = np.full(n, float(len(_RESIDUAL_PRIORITY)))
    carried = {"xfer_s": cols["xfer_s_r"],
               "xfer": np.where(np.isfinite(cols["xfer_p_r"]), cols["xfer_p_r"], cols["xfer_r"])}
    # With shape boosters, a missing ``xfer_s`` is no shape of the family on this type within
    # their reach, nor one it moved to the job's on another type (its own shape there ranks
    # first and is taken before these levels).
    far = np.isnan(carried["xfer_s"]) \
        if snapshot.pairs is not None and snapshot.pairs.shape_boosters else None
    for rank, name in enumerate(_RESIDUAL_PRIORITY):
        r = carried[name] if name in carried else cols[f"{name}_med_r"]
        take = np.isnan(best) & np.isfinite(r)
        if far is not None and name in _SHAPE_BOUND_LEVELS:
            take &= ~far
        best[take] = r[take]
        level_used[take] = rank
    # The configuration's own median, from its n attempts, weighed against the family's
    # nearest other shapes there carried to it, as SHAPE_BLEND_ATTEMPTS attempts' worth.
    own, n_own = cols["fam_hw_shape_med_r"], cols["fam_hw_shape_n"]
    both = np.isfinite(own) & np.isfinite(carried["xfer_s"])
    best[both] = (n_own[both] * own[both] + SHAPE_BLEND_ATTEMPTS * carried["xfer_s"][both]) \
        / (n_own[both] + SHAPE_BLEND_ATTEMPTS)
    cols["xfer_est"] = phys0 + cols["xfer_r"]
    cols["xfer_g_est"] = phys0 + cols["xfer_g_r"]
    cols["xfer_p_est"] = phys0 + cols["xfer_p_r"]
    cols["has_family_history"] = np.isfinite(cols["fam_n"]).astype(np.float64)
    cols["hist_level"] = level_used
    cols["hist_est"] = phys0 + best
    return stack(cols, spec.names, n)


def base_margin(X: np.ndarray, spec: FeatureSpec, fallback: float) -> np.ndarray:
    """The boosting start point for each row: the history-adjusted physics estimate.

    Falls back to the physics estimate alone (always, for a model without history
    features), then to ``fallback`` (the training median of
    log throughput) where neither exists; the trees learn the correction on top, so the
    prediction is still log throughput.
    """
    names = list(spec.names)
    phys = X[:, names.index("log_phys_sps")]
    start = np.where(np.isfinite(phys), phys, fallback)
    if "hist_est" not in names:  # a model trained without history features
        return start
    est = X[:, names.index("hist_est")]
    return np.where(np.isfinite(est), est, start)


def new_vendor(X: np.ndarray, names: Sequence[str]) -> np.ndarray | None:
    """Whether each encoded row's family has history, but none on its type's vendor (the
    interval cells of :mod:`leap.model.intervals`); None for an encoding without the
    family-history columns (a model trained without history features).

    Examples
    --------
    >>> X = np.array([[4.0, 2.0], [4.0, np.nan], [np.nan, np.nan]])
    >>> new_vendor(X, ["fam_n", "fam_vendor_n"]).tolist()
    [False, True, False]
    """
    pos = feature_positions(tuple(names))
    if "fam_n" not in pos or "fam_vendor_n" not in pos:
        return None
    return np.isfinite(X[:, pos["fam_n"]]) & np.isnan(X[:, pos["fam_vendor_n"]])


def new_trainer_count(X: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Whether each encoded row (columns ``names``) is at a trainer count its family never ran
    on a type it did run on: family x type history (``fam_hw_n``), none at the row's trainer
    count (``fam_hw_tc_n``). All False where the columns are not encoded.

    On the default fleet's held-out day (2026-01-31), 398 such attempts were within +-20%
    for 74.6% under the trees' correction and 78.1% under the base margin alone; on the
    harder fleet's, 2,359 of them, 68.2% and 67.3%; Sia's multi-device scaling (a type's
    multi-device rows held out beside its single-device ones), 33.6% under the trees and
    37.5% with these rows by the base margin alone (session 44): whether to serve the base
    margin alone is judged on each window.

    >>> new_trainer_count(np.array([[3.0, np.nan], [3.0, 2.0], [np.nan, np.nan]]),
    ...                   ["fam_hw_n", "fam_hw_tc_n"]).tolist()
    [True, False, False]
    """
    pos = feature_positions(tuple(names))
    if "fam_hw_n" not in pos or "fam_hw_tc_n" not in pos:
        return np.zeros(len(X), dtype=bool)
    return (X[:, pos["fam_hw_n"]] > 0) & ~(X[:, pos["fam_hw_tc_n"]] > 0)  # NaN: False


def novelty(X: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Index into :data:`NOVELTY_GROUPS` of each encoded row (its history as of the snapshot).

    Examples
    --------
    >>> names = ["fam_hw_shape_n", "fam_hw_n", "fam_n", "xfer_n_types"]
    >>> nan = float("nan")
    >>> X = np.array([[3, 5, 9, 2], [nan, 5, 9, 2], [nan, nan, 9, 2], [nan, nan, nan, 0]])
    >>> [NOVELTY_GROUPS[g] for g in novelty(X, names)]
    ['seen_config', 'seen_pair_new_shape', 'unobserved_pair_2', 'new_family']
    """
    pos = feature_positions(tuple(names))
    config, pair, fam = (np.isfinite(X[:, pos[c]]) for c in ("fam_hw_shape_n", "fam_hw_n",
                                                             "fam_n"))
    # Other types the family ran on, as 1, 2 or 3+ (none or missing counts as 1): what
    # np.clip(np.nan_to_num(n), 1, 3) gives, at a fifth of its cost on a request's rows.
    n = X[:, pos["xfer_n_types"]]
    types = np.where(n >= 3, 3, np.where(n >= 2, 2, 1))
    return np.where(config, 0, np.where(pair, 1, np.where(fam, 1 + types, 5)))


@functools.lru_cache(maxsize=16)
def feature_positions(names: tuple[str, ...]) -> dict[str, int]:
    """Column index of each feature name (read-only use: the dict is shared).

    >>> feature_positions(("a", "b"))["b"]
    1
    """
    return {n: i for i, n in enumerate(names)}
