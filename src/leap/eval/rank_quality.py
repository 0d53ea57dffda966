"""Ranking-quality metrics of one ordered list of types against true values: top-1
agreement, value regret and NDCG (definitions in :mod:`leap.eval.ranking`), the expected
figures of a random order, and their summary over jobs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from leap.errors import DataError

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
