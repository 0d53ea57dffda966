"""Ranking-quality metrics of one ordered list of types against true values: top-1
agreement, value regret and NDCG (definitions in :mod:`leap.eval.ranking`), the expected
figures of a random order, and their summary over jobs; and the ranked predictions against
the truth (:func:`prediction_vs_truth`, :func:`pick_overprediction`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from leap import metrics
from leap.errors import DataError
from leap.rank.results import RankResult

#: Relative tolerance within which a type's value equals the best (ties count as best).
_TIE = 1e-9


def _discounts(n: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(n) + 2.0)


def order_quality(order: Sequence[str], values: Mapping[str, float]) -> dict[str, float]:
    """Top-1 agreement, value regret and NDCG of one ordered list against true values.

    Parameters
    ----------
    order : sequence of str
        The method's list, best first (may leave candidates out; unknown names are an error).
    values : mapping of str to float
        True value of every candidate (>= 0; NaN is treated as 0).

    Returns
    -------
    dict
        ``top1`` (1.0 or 0.0), ``regret`` and ``ndcg``; all NaN when the list is empty or no
        candidate has a positive value.

    Examples
    --------
    >>> v = {"A": 10.0, "B": 5.0, "C": 2.0}
    >>> order_quality(["B", "A", "C"], v)["regret"]
    0.5
    >>> round(order_quality(["B", "A", "C"], v)["ndcg"], 4)
    0.8696
    """
    clean = {k: (float(x) if np.isfinite(x) and x > 0 else 0.0) for k, x in values.items()}
    unknown = [n for n in order if n not in clean]
    if unknown:
        raise DataError(f"ranked type(s) {unknown} are not among the candidates "
                        f"{sorted(clean)}")
    best = max(clean.values(), default=0.0)
    if not order or best <= 0:
        return {"top1": math.nan, "regret": math.nan, "ndcg": math.nan}
    pick = clean[order[0]]
    rel = np.array([clean[n] / best for n in order])
    ideal = np.sort(np.array(list(clean.values())) / best)[::-1]
    dcg = float((rel * _discounts(len(rel))).sum())
    idcg = float((ideal * _discounts(len(ideal))).sum())
    return {"top1": float(pick >= best * (1.0 - _TIE)), "regret": float(1.0 - pick / best),
            "ndcg": dcg / idcg}


def random_quality(values: Mapping[str, float]) -> dict[str, float]:
    """Expected top-1, regret and NDCG of a uniformly random order (exact, not sampled).

    Examples
    --------
    >>> random_quality({"A": 10.0, "B": 5.0})["top1"], random_quality({"A": 10.0, "B": 5.0})[
    ...     "regret"]
    (0.5, 0.25)
    """
    v = np.array([float(x) if np.isfinite(x) and x > 0 else 0.0 for x in values.values()])
    if len(v) == 0 or v.max() <= 0:
        return {"top1": math.nan, "regret": math.nan, "ndcg": math.nan}
    rel = v / v.max()
    disc = _discounts(len(v))
    # Each type lands on each position with probability 1/n.
    expected_dcg = float(rel.sum() * disc.mean())
    idcg = float((np.sort(rel)[::-1] * disc).sum())
    return {"top1": float((rel >= 1.0 - _TIE).mean()), "regret": float((1.0 - rel).mean()),
            "ndcg": expected_dcg / idcg}


def summarize_quality(per_job: Sequence[Mapping[str, float]],
                      weights: np.ndarray | None = None) -> dict[str, float]:
    """Means of top-1, regret and NDCG over jobs (NaN rows skipped), plus regret quantiles.

    ``weights`` (e.g. GPU-hours) add ``*_gpu_hours`` weighted means of top-1 and regret.

    Examples
    --------
    >>> s = summarize_quality([{"top1": 1.0, "regret": 0.0, "ndcg": 1.0},
    ...                        {"top1": 0.0, "regret": 0.5, "ndcg": 0.5}], np.array([1.0, 3.0]))
    >>> s["top1_agreement"], s["mean_regret"], s["mean_regret_gpu_hours"]
    (0.5, 0.25, 0.375)
    """
    top1 = np.array([q["top1"] for q in per_job], dtype=np.float64)
    regret = np.array([q["regret"] for q in per_job], dtype=np.float64)
    ndcg = np.array([q["ndcg"] for q in per_job], dtype=np.float64)
    ok = np.isfinite(regret)
    out: dict[str, float] = {"n": float(ok.sum())}
    if not ok.any():
        return out | {"top1_agreement": math.nan, "mean_regret": math.nan,
                      "median_regret": math.nan, "p90_regret": math.nan, "mean_ndcg": math.nan}
    out |= {"top1_agreement": float(top1[ok].mean()), "mean_regret": float(regret[ok].mean()),
            "median_regret": float(np.median(regret[ok])),
            "p90_regret": float(np.quantile(regret[ok], 0.9)),
            "mean_ndcg": float(ndcg[ok].mean())}
    if weights is not None:
        w = np.nan_to_num(np.asarray(weights, dtype=np.float64))[ok]
        if w.sum() > 0:
            out["top1_agreement_gpu_hours"] = float((w * top1[ok]).sum() / w.sum())
            out["mean_regret_gpu_hours"] = float((w * regret[ok]).sum() / w.sum())
    return out


def prediction_vs_truth(results: Sequence[RankResult],
                        truth: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Accuracy and interval coverage of the ranked entries against the true median.

    Per novelty group of the entry (what history the family had on the type), plus the two
    pools ``with_hardware_history`` (seen configuration or pair) and
    ``without_hardware_history`` (types the family never ran on, and new families): the
    second is what a ranking must predict.
    """
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    for res, tps in zip(results, truth, strict=True):
        for e in res.ranking:
            t = tps.get(e.hardware, math.nan)
            lo = e.throughput_p10 if e.throughput_p10 is not None else math.nan
            hi = e.throughput_p90 if e.throughput_p90 is not None else math.nan
            pool = ("without_hardware_history" if "missing_hardware_history" in e.flags
                    else "with_hardware_history")
            for key in (pool, e.novelty or "unknown"):
                rows.setdefault(key, []).append((e.predicted_throughput, t, lo, hi))
    out = {}
    for key, vals in rows.items():
        a = np.array(vals, dtype=np.float64)
        ok = np.isfinite(a[:, 1])
        p, t, lo, hi = a[ok].T
        out[key] = {"n": float(ok.sum()), "accuracy": metrics.accuracy(p, t),
                    "median_ape": metrics.median_ape(p, t),
                    "interval_coverage": float(np.mean((t >= lo) & (t <= hi))) if ok.any()
                    else math.nan}
    return out


def pick_overprediction(results: Sequence[RankResult],
                        truth: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Predicted / true throughput of each list's first entry (the optimizer's curse).

    Value is throughput over the same cost, so the ratio is the pick's predicted / true
    value. A NaN truth (the pick would not run) counts as an infinite ratio.

    Examples
    --------
    >>> from leap.rank.results import RankedType
    >>> e = RankedType("A", 200.0, 1.0, 7.2e5, None, None, 1, 1.0, False)
    >>> pick_overprediction([RankResult([e])], [{"A": 100.0}])["median"]
    2.0
    """
    ratios = []
    for res, tps in zip(results, truth, strict=True):
        if res.ranking:
            e = res.ranking[0]
            t = tps.get(e.hardware, math.nan)
            ratios.append(e.predicted_throughput / t if np.isfinite(t) and t > 0 else math.inf)
    r = np.array(ratios, dtype=np.float64)
    if not len(r):
        return {"n": 0.0, "median": math.nan, "p90": math.nan, "share_above_1_5": math.nan}
    return {"n": float(len(r)), "median": float(np.median(r)),
            "p90": float(np.quantile(r, 0.9)), "share_above_1_5": float(np.mean(r > 1.5))}
