"""Real-data evaluation: leak-free protocols on public measurements, baselines, LEAP's hook.

Four protocols, each run per source (units and harnesses differ between sources):

``held_out_cells``
    Predict a (model, hardware, devices, batch) cell from all other rows. Cells are dealt into
    ``n_folds`` folds (seeded); every table version and precision of a cell leaves together.
``unseen_hardware``
    Hold each accelerator type out entirely; predict all its rows.
``unseen_model``
    Hold each model out entirely.
``scaling``
    For each type with single-device rows, predict its multi-device rows from everything
    else: its own single-device rows plus other types' rows of any size.
``newest_types``
    What a user meets when a new generation arrives: hold out the source's newest types
    together (by release year, newest first, until at least :data:`NEWEST_MIN_TYPES` are
    out while two older types stay) and predict them from the older ones only.

A predictor is a :data:`FitPredict`: ``fn(train, test, catalog) -> predicted throughput`` per
test row, NaN where it has no estimate (reported as lost coverage). ``test`` never carries
the outcome columns (:data:`leap.datasets.OUTCOME_COLUMNS`). Accuracy is the share of
covered test rows within ±20%; ``accuracy_within_20pct_all`` counts uncovered rows as misses.

The learned predictor plugs in through :func:`learned_predictor` (the hook) or by passing
``predictors={"leap": fn, ...}`` to :func:`run_protocols`; :class:`AttemptsPredictor` adapts
a function of attempt tables (the store's format) to a :data:`FitPredict`.
"""

from __future__ import annotations

import functools
import html
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from leap import metrics
from leap.catalog import Catalog
from leap.datasets import (
    OUTCOME_COLUMNS,
    SOURCES,
    benchmark_catalog,
    data_checksum,
    load_hardware_specs,
    load_prices,
    to_attempts,
)
from leap.errors import ConfigError, ModelError, did_you_mean
from leap.eval.parallel import Parallel

#: ``fn(train_rows, test_rows_without_outcome, catalog) -> predicted whole-job throughput``.
FitPredict = Callable[[pd.DataFrame, pd.DataFrame, Catalog], np.ndarray]
#: ``fn(train_attempts, test_attempts, catalog) -> predicted throughput`` on attempt tables.
AttemptsFitPredict = Callable[[pa.Table, pa.Table, Catalog], np.ndarray]

PROTOCOLS: tuple[str, ...] = ("held_out_cells", "unseen_hardware", "unseen_model", "scaling",
                              "newest_types")
#: Types ``newest_types`` holds out at least (fewer when only two older types would stay).
NEWEST_MIN_TYPES = 3
TARGET = "throughput_samples_per_s"
#: A measurement cell: what ``held_out_cells`` holds out together.
CELL_KEY: tuple[str, ...] = ("source", "model", "hardware", "num_devices", "batch_size")
#: One benchmark configuration (the attempt mapping's family), hardware-independent.
CONFIG_KEY: tuple[str, ...] = ("source", "table", "model", "precision")
#: The name the learned predictor is registered under.
LEAP = "leap"


# Splits ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """One fold: positional row indices of one source's frame for training and testing."""

    protocol: str
    source: str
    fold: str
    train: np.ndarray
    test: np.ndarray


def _group_codes(df: pd.DataFrame, cols: Sequence[str]) -> np.ndarray:
    # Missing batch sizes / precisions form their own group rather than vanishing.
    return df.groupby(list(cols), dropna=False, sort=True).ngroup().to_numpy()


def newest_types(types: Sequence[str], catalog: Catalog) -> list[str]:
    """The types ``newest_types`` holds out: whole release years, newest first, until at
    least :data:`NEWEST_MIN_TYPES` are out, never leaving fewer than two older types.

    Examples
    --------
    >>> from leap.datasets import benchmark_catalog
    >>> newest_types(["K80", "P100", "V100-SXM2-16GB"], benchmark_catalog())
    ['V100-SXM2-16GB']
    """
    year = {h: catalog[h].year for h in types}
    held: list[str] = []
    for y in sorted(set(year.values()), reverse=True):
        more = held + sorted(h for h in types if year[h] == y)
        if len(types) - len(more) < 2:
            break
        held = more
        if len(held) >= NEWEST_MIN_TYPES:
            break
    return held


def make_splits(df: pd.DataFrame, protocol: str, *, n_folds: int = 10,
                seed: int = 0, catalog: Catalog | None = None) -> list[Split]:
    """The folds of ``protocol`` on ``df`` (rows of ONE source), deterministic for a seed.

    ``catalog`` gives the release years ``newest_types`` needs (default
    :func:`leap.datasets.benchmark_catalog`).

    Examples
    --------
    >>> from leap.datasets import load_throughput
    >>> df = load_throughput("gavel", include_flagged=False)
    >>> [s.fold for s in make_splits(df, "unseen_hardware")]
    ['K80', 'P100', 'V100-SXM2-16GB']
    """
    if protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol '{protocol}'{did_you_mean(protocol, PROTOCOLS)}; "
                          f"choose from {', '.join(PROTOCOLS)}")
    sources = df["source"].unique()
    if len(sources) > 1:
        raise ConfigError(f"make_splits takes one source at a time, got {sorted(sources)}")
    source = str(sources[0]) if len(sources) else ""
    idx = np.arange(len(df))
    out: list[Split] = []

    def add(fold: str, test: np.ndarray) -> None:
        if test.any() and (~test).any():
            out.append(Split(protocol, source, fold, idx[~test], idx[test]))

    if protocol == "held_out_cells":
        cells = _group_codes(df, CELL_KEY)
        n_cells = int(cells.max()) + 1 if len(cells) else 0
        k = max(1, min(n_folds, n_cells))
        order = np.random.default_rng(seed).permutation(n_cells)
        fold_of_cell = np.empty(n_cells, dtype=np.int64)
        fold_of_cell[order] = np.arange(n_cells) % k
        folds = fold_of_cell[cells]
        for f in range(k):
            add(f"fold{f}", folds == f)
    elif protocol in ("unseen_hardware", "unseen_model"):
        col = "hardware" if protocol == "unseen_hardware" else "model"
        values = df[col].to_numpy()
        for v in sorted(pd.unique(values)):
            add(str(v), values == v)
    elif protocol == "newest_types":
        hw = df["hardware"].to_numpy()
        held = newest_types(sorted(pd.unique(hw)), catalog or benchmark_catalog())
        add("newest: " + ", ".join(held), np.isin(hw, held))
    else:  # scaling
        hw = df["hardware"].to_numpy()
        multi = df["num_devices"].to_numpy() > 1
        single_hw = set(hw[~multi])
        for h in sorted(pd.unique(hw[multi])):
            if h in single_hw:
                add(str(h), (hw == h) & multi)
    return out


def _without_outcome(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in OUTCOME_COLUMNS if c in df.columns])


# Spec tables --------------------------------------------------------------------------------
def published_peaks() -> pd.DataFrame:
    """Per type: published dense 16-bit peak (TFLOP/s) and memory bandwidth (GB/s), NaN if none.

    The 16-bit peak is bf16 where supported, else the fp16 (tensor-core) peak, as in the
    catalog. Unlike :func:`leap.datasets.benchmark_catalog`, nothing here is an estimate.
    """
    return _published_peaks().copy()


@functools.lru_cache(maxsize=1)
def _published_peaks() -> pd.DataFrame:
    # Read once per process: every fold of every spec-ratio baseline needs it.
    s = load_hardware_specs()
    peak16 = s["peak_bf16_tflops"].where(s["peak_bf16_tflops"].notna(), s["peak_fp16_tflops"])
    return pd.DataFrame({"peak16_tflops": peak16.to_numpy(dtype=float),
                         "peak_fp32_tflops": s["peak_fp32_tflops"].to_numpy(dtype=float),
                         "mem_bw_gb_per_s": s["mem_bw_gbps"].to_numpy(dtype=float)},
                        index=pd.Index(s["hardware"], name="hardware"))


def catalog_peaks(catalog: Catalog, names: Sequence[str]) -> pd.DataFrame:
    """Like :func:`published_peaks` but from ``catalog`` (estimates included), for ``names``."""
    known = set(catalog.names)
    rows = [(catalog[n].peak_bf16_tflops, catalog[n].peak_fp32_tflops,
             catalog[n].mem_bw_gb_per_s) if n in known else (np.nan, np.nan, np.nan)
            for n in names]
    return pd.DataFrame(rows, columns=["peak16_tflops", "peak_fp32_tflops", "mem_bw_gb_per_s"],
                        index=pd.Index(list(names), name="hardware"), dtype=float)


# Baselines -----------------------------------------------------------------------------------
def _joint_codes(a: pd.DataFrame, b: pd.DataFrame,
                 cols: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Integer ids of the key ``cols``, shared by ``a`` and ``b`` (missing values match)."""
    both = pd.concat([a[list(cols)], b[list(cols)]], ignore_index=True)
    codes = both.groupby(list(cols), dropna=False, sort=False).ngroup().to_numpy()
    return codes[:len(a)], codes[len(a):]


def _batch(df: pd.DataFrame) -> np.ndarray:
    # -1 stands for "no batch size" so that two missing batches compare equal.
    return pd.to_numeric(df["batch_size"]).astype("Float64").fillna(-1.0).to_numpy(float)


def _median_by_code(train_codes: np.ndarray, values: np.ndarray,
                    test_codes: np.ndarray) -> np.ndarray:
    med = pd.Series(values).groupby(train_codes).median()
    return med.reindex(test_codes).to_numpy(dtype=float)


class LookupTable:
    """The previous system: median measured throughput of the exact configuration on the type.

    The key is (source, table, model, precision, hardware, num_devices, batch_size); a test
    row whose key never appears in training has no estimate.
    """

    KEY: tuple[str, ...] = ("source", "table", "model", "precision", "hardware", "num_devices",
                            "batch_size")

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        ctr, cte = _joint_codes(train, test, self.KEY)
        return _median_by_code(ctr, train[TARGET].to_numpy(float), cte)


class SpecRatio:
    """Peak-spec scaling: a known measurement of the same configuration on another type,
    scaled by the ratio of peak 16-bit FLOP/s and/or memory bandwidth.

    For a test row on type ``h``, the references are training rows of the same source, table,
    model, precision and device count on other types ``g`` (with the same per-device batch when
    any exists, if ``match_batch``). Each ``g`` gives ``median throughput(g) x ratio(h, g)``;
    the prediction is the median over ``g``.

    Parameters
    ----------
    ratio : {"geomean", "flops", "bandwidth", "bound"}
        ``geomean``: sqrt of the FLOP/s ratio times the bandwidth ratio. ``bound``: per model,
        the single ratio that predicts the training rows better, i.e. whichever resource the
        model is bound by (geomean when training cannot tell).
    specs : {"published", "catalog"}
        ``published``: only figures a source publishes (a type without one is not covered);
        ``catalog``: the catalog handed in, estimates included.
    match_batch : bool
        Prefer references with the test row's per-device batch size.
    nearest : bool
        Use only the reference type nearest in specs (log peak FLOP/s and log bandwidth)
        instead of the median over all references: "copy the nearest older type's figure
        times the spec ratio".
    """

    RATIOS = ("geomean", "flops", "bandwidth", "bound")

    def __init__(self, ratio: str = "geomean", *, specs: str = "published",
                 match_batch: bool = True, nearest: bool = False) -> None:
        if ratio not in self.RATIOS:
            raise ConfigError(f"unknown spec ratio '{ratio}'{did_you_mean(ratio, self.RATIOS)}")
        if specs not in ("published", "catalog"):
            raise ConfigError(f"specs must be 'published' or 'catalog', got '{specs}'")
        self.ratio = ratio
        self.specs = specs
        self.match_batch = match_batch
        self.nearest = nearest

    def _peaks(self, catalog: Catalog, names: Sequence[str]) -> pd.DataFrame:
        if self.specs == "catalog":
            return catalog_peaks(catalog, names)
        return _published_peaks().reindex(list(names))

    def _pairs(self, train: pd.DataFrame, test: pd.DataFrame,
               peaks: pd.DataFrame) -> pd.DataFrame:
        """(test row, reference type) pairs with the reference median and both ratios."""
        ctr, cte = _joint_codes(train, test, [*CONFIG_KEY, "num_devices"])
        tr = pd.DataFrame({"k": ctr, "g": train["hardware"].to_numpy(dtype=object),
                           "bs": _batch(train), "y": train[TARGET].to_numpy(float)})
        te = pd.DataFrame({"k": cte, "h": test["hardware"].to_numpy(dtype=object),
                           "bs_t": _batch(test), "_row": np.arange(len(test))})
        pairs = te.merge(tr, on="k", how="inner")
        pairs = pairs[pairs["g"] != pairs["h"]]
        if self.match_batch and len(pairs):
            same = pairs["bs"] == pairs["bs_t"]
            has_same = same.groupby(pairs["_row"]).transform("any")
            pairs = pairs[same | ~has_same]
        ref = pairs.groupby(["_row", "h", "g"], sort=False)["y"].median().reset_index()
        f = peaks["peak16_tflops"]
        b = peaks["mem_bw_gb_per_s"]
        ref["flops"] = ref["h"].map(f).to_numpy(float) / ref["g"].map(f).to_numpy(float)
        ref["bandwidth"] = ref["h"].map(b).to_numpy(float) / ref["g"].map(b).to_numpy(float)
        ref["geomean"] = np.sqrt(ref["flops"] * ref["bandwidth"])
        return ref

    def _bound_choice(self, train: pd.DataFrame, peaks: pd.DataFrame) -> dict[tuple[str, str],
                                                                              str]:
        """Per (source, model): the single ratio with the lower median |log error| in training."""
        ref = self._pairs(train, _without_outcome(train), peaks)
        if ref.empty:
            return {}
        rows = ref["_row"].to_numpy()
        actual = train[TARGET].to_numpy(float)[rows]
        y = ref["y"].to_numpy(float)
        # Zero throughputs ("did not run") give infinite errors; they are dropped below.
        with np.errstate(divide="ignore", invalid="ignore"):
            err = pd.DataFrame({
                "source": train["source"].to_numpy()[rows],
                "model": train["model"].to_numpy()[rows],
                "flops": np.abs(np.log(y * ref["flops"].to_numpy() / actual)),
                "bandwidth": np.abs(np.log(y * ref["bandwidth"].to_numpy() / actual)),
            })
        err = err.replace([np.inf, -np.inf], np.nan).dropna()
        med = err.groupby(["source", "model"])[["flops", "bandwidth"]].median()
        return {(str(s), str(m)): ("flops" if r.flops < r.bandwidth else "bandwidth")
                for (s, m), r in med.iterrows()}

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        names = sorted(set(train["hardware"]) | set(test["hardware"]))
        peaks = self._peaks(catalog, names)
        ref = self._pairs(train, test, peaks)
        if ref.empty:
            return np.full(len(test), np.nan)
        if self.ratio == "bound":
            choice = self._bound_choice(train, peaks)
            rows = ref["_row"].to_numpy()
            keys = zip(test["source"].to_numpy()[rows], test["model"].to_numpy()[rows],
                       strict=True)
            which = np.array([choice.get((str(s), str(m)), "geomean") for s, m in keys])
            r = np.select([which == "flops", which == "bandwidth"],
                          [ref["flops"].to_numpy(), ref["bandwidth"].to_numpy()],
                          ref["geomean"].to_numpy())
        else:
            r = ref[self.ratio].to_numpy()
        ref["est"] = ref["y"].to_numpy(float) * r
        ref = ref.dropna(subset=["est"])
        if self.nearest:
            dist = np.abs(np.log(ref["flops"].to_numpy(float))) \
                + np.abs(np.log(ref["bandwidth"].to_numpy(float)))
            ref = ref.assign(_d=dist).sort_values(["_row", "_d", "g"]) \
                .drop_duplicates("_row")
        est = ref.groupby("_row")["est"].median()
        out = np.full(len(test), np.nan)
        out[est.index.to_numpy(dtype=np.int64)] = est.to_numpy()
        return out


class NearestNeighbors:
    """k-nearest neighbours on log hardware specs and job shape, within the same model.

    Distance: standardised Euclidean over log(16-bit peak, fp32 peak, bandwidth, memory,
    devices, per-device batch), plus a large penalty for another model (so other models are
    used only for a model never seen) and a smaller one for another precision or table. Only
    the neighbours at the nearest penalty level vote. The prediction is the geometric mean of
    their per-device throughput times the test row's device count.

    Parameters
    ----------
    k : int
        Neighbours per prediction.
    """

    _MODEL_PENALTY = 1e6
    _CONFIG_PENALTY = 1e3

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ConfigError(f"k must be >= 1, got {k}")
        self.k = k

    @staticmethod
    def _features(df: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        names = df["hardware"].to_numpy()
        uniq, inv = np.unique(names, return_inverse=True)
        known = set(catalog.names)
        spec = np.array([[catalog[n].peak_bf16_tflops, catalog[n].peak_fp32_tflops,
                          catalog[n].mem_bw_gb_per_s, catalog[n].memory_gb] if n in known
                         else [np.nan] * 4 for n in uniq], dtype=float).reshape(-1, 4)[inv]
        devices = df["num_devices"].to_numpy(dtype=float)
        batch = pd.to_numeric(df["batch_size"]).astype("Float64").fillna(1.0).to_numpy(float)
        with np.errstate(divide="ignore"):  # a zero spec gives -inf: the row is skipped
            return np.log(np.column_stack([spec, devices, batch]))

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        xtr = self._features(train, catalog)
        xte = self._features(test, catalog)
        with np.errstate(divide="ignore"):  # "did not run" zeros give -inf: skipped below
            ytr = np.log(train[TARGET].to_numpy(float) / train["num_devices"].to_numpy(float))
        ok = np.isfinite(xtr).all(axis=1) & np.isfinite(ytr)
        xtr, ytr = xtr[ok], ytr[ok]
        out = np.full(len(test), np.nan)
        if not len(ytr):
            return out
        mu, sd = xtr.mean(axis=0), xtr.std(axis=0)
        sd[sd == 0] = 1.0
        xtr, xte = (xtr - mu) / sd, (xte - mu) / sd
        both = pd.concat([train.loc[ok, ["model", "precision", "table"]],
                          test[["model", "precision", "table"]]], ignore_index=True)
        codes = {c: pd.factorize(both[c].astype(object).fillna("\x00"))[0] for c in both}
        n_tr = len(ytr)
        k = min(self.k, n_tr)
        good = np.isfinite(xte).all(axis=1)
        for start in range(0, len(test), 1024):  # bounded memory: a 1024 x n_train block
            stop = min(start + 1024, len(test))
            sl = slice(start, stop)
            d = ((xte[sl, None, :] - xtr[None, :, :]) ** 2).sum(axis=2)
            d += self._MODEL_PENALTY * (codes["model"][n_tr + start:n_tr + stop, None]
                                        != codes["model"][None, :n_tr])
            for c in ("precision", "table"):
                d += self._CONFIG_PENALTY * (codes[c][n_tr + start:n_tr + stop, None]
                                             != codes[c][None, :n_tr])
            nearest = np.argpartition(d, k - 1, axis=1)[:, :k]
            dn = np.take_along_axis(d, nearest, axis=1)
            level = np.floor(dn / self._CONFIG_PENALTY)
            vote = level == level.min(axis=1, keepdims=True)
            yk = ytr[nearest]
            mean_log = (yk * vote).sum(axis=1) / vote.sum(axis=1)
            out[sl] = np.exp(mean_log) * test["num_devices"].to_numpy(float)[sl]
        out[~good] = np.nan
        return out


class LinearScaling:
    """Perfect data-parallel scaling: devices x the single-device throughput on the same type
    (same configuration and per-device batch). No estimate without such a measurement."""

    KEY: tuple[str, ...] = (*CONFIG_KEY, "hardware", "batch_size")

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        one = train[train["num_devices"] == 1]
        ctr, cte = _joint_codes(one, test, self.KEY)
        per_device = _median_by_code(ctr, one[TARGET].to_numpy(float), cte)
        return per_device * test["num_devices"].to_numpy(float)


def baseline_predictors() -> dict[str, FitPredict]:
    """Every baseline, by the name results use."""
    return {
        "lookup": LookupTable(),
        "spec_ratio_geomean": SpecRatio("geomean"),
        "spec_ratio_flops": SpecRatio("flops"),
        "spec_ratio_bandwidth": SpecRatio("bandwidth"),
        "spec_ratio_bound": SpecRatio("bound"),
        "spec_ratio_geomean_catalog": SpecRatio("geomean", specs="catalog"),
        "spec_ratio_nearest": SpecRatio("geomean", nearest=True),
        "knn": NearestNeighbors(k=5),
        "linear_scaling": LinearScaling(),
    }


# The learned predictor ------------------------------------------------------------------------
#: The as-of time of :class:`AttemptsPredictor`: test attempts sit here, training before it.
EVAL_DAY = datetime(2026, 1, 1, tzinfo=UTC)
#: Days before :data:`EVAL_DAY` the training attempts are spread over.
EVAL_HISTORY_DAYS = 28


@dataclass(frozen=True)
class AttemptsPredictor:
    """``fn(train_attempts, test_attempts, catalog)`` as a :data:`FitPredict`.

    Both tables follow :data:`leap.data.schema.ATTEMPTS_SCHEMA` (via
    :func:`leap.datasets.to_attempts`); the test table's ``throughput`` is null. The
    sources' snapshot dates span 2021-2025, which a 30-day training window would cut, so the
    training attempts are re-timed: each goes to one of the :data:`EVAL_HISTORY_DAYS` days
    before :data:`EVAL_DAY` (the day and time of day come from its attempt id, so they are
    deterministic). Nightly-style training that builds each row's history as of its own day
    then sees a growing share of the others, as in production; the test attempts sit at
    :data:`EVAL_DAY`, where a snapshot sees every training row and no test row. ``fn``
    returns whole-job samples/s per test attempt.

    A module-level ``fn`` makes the predictor picklable, so its folds can run on worker
    processes (``workers`` of :func:`run_real_data`).
    """

    fn: AttemptsFitPredict

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        tr = to_attempts(train)
        te = to_attempts(_without_outcome(test))
        col = tr.schema.get_field_index("submitted_at")
        kind = tr.schema.field("submitted_at").type
        stamps = tr.column("submitted_at").to_pandas()
        time_of_day = (stamps - stamps.dt.floor("D")).to_numpy()
        ids = tr.column("attempt_id").to_pylist()
        # attempt ids are "bench-" + hex digits of a hash: a deterministic, uniform day.
        days_back = np.array([1 + int(i[6:14], 16) % EVAL_HISTORY_DAYS for i in ids])
        when_tr = (np.datetime64(EVAL_DAY.replace(tzinfo=None), "us")
                   - days_back.astype("timedelta64[D]") + time_of_day)
        tr = tr.set_column(col, "submitted_at", pa.array(when_tr, type=pa.timestamp("us"))
                           .cast(kind))
        te = te.set_column(col, "submitted_at",
                           pa.array([EVAL_DAY] * te.num_rows, type=kind))
        return np.asarray(self.fn(tr, te, catalog), dtype=float)


def leap_train_and_predict(train: pa.Table, test: pa.Table, catalog: Catalog) -> np.ndarray:
    """Train leap's nightly model on ``train`` attempts; predict samples/s of ``test`` rows.

    The same code as ``leap train`` (:func:`leap.model.train.train_window`): history as of
    each training row's day, the one feature path, the median objective. The tables are
    small, so the single global model is used (a 13-way cascade over a few hundred rows
    would leave each specialist a handful).
    """
    from leap.model.train import TrainConfig, train_window

    frame = pd.concat([train.to_pandas(), test.to_pandas()], ignore_index=True)
    frame["submitted_at"] = pd.to_datetime(frame["submitted_at"], utc=True)
    frame = frame.sort_values(["submitted_at", "attempt_id"], kind="stable")
    cfg = TrainConfig(window_days=EVAL_HISTORY_DAYS, model_kind="global")
    wm = train_window(frame.reset_index(drop=True), catalog, EVAL_DAY, cfg)
    return wm.artifact.predict(test.to_pandas())


def learned_predictor() -> FitPredict | None:
    """The learned LEAP predictor as a :data:`FitPredict` (see :func:`leap_train_and_predict`).

    ``leap experiment real-data`` adds it to the baselines under the name :data:`LEAP`.
    """
    return AttemptsPredictor(leap_train_and_predict)


def default_predictors() -> dict[str, FitPredict]:
    """The baselines plus the learned predictor when :func:`learned_predictor` provides one."""
    preds = baseline_predictors()
    leap = learned_predictor()
    if leap is not None:
        preds[LEAP] = leap
    return preds


# Running ---------------------------------------------------------------------------------
def _score(pred: np.ndarray, actual: np.ndarray, folds: int) -> dict[str, float | int]:
    covered = np.isfinite(pred) & (pred > 0)
    p = np.where(covered, pred, np.nan)
    n = len(actual)
    return {
        "n": int(n),
        "n_covered": int(covered.sum()),
        "coverage": float(covered.mean()) if n else float("nan"),
        "accuracy_within_20pct": (metrics.accuracy(p[covered], actual[covered])
                                  if covered.any() else float("nan")),
        "accuracy_within_20pct_all": metrics.accuracy(p, actual) if n else float("nan"),
        "median_ape": metrics.median_ape(p, actual),
        "folds": int(folds),
    }


#: ``progress(done, total, label)``: called as folds finish.
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class _Fold:
    """One fit-and-predict: a predictor, its training rows and the test rows (no outcome)."""

    predictor: FitPredict
    train: pd.DataFrame
    test: pd.DataFrame
    catalog: Catalog
    where: str


def _fit_predict(fold: _Fold) -> np.ndarray:
    pred = np.asarray(fold.predictor(fold.train, fold.test, fold.catalog),
                      dtype=float).reshape(-1)
    if pred.shape != (len(fold.test),):
        raise ModelError(f"predictor returned {pred.shape[0]} values for {len(fold.test)} "
                         f"test rows ({fold.where})")
    return pred


def _picklable(obj: object) -> bool:
    """Whether ``obj`` can travel to a worker process (a lambda or closure cannot)."""
    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True


def held_out_predictions(frame: pd.DataFrame, predictors: Mapping[str, FitPredict],
                         protocol: str, catalog: Catalog, *, n_folds: int = 10, seed: int = 0,
                         parallel: Parallel | None = None, progress: Progress | None = None
                         ) -> dict[str, tuple[np.ndarray, int]]:
    """Every predictor's held-out prediction for each row of ``frame`` (one source).

    Returns ``{name: (prediction per row, folds)}``; a row no fold tests stays NaN. The
    folds of picklable predictors run on ``parallel`` (worker processes or Dask); the others
    (lambdas, closures) run in this process.
    """
    frame = frame.reset_index(drop=True)
    splits = make_splits(frame, protocol, n_folds=n_folds, seed=seed, catalog=catalog)
    remote = parallel is not None and parallel.backend != "serial"
    tasks: dict[bool, list[tuple[str, Split, _Fold]]] = {True: [], False: []}
    for name, predictor in predictors.items():
        where = remote and _picklable(predictor)
        for split in splits:
            fold = _Fold(predictor, frame.iloc[split.train].reset_index(drop=True),
                         _without_outcome(frame.iloc[split.test]).reset_index(drop=True),
                         catalog, f"{split.source}, {protocol}, fold {split.fold}")
            tasks[where].append((name, split, fold))
    out = {name: (np.full(len(frame), np.nan), len(splits)) for name in predictors}
    total, done = len(tasks[True]) + len(tasks[False]), 0
    for where, runner in ((True, parallel), (False, Parallel())):
        if not tasks[where] or runner is None:
            continue
        for i, pred in runner.map(_fit_predict, [t[2] for t in tasks[where]]):
            name, split, _ = tasks[where][i]
            out[name][0][split.test] = pred
            done += 1
            if progress is not None:
                progress(done, total, f"{split.source} {protocol} {name}")
    return out


def run_protocols(
    df: pd.DataFrame,
    predictors: Mapping[str, FitPredict],
    *,
    sources: Sequence[str] | None = None,
    protocols: Sequence[str] = PROTOCOLS,
    catalog: Catalog | None = None,
    n_folds: int = 10,
    seed: int = 0,
    parallel: Parallel | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Score every predictor on every protocol, per source.

    Parameters
    ----------
    df : pandas.DataFrame
        Rows of :func:`leap.datasets.load_throughput` (drop flagged rows first if wanted).
    predictors : mapping of str to FitPredict
        E.g. :func:`default_predictors`.
    sources : sequence of str, optional
        Sources to evaluate; all sources present in ``df`` by default.
    protocols : sequence of str
        A subset of :data:`PROTOCOLS`.
    catalog : Catalog, optional
        Hardware specs for the predictors; :func:`leap.datasets.benchmark_catalog` by default.
    n_folds, seed : int
        Folds of ``held_out_cells`` and the seed that deals cells into them.
    parallel : Parallel, optional
        Where the folds run (default: in this process, one after another).
    progress : callable, optional
        ``progress(done, total, label)`` as folds finish (per source and protocol).

    Returns
    -------
    dict
        ``{"results": {source: {protocol: {method: {n, n_covered, coverage,
        accuracy_within_20pct, accuracy_within_20pct_all, median_ape, folds}}}}, ...}``
        plus ``settings``.

    Examples
    --------
    >>> from leap.datasets import load_throughput
    >>> df = load_throughput("gavel", include_flagged=False)
    >>> out = run_protocols(df, {"knn": NearestNeighbors()}, protocols=["unseen_hardware"])
    >>> out["results"]["gavel"]["unseen_hardware"]["knn"]["coverage"]
    1.0
    """
    for p in protocols:
        if p not in PROTOCOLS:
            raise ConfigError(f"unknown protocol '{p}'{did_you_mean(p, PROTOCOLS)}; "
                              f"choose from {', '.join(PROTOCOLS)}")
    present = list(dict.fromkeys(df["source"]))
    chosen = list(sources) if sources is not None else present
    for s in chosen:
        if s not in present:
            raise ConfigError(f"source '{s}' has no rows here{did_you_mean(s, present)}; "
                              f"sources present: {', '.join(present)}")
    cat = catalog if catalog is not None else benchmark_catalog()
    results: dict[str, dict[str, dict[str, dict[str, float | int]]]] = {}
    for source in chosen:
        frame = df[df["source"] == source].reset_index(drop=True)
        actual = frame[TARGET].to_numpy(float)
        results[source] = {}
        for protocol in protocols:
            preds = held_out_predictions(frame, predictors, protocol, cat, n_folds=n_folds,
                                         seed=seed, parallel=parallel, progress=progress)
            tested = np.zeros(len(frame), dtype=bool)
            for split in make_splits(frame, protocol, n_folds=n_folds, seed=seed,
                                     catalog=cat):
                tested[split.test] = True
            results[source][protocol] = {
                name: _score(pred[tested], actual[tested], folds)
                for name, (pred, folds) in preds.items()}
    return {
        "settings": {"n_folds": n_folds, "seed": seed, "protocols": list(protocols),
                     "methods": list(predictors), "sources": chosen,
                     "catalog_fingerprint": cat.fingerprint()},
        "results": results,
    }


# The published reference figure ----------------------------------------------------------------
def reference_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The issue's reference set: unflagged Lambda PyTorch single-GPU rows, one per
    (table, model, precision, hardware): the median over batch sizes and systems.

    ``batch_size`` is the (rounded) median batch of the merged rows; the other columns a
    predictor may use (``num_nodes``, ``model_category``) are carried over.
    """
    lam = df[(df["source"] == "lambda_pytorch") & (df["num_devices"] == 1) & ~df["flagged"]]
    keys = [*CONFIG_KEY, "hardware"]
    grouped = lam.groupby(keys, dropna=False, sort=True)
    med = grouped.agg(**{TARGET: (TARGET, "median"),
                         "batch_size": ("batch_size", "median"),
                         "model_category": ("model_category", "first")}).reset_index()
    med["batch_size"] = med["batch_size"].round().astype("Int64")
    med["num_devices"] = 1
    med["num_nodes"] = pd.array([1] * len(med), dtype="Int64")
    return med


def reference_check(df: pd.DataFrame, catalog: Catalog | None = None,
                    predictors: Mapping[str, FitPredict] | None = None, *,
                    predictions: Mapping[str, tuple[np.ndarray, int]] | None = None,
                    parallel: Parallel | None = None) -> dict[str, Any]:
    """Reproduce the reference spec-ratio figures (~71% / 61% / 54% within ±20%).

    Hold each accelerator type out per (table, model, precision) of the Lambda PyTorch
    single-GPU rows and predict it by the median over the other types of spec-ratio
    estimates (published specs only, so a type without the figure is not covered).
    ``predictors`` (e.g. the learned one) are scored on the same rows, on all of them and
    on the rows the geometric-mean variant covers (``matched_geomean``). ``predictions``
    already made on :func:`reference_rows` (``unseen_hardware``) are reused, not refitted.
    """
    rows = reference_rows(df)
    cat = catalog if catalog is not None else benchmark_catalog()
    actual = rows[TARGET].to_numpy(float)
    out: dict[str, Any] = {"rows": len(rows), "expected": {
        "spec_ratio_geomean": 0.71, "spec_ratio_bandwidth": 0.61, "spec_ratio_flops": 0.54}}
    variants = reference_variants()
    # The variants are always computed here: a baseline of the same name (with batch
    # matching) is a different estimate.
    preds = {**_reference_predictions(rows, variants, cat, None, None),
             **_reference_predictions(rows, predictors or {}, cat, predictions, parallel)}
    covered = np.isfinite(preds["spec_ratio_geomean"][0])
    for name, (pred, folds) in preds.items():
        out[name] = _score(pred, actual, folds)
        if name not in variants:
            out[name]["matched_geomean"] = _score(pred[covered], actual[covered], folds)
    return out


def reference_variants() -> dict[str, FitPredict]:
    """The spec-ratio estimates of the reference figure (published specs, any batch size)."""
    return {f"spec_ratio_{ratio}": SpecRatio(ratio, match_batch=False)
            for ratio in ("geomean", "bandwidth", "flops")}


def _reference_predictions(rows: pd.DataFrame, predictors: Mapping[str, FitPredict],
                           catalog: Catalog,
                           predictions: Mapping[str, tuple[np.ndarray, int]] | None,
                           parallel: Parallel | None) -> dict[str, tuple[np.ndarray, int]]:
    """Each type held out of ``rows`` (``unseen_hardware``), reusing ``predictions``."""
    done = dict(predictions or {})
    missing = {n: p for n, p in predictors.items() if n not in done}
    if missing:
        done |= held_out_predictions(rows, missing, "unseen_hardware", catalog,
                                     parallel=parallel)
    return {n: done[n] for n in predictors}


# Ranking on real prices --------------------------------------------------------------------
@dataclass(frozen=True)
class CheapestType:
    """Not a prediction: ``1 / price``, so ranking by "value" picks the cheapest type."""

    price: Mapping[str, float]

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        return 1.0 / test["hardware"].map(self.price).to_numpy(float)


def ranking_check(df: pd.DataFrame, predictors: Mapping[str, FitPredict],
                  catalog: Catalog | None = None, *,
                  predictions: Mapping[str, tuple[np.ndarray, int]] | None = None,
                  parallel: Parallel | None = None) -> dict[str, Any]:
    """Do predictions pick the best-value type? Lambda PyTorch, one GPU, public prices.

    For each configuration (table, model, precision), the types with a public on-demand quote
    (:func:`leap.datasets.load_prices`, median) are ranked by measured samples per dollar
    (``throughput x 3600 / price``) and by predicted samples per dollar, each type's
    prediction made with that type held out (``unseen_hardware``, trained on every other type
    of the unflagged single-GPU rows). ``top1_agreement``: share of ranked configurations
    whose predicted best type is the measured best; ``value_regret``: ``1 - measured value of
    the predicted best / measured value of the best`` (0 = no loss), the best taken over
    every priced type. A configuration is ranked when at least two priced types have a
    prediction. ``predictions`` already made on :func:`reference_rows` are reused.
    """
    cat = catalog if catalog is not None else benchmark_catalog()
    rows = reference_rows(df)
    price = load_prices().set_index("hardware")["median_usd"]
    priced = rows["hardware"].isin(price.index).to_numpy()
    config = _group_codes(rows, CONFIG_KEY)
    measured = rows[TARGET].to_numpy(float) * 3600.0 / rows["hardware"].map(price).to_numpy(
        float)
    n_configs = int(pd.Series(config[priced]).value_counts().ge(2).sum())
    out: dict[str, Any] = {"configurations": n_configs, "methods": {}}
    # A yardstick that needs no prediction at all: rank by price alone (cheapest first).
    cheapest = {"cheapest_type": CheapestType(price.to_dict())}
    preds = _reference_predictions(rows, {**cheapest, **predictors}, cat, predictions, parallel)
    for name, (pred, _) in preds.items():
        value = pred * 3600.0 / rows["hardware"].map(price).to_numpy(float)
        frame = pd.DataFrame({"config": config, "measured": measured,
                              "predicted": np.where(value > 0, value, np.nan)})[priced]
        agree: list[bool] = []
        regret: list[float] = []
        # The measured best is over every priced type, so a type a method cannot predict
        # counts against it when it is the best one.
        for _, g in frame.groupby("config"):
            if g["predicted"].notna().sum() < 2:
                continue
            best = g["measured"].max()
            pick = g.loc[g["predicted"].idxmax(), "measured"]
            agree.append(bool(pick == best))
            regret.append(float(1.0 - pick / best))
        out["methods"][name] = {
            "ranked": len(agree),
            "top1_agreement": float(np.mean(agree)) if agree else float("nan"),
            "mean_value_regret": float(np.mean(regret)) if regret else float("nan"),
            "median_value_regret": float(np.median(regret)) if regret else float("nan"),
        }
    return out


# Reporting ----------------------------------------------------------------------------------
def run_real_data(df: pd.DataFrame, *, predictors: Mapping[str, FitPredict] | None = None,
                  sources: Sequence[str] | None = None, protocols: Sequence[str] = PROTOCOLS,
                  n_folds: int = 10, seed: int = 0, include_flagged: bool = False,
                  parallel: Parallel | None = None,
                  progress: Progress | None = None) -> dict[str, Any]:
    """The whole experiment as one JSON-ready dict.

    Protocols per source (:func:`run_protocols`) and, when Lambda PyTorch is among the
    sources, the reference spec-ratio check (:func:`reference_check`) and the ranking check
    on public prices (:func:`ranking_check`), plus data provenance and :func:`verdicts`.
    The folds run on ``parallel`` (default: this process); see :func:`held_out_predictions`.
    """
    preds = dict(predictors) if predictors is not None else default_predictors()
    data = df if include_flagged else df[~df["flagged"]].reset_index(drop=True)
    catalog = benchmark_catalog()
    out = run_protocols(data, preds, sources=sources, protocols=protocols, catalog=catalog,
                        n_folds=n_folds, seed=seed, parallel=parallel, progress=progress)
    used = out["settings"]["sources"]
    result: dict[str, Any] = {
        "experiment": "real-data",
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "data": {
            "checksum": data_checksum(),
            "rows": len(data),
            "include_flagged": include_flagged,
            "sources": {s: {"rows": int((data["source"] == s).sum()), "repo": SOURCES[s].repo,
                            "license": SOURCES[s].license,
                            "commits": sorted({t.commit for t in SOURCES[s].tables})}
                        for s in used},
        },
        **out,
    }
    if "lambda_pytorch" in used:
        learned = {LEAP: preds[LEAP]} if LEAP in preds else None
        # The lookup table and linear scaling never predict an unseen single-GPU type.
        ranked = {m: p for m, p in preds.items() if m not in ("lookup", "linear_scaling")}
        # Both checks hold each type out of the same rows: fit each method once for both.
        shared = held_out_predictions(reference_rows(df), ranked, "unseen_hardware", catalog,
                                      parallel=parallel, progress=progress)
        result["reference_check"] = reference_check(df, catalog, learned, predictions=shared)
        result["ranking_check"] = ranking_check(df, ranked, catalog, predictions=shared)
    result["verdicts"] = verdicts(result)
    return result


def verdicts(result: Mapping[str, Any]) -> list[str]:
    """Plain sentences comparing the learned predictor with the best baseline per cell."""
    lines: list[str] = []
    for source, by_protocol in result["results"].items():
        for protocol, by_method in by_protocol.items():
            if LEAP not in by_method:
                continue
            ours = by_method[LEAP]["accuracy_within_20pct_all"]
            base = {m: r["accuracy_within_20pct_all"] for m, r in by_method.items()
                    if m != LEAP and np.isfinite(r["accuracy_within_20pct_all"])}
            if not base:
                continue
            best = max(base, key=lambda m: base[m])
            word = ("beats" if ours > base[best] + 0.05 else
                    "does NOT clearly beat" if ours > base[best] else "is WORSE than")
            lines.append(f"{source} / {protocol}: leap {ours:.0%} {word} the best baseline "
                         f"{best} {base[best]:.0%} (within ±20%, uncovered rows count as misses)")
    ref = result.get("reference_check", {})
    if LEAP in ref:
        ours = ref[LEAP]["matched_geomean"]["accuracy_within_20pct"]
        theirs = ref["spec_ratio_geomean"]["accuracy_within_20pct"]
        word = ("beats" if ours > theirs + 0.05 else
                "does NOT clearly beat" if ours > theirs else "is WORSE than")
        lines.append(f"reference protocol (Lambda PyTorch, 1 GPU, type held out): leap "
                     f"{ours:.0%} {word} spec-ratio geomean {theirs:.0%} on the same "
                     f"{ref[LEAP]['matched_geomean']['n']} rows")
    return lines


def flat_results(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The nested results as rows: source, protocol, method and the scores."""
    return [{"source": s, "protocol": p, "method": m, **r}
            for s, by_p in result["results"].items() for p, by_m in by_p.items()
            for m, r in by_m.items()]


def html_section(result: Mapping[str, Any]) -> str:
    """An HTML ``<section>`` for the evaluation report: one table per source."""

    def pct(v: float) -> str:
        return "–" if not np.isfinite(v) else f"{v:.0%}"

    parts = ['<section id="real-data"><h2>Real measured throughput (public benchmarks)</h2>',
             f"<p>{html.escape(str(result['data']['rows']))} rows; data checksum "
             f"{html.escape(str(result['data']['checksum']))}. Accuracy = share within ±20% of "
             "the measurement on covered rows; MdAPE = median absolute percentage error.</p>"]
    for source, by_protocol in result["results"].items():
        meta = result["data"]["sources"].get(source, {})
        parts.append(f"<h3>{html.escape(source)}</h3><p>{html.escape(str(meta.get('repo', '')))}"
                     f" — licence: {html.escape(str(meta.get('license', '')))}</p>")
        parts.append("<table><thead><tr><th>protocol</th><th>method</th><th>n</th>"
                     "<th>coverage</th><th>within ±20%</th><th>MdAPE</th></tr></thead><tbody>")
        for protocol, by_method in by_protocol.items():
            for method, r in by_method.items():
                parts.append(
                    f"<tr><td>{html.escape(protocol)}</td><td>{html.escape(method)}</td>"
                    f"<td>{r['n']}</td><td>{pct(r['coverage'])}</td>"
                    f"<td>{pct(r['accuracy_within_20pct'])}</td><td>{pct(r['median_ape'])}</td>"
                    "</tr>")
        parts.append("</tbody></table>")
    ref = result.get("reference_check")
    if ref:
        parts.append("<h3>Reference check (Lambda PyTorch, 1 GPU, type held out)</h3><ul>")
        for name, expected in ref["expected"].items():
            got = ref[name]
            parts.append(f"<li>{html.escape(name)}: {pct(got['accuracy_within_20pct'])} "
                         f"(expected ~{expected:.0%}), MdAPE {pct(got['median_ape'])}, "
                         f"n={got['n']}</li>")
        parts.append("</ul>")
    ranking = result.get("ranking_check")
    if ranking:
        parts.append("<h3>Ranking on public prices (Lambda PyTorch, 1 GPU, type held out)</h3>"
                     f"<p>{ranking['configurations']} configurations.</p><table><thead><tr>"
                     "<th>method</th><th>ranked</th><th>top-1 agreement</th>"
                     "<th>mean value regret</th></tr></thead><tbody>")
        for method, r in ranking["methods"].items():
            parts.append(f"<tr><td>{html.escape(method)}</td><td>{r['ranked']}</td>"
                         f"<td>{pct(r['top1_agreement'])}</td>"
                         f"<td>{pct(r['mean_value_regret'])}</td></tr>")
        parts.append("</tbody></table>")
    if result.get("verdicts"):
        parts.append("<ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in result["verdicts"])
                     + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)
