"""Accuracy metrics shared by nightly training and evaluation (pure NumPy, no state), and
the one number format for figures (:func:`si`).

Accuracy is the paper's: the share of attempts whose predicted throughput lies within ±20%
of the measured value, i.e. ``|pred / actual - 1| <= 0.2``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leap.records import Record

TOLERANCE = 0.20
#: Resamples behind :func:`cluster_interval`.
CLUSTER_DRAWS = 1000


def within(pred: np.ndarray, actual: np.ndarray, tolerance: float = TOLERANCE) -> np.ndarray:
    """Boolean per row: prediction within ``tolerance`` (relative) of the actual value."""
    pred = np.asarray(pred, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.abs(pred / actual - 1.0) <= tolerance


def within_log(err: np.ndarray, tolerance: float = TOLERANCE) -> np.ndarray:
    """:func:`within` for log errors ``log(pred) - log(actual)`` (NaN: False).

    >>> within_log(np.log(np.array([0.8, 1.25, np.nan]))).tolist()
    [True, False, False]
    """
    return (err >= np.log(1.0 - tolerance)) & (err <= np.log(1.0 + tolerance))


def interval_coverage(actual: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float | None:
    """Share of the rows with both bounds whose ``actual`` lies in ``[lo, hi]`` (None when no
    row has an interval).

    >>> interval_coverage(np.array([1., 5., 3.]), np.array([0., 0., np.nan]), np.full(3, 2.))
    0.5
    """
    has = np.isfinite(lo) & np.isfinite(hi)
    if not has.any():
        return None
    return float(np.mean((lo[has] <= actual[has]) & (actual[has] <= hi[has])))


def effective_clusters(cluster: np.ndarray) -> float:
    """How many independent observations rows in ``cluster`` (e.g. their family) are worth
    when each cluster's rows rise and fall together: ``(sum n_c)^2 / sum n_c^2``.

    >>> effective_clusters(np.array(["a"] * 8 + ["b", "c"]))
    1.5151515151515151
    """
    _, n = np.unique(np.asarray(cluster), return_counts=True)
    return float(n.sum() ** 2 / (n.astype(np.float64) ** 2).sum()) if len(n) else 0.0


def cluster_interval(hit: np.ndarray, cluster: np.ndarray, level: float = 0.9,
                     draws: int = CLUSTER_DRAWS, seed: int = 0) -> tuple[float, float] | None:
    """A ``level`` confidence interval for the share of ``hit`` rows, resampling whole
    clusters (percentile bootstrap). A family's attempts share its errors, so a group of
    500 attempts from a dozen busy families is worth about a dozen observations, not 500.
    None without rows.

    >>> hit = np.r_[np.ones(50, bool), np.zeros(50, bool)]
    >>> lo, hi = cluster_interval(hit, np.repeat([0, 1], 50))   # two families: anything
    >>> lo, hi
    (0.0, 1.0)
    >>> lo, hi = cluster_interval(hit, np.arange(100))           # 100 independent rows
    >>> 0.38 < lo < 0.45 and 0.55 < hi < 0.62
    True
    """
    hit = np.asarray(hit, dtype=np.float64)
    if not len(hit):
        return None
    _, inv = np.unique(np.asarray(cluster), return_inverse=True)
    k = int(inv.max()) + 1
    hits, rows = np.bincount(inv, weights=hit, minlength=k), np.bincount(inv, minlength=k)
    rng = np.random.default_rng(seed)
    shares = np.empty(draws)
    step = max(1, 1_000_000 // k)   # resamples at a time: about a million draws of memory
    for at in range(0, draws, step):
        take = rng.integers(0, k, size=(min(step, draws - at), k))
        shares[at:at + len(take)] = hits[take].sum(axis=1) / rows[take].sum(axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(shares, [tail, 1.0 - tail])
    return float(lo), float(hi)


def accuracy(pred: np.ndarray, actual: np.ndarray, weights: np.ndarray | None = None,
             tolerance: float = TOLERANCE) -> float:
    """Weighted share of rows within tolerance; rows with a missing prediction count as misses.

    Examples
    --------
    >>> accuracy(np.array([100., 130., 90.]), np.array([100., 100., 100.]))
    0.6666666666666666
    >>> accuracy(np.array([100., 130.]), np.array([100., 100.]), weights=np.array([1., 3.]))
    0.25
    """
    ok = within(pred, actual, tolerance) & np.isfinite(pred)
    w = np.ones(len(ok)) if weights is None else np.nan_to_num(np.asarray(weights, float))
    total = w.sum()
    return float((w * ok).sum() / total) if total > 0 else float("nan")


def median_ape(pred: np.ndarray, actual: np.ndarray) -> float:
    """Median absolute percentage error (as a fraction) over rows with a prediction.

    >>> round(median_ape(np.array([110., 80., 100.]), np.array([100., 100., 100.])), 6)
    0.1
    """
    pred = np.asarray(pred, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    m = np.isfinite(pred) & np.isfinite(actual) & (actual != 0)
    if not m.any():
        return float("nan")
    return float(np.median(np.abs(pred[m] / actual[m] - 1.0)))


@dataclass(frozen=True)
class Summary(Record):
    """The standard accuracy block of a set of predictions (:func:`summary`)."""

    OMIT_NONE = frozenset({"accuracy_gpu_hours"})

    n: float
    coverage: float
    accuracy: float
    median_ape: float
    #: Accuracy weighted by each attempt's device-hours (when they are known).
    accuracy_gpu_hours: float | None = None


def summary(pred: np.ndarray, actual: np.ndarray,
            gpu_hours: np.ndarray | None = None) -> Summary:
    """The standard block: n, coverage, attempt- and GPU-hour-weighted accuracy, MdAPE.

    >>> s = summary(np.array([100., 150.]), np.array([100., 100.]))
    >>> s.n, s.coverage, s.accuracy, s.median_ape, s.accuracy_gpu_hours
    (2.0, 1.0, 0.5, 0.25, None)
    """
    pred = np.asarray(pred, dtype=np.float64)
    return Summary(
        n=float(len(pred)),
        coverage=float(np.isfinite(pred).mean()) if len(pred) else float("nan"),
        accuracy=accuracy(pred, actual),
        median_ape=median_ape(pred, actual),
        accuracy_gpu_hours=None if gpu_hours is None
        else accuracy(pred, actual, weights=gpu_hours))


def si(x: float | None) -> str:
    """A number with three significant digits and an SI suffix; a dash for missing values.

    >>> si(874_123.0), si(12.5), si(None)
    ('874k', '12.5', '—')
    """
    if x is None or x != x:
        return "—"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"
