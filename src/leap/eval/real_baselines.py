"""The real-data baselines: lookup table, peak-spec scaling, k-NN and linear scaling, each a
:data:`~leap.eval.real_splits.FitPredict` on benchmark rows."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.datasets import load_hardware_specs, to_attempts
from leap.errors import ConfigError, did_you_mean
from leap.eval.baselines import LOOKUP_KEY, LookupTable
from leap.eval.real_splits import CONFIG_KEY, TARGET, FitPredict, RowPredictor, without_outcome


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
def joint_codes(a: pd.DataFrame, b: pd.DataFrame,
                 cols: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Integer ids of the key ``cols``, shared by ``a`` and ``b`` (missing values match)."""
    both = pd.concat([a[list(cols)], b[list(cols)]], ignore_index=True)
    codes = both.groupby(list(cols), dropna=False, sort=False).ngroup().to_numpy()
    return codes[:len(a)], codes[len(a):]


def _batch(df: pd.DataFrame) -> np.ndarray:
    # -1 stands for "no batch size" so that two missing batches compare equal.
    return pd.to_numeric(df["batch_size"]).astype("Float64").fillna(-1.0).to_numpy(float)


def median_by_code(train_codes: np.ndarray, values: np.ndarray,
                    test_codes: np.ndarray) -> np.ndarray:
    med = pd.Series(values).groupby(train_codes).median()
    return med.reindex(test_codes).to_numpy(dtype=float)


class BenchmarkLookup(RowPredictor):
    """The previous system on benchmark rows: :class:`leap.eval.baselines.LookupTable` (the
    one lookup table) over the rows' attempts (:func:`leap.datasets.to_attempts`).

    Its key is the attempt key plus ``devices_per_trainer``, which a benchmark family varies:
    together the same configuration as a row's (source, table, model, precision, hardware,
    num_devices, batch_size). A test row whose key never appears in training has no estimate.
    """

    KEY: tuple[str, ...] = (*LOOKUP_KEY, "devices_per_trainer")

    def _predict(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        past = to_attempts(train, architecture=False).to_pandas()
        jobs = to_attempts(test, architecture=False).to_pandas()
        return LookupTable(keys=self.KEY).fit(past, catalog).predict(jobs)


class SpecRatio(RowPredictor):
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
        ctr, cte = joint_codes(train, test, [*CONFIG_KEY, "num_devices"])
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
        ref = self._pairs(train, without_outcome(train), peaks)
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

    def _predict(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
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


class NearestNeighbors(RowPredictor):
    """k-nearest neighbours on log hardware specs and job shape, within the same model.

    Distance: standardised Euclidean over log(16-bit peak, fp32 peak, bandwidth, memory,
    devices, per-device batch), plus a large penalty for another model (so other models are
    used only for a model never seen) and a smaller one for another precision or table. Only
    the neighbours at the nearest penalty level vote. The prediction is the geometric mean of
    their per-device throughput times the test row's device count. Of neighbours at the same
    distance, the earlier training rows are taken (NumPy's partial sort leaves that choice to
    its version: the public tables' figures moved by a row between installs).

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

    def _predict(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
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
            nearest = np.argsort(d, axis=1, kind="stable")[:, :k]
            dn = np.take_along_axis(d, nearest, axis=1)
            level = np.floor(dn / self._CONFIG_PENALTY)
            vote = level == level.min(axis=1, keepdims=True)
            yk = ytr[nearest]
            mean_log = (yk * vote).sum(axis=1) / vote.sum(axis=1)
            out[sl] = np.exp(mean_log) * test["num_devices"].to_numpy(float)[sl]
        out[~good] = np.nan
        return out


class LinearScaling(RowPredictor):
    """Perfect data-parallel scaling: devices x the single-device throughput on the same type
    (same configuration and per-device batch). No estimate without such a measurement."""

    KEY: tuple[str, ...] = (*CONFIG_KEY, "hardware", "batch_size")

    def _predict(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        one = train[train["num_devices"] == 1]
        ctr, cte = joint_codes(one, test, self.KEY)
        per_device = median_by_code(ctr, one[TARGET].to_numpy(float), cte)
        return per_device * test["num_devices"].to_numpy(float)


def baseline_predictors() -> dict[str, FitPredict]:
    """Every baseline, by the name results use."""
    return {
        "lookup": BenchmarkLookup(),
        "spec_ratio_geomean": SpecRatio("geomean"),
        "spec_ratio_flops": SpecRatio("flops"),
        "spec_ratio_bandwidth": SpecRatio("bandwidth"),
        "spec_ratio_bound": SpecRatio("bound"),
        "spec_ratio_geomean_catalog": SpecRatio("geomean", specs="catalog"),
        "spec_ratio_nearest": SpecRatio("geomean", nearest=True),
        "knn": NearestNeighbors(k=5),
        "linear_scaling": LinearScaling(),
    }
