"""Ranking quality against the simulator's truth: top-1 agreement, value regret and NDCG.

For each sampled job of a held-out day, the candidates are the oracle's eligible types (the
job's own shape fits, the type takes jobs that day, and both the model and the cost catalog
know it). The true value of a type is ``true samples/s x 3600 / (devices x
cost_per_device_hour)``: samples per unit of cost, exactly as the ranker defines value but
with the true median throughput instead of the predicted one.

Two truths: ``policy`` (the default) sets to 0 the value of every premium type that the
ranker's premium rule would leave out on the TRUE figures (:func:`policy_values`), so the best
type is the best the user's rule allows; ``all_types`` keeps every eligible type.

Per job and method (an ordered list of types):

``top1``
    the list's first type has the best true value (ties count: any type whose value equals
    the best, to a relative 1e-9, is a best type).
``regret``
    ``1 - value(first type) / value(best type)``, in [0, 1].
``ndcg``
    normalised discounted cumulative gain of the list with relevance ``value / best value``
    (so a list that leaves good types out is penalised; the ideal list has them all).

LEAP's list comes from :func:`leap_rankings`, the ONE place evaluation calls the ranker (the
impact study uses it too; :func:`availability_rankings` is its variant for advice that is told
each type's free devices at the moment a job arrives). A job LEAP gives no ranking
(fail-open, or every candidate excluded) has no pick: it counts against LEAP's coverage and
the quality figures are over the jobs LEAP ranked; every method is scored on that same set. A
type whose true throughput is NaN (it would not run) has value 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.schema import JOB_COLUMNS
from leap.data.usage import device_hours, job_devices
from leap.errors import DataError
from leap.eval.baselines import (
    CHEAPEST,
    cheapest_order,
    family_usage,
    fastest_peak_order,
    most_used_order,
)
from leap.eval.rank_quality import (
    order_quality,
    pick_overprediction,
    prediction_vs_truth,
    random_quality,
    summarize_quality,
)
from leap.rank.results import DEFAULT_RISK, value
from leap.records import Record

__all__ = [
    "METHODS",
    "TRUTHS",
    "RankingFigures",
    "availability_rankings",
    "eligible_names",
    "job_requests",
    "leap_rankings",
    "oracle_order",
    "order_quality",
    "pick_overprediction",
    "policy_values",
    "prediction_vs_truth",
    "random_quality",
    "ranking_study",
    "summarize_quality",
    "true_throughputs",
    "true_values",
    "unfiltered",
]

if TYPE_CHECKING:
    from leap.rank.ranker import Ranker
    from leap.rank.results import RankResult
    from leap.sim.fleet import Fleet

#: Methods scored by :func:`ranking_study`, in report order.
METHODS: tuple[str, ...] = ("leap", "leap_risk_neutral", "leap_risk_averse",
                            "leap_no_premium_filter", CHEAPEST, "fastest_peak", "most_used",
                            "random")
#: Truths the methods are scored against: ``policy`` (the best true value among the types the
#: ranker's premium rule keeps on the TRUE figures: what a user who set that rule asked for)
#: and ``all_types`` (the best true value of any eligible type, premium rule ignored).
TRUTHS: tuple[str, ...] = ("policy", "all_types")
#: The oracle needs these job columns (the rest of the shape comes from the family).
_SHAPE_COLUMNS = ("family_id", "trainer_count", "batch_size", "precision",
                  "devices_per_trainer", "tensor_parallel", "pipeline_parallel")
Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class RankingFigures(Record):
    """:func:`ranking_study`: per method (``methods``, ``methods_all_types``) the figures of
    :func:`summarize_quality`, LEAP's predictions against the truth by novelty group, the
    picks' over-prediction, the sample and its coverage, each method's regrets."""

    prediction_vs_truth: dict[str, dict[str, float]]
    pick_overprediction: dict[str, dict[str, float]]
    n_jobs_day: int
    n_with_two_or_more_candidates: int
    n_sampled: int
    seed: int
    leap_coverage: float
    leap_unranked_reasons: dict[str, int]
    candidates_median: float
    best_type_share: dict[str, float]
    methods: dict[str, dict[str, float]]
    methods_all_types: dict[str, dict[str, float]]
    regrets: dict[str, list[float]]
    definitions: dict[str, str]


# Calling the ranker ---------------------------------------------------------------------------
def job_requests(jobs: pd.DataFrame) -> list[dict[str, Any]]:
    """The launch-time fields of each attempt row as a rank request (Python types, no NaN).

    Examples
    --------
    >>> job_requests(pd.DataFrame({"family_id": ["f"], "model_type": ["m"],
    ...                            "trainer_count": [2], "batch_size": [8],
    ...                            "throughput": [1.0], "num_params": [float("nan")]}))
    [{'family_id': 'f', 'model_type': 'm', 'trainer_count': 2, 'batch_size': 8}]
    """
    cols = [c for c in JOB_COLUMNS if c in jobs.columns]
    out = []
    for rec in jobs[cols].to_dict("records"):
        job: dict[str, Any] = {}
        for k, v in rec.items():
            if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
                continue
            job[k] = v.item() if isinstance(v, np.generic) else v
        out.append(job)
    return out


#: Distinct requests :func:`leap_rankings` ranks in one call of ``Ranker.rank_many``.
RANK_BLOCK = 250


def leap_rankings(ranker: Ranker, jobs: pd.DataFrame, candidates: Sequence[Sequence[str]],
                  progress: Progress | None = None, *, risk: str | None = None
                  ) -> list[RankResult]:
    """LEAP's answer for each job on its candidates (the one call site of the ranker).

    Identical (job, candidates) requests are ranked once: a day repeats many configurations.
    The distinct ones go :data:`RANK_BLOCK` at a time to ``Ranker.rank_many``, whose answers
    are those of ``Ranker.rank`` one by one, for one feature encoding per block.

    Parameters
    ----------
    ranker : Ranker
        E.g. ``Ranker(window_model.artifact)`` or ``Ranker(Registry(ws.models_dir))``.
    jobs : pandas.DataFrame
        Attempt rows (outcome columns are ignored).
    candidates : sequence of sequences of str
        Eligible types of each job.
    progress : callable, optional
        ``progress(done, total)`` over the distinct requests.
    risk : str, optional
        The ranker's ``risk`` rule (default: the ranker's default).

    Returns
    -------
    list of RankResult
        One per job, in order (failures are empty rankings with a reason, never raised).
    """
    if len(candidates) != len(jobs):
        raise DataError(f"got {len(candidates)} candidate lists for {len(jobs)} jobs; pass one "
                        "list per job")
    requests = job_requests(jobs)
    keys = [(tuple(sorted(r.items())), tuple(c)) for r, c in zip(requests, candidates,
                                                                    strict=True)]
    unique: dict[Any, int] = {}
    for i, key in enumerate(keys):
        unique.setdefault(key, i)
    answers: dict[Any, RankResult] = {}
    order = list(unique.items())
    total = len(order)
    for start in range(0, total, RANK_BLOCK):
        block = [(key, i) for key, i in order[start:start + RANK_BLOCK] if candidates[i]]
        got = ranker.rank_many([requests[i] for _, i in block],
                               [list(candidates[i]) for _, i in block],
                               risk=DEFAULT_RISK if risk is None else risk)
        answers.update(zip((key for key, _ in block), got, strict=True))
        if progress:
            progress(min(start + RANK_BLOCK, total), total)
    return [answers[k] if k in answers else _no_candidates() for k in keys]


def availability_rankings(ranker: Ranker, jobs: pd.DataFrame,
                          candidates: Sequence[Sequence[str]],
                          answers: Sequence[RankResult] | None = None
                          ) -> Callable[[int, Mapping[str, float]], RankResult]:
    """``rank(i, free_devices)``: LEAP's answer for job ``i`` told each type's free devices.

    With ``answers`` (this job list's :func:`leap_rankings`), the ranker's own availability
    fold (:func:`leap.rank.policy.fold_availability`, the last step of
    ``Ranker.rank(..., free_devices=)``) is applied to them: the same answer without predicting
    again. Without, the ranker is called, once per request and set of full types.
    """
    from leap.rank.policy import fold_availability

    if len(candidates) != len(jobs) or (answers is not None and len(answers) != len(jobs)):
        raise DataError(f"got {len(candidates)} candidate lists for {len(jobs)} jobs; pass one "
                        "list (and one answer) per job")
    requests = job_requests(jobs)
    devices = job_devices(jobs)
    cache: dict[Any, RankResult] = {}

    def rank(i: int, free_devices: Mapping[str, float]) -> RankResult:
        cands = list(candidates[i])
        if not cands:
            return _no_candidates()
        if answers is not None:
            a = answers[i]
            return a if not a.ranking else dataclasses.replace(
                a, ranking=fold_availability(a.ranking, free_devices))
        full = tuple(n for n in cands if not free_devices.get(n, math.inf) >= devices[i])
        key = (tuple(sorted(requests[i].items())), tuple(cands), full)
        if key not in cache:
            cache[key] = ranker.rank(requests[i], cands, free_devices=dict(free_devices))
        return cache[key]

    return rank


def _no_candidates() -> RankResult:
    from leap.rank.results import RankResult

    return RankResult(ranking=[], reason="no_candidates: no eligible type")


def unfiltered(ranker: Ranker, costs: Catalog) -> Ranker:
    """The same ranker with the premium filter switched off (every premium type kept)."""
    premium = [n for n in costs if costs[n].premium]
    return ranker.with_options(min_utilization=dict.fromkeys(premium, 0.0),
                               min_speedup=dict.fromkeys(premium, 1e-12))


# The oracle -----------------------------------------------------------------------------------
def eligible_names(fleet: Fleet, jobs: pd.DataFrame, known: Sequence[str]) -> list[list[str]]:
    """Each job's eligible types (oracle: fits its shape and available that day) in ``known``."""
    names = list(fleet.hardware_names)
    ok = fleet.eligible(_shape_frame(jobs), jobs["submitted_at"].to_numpy())
    keep = np.array([n in set(known) for n in names])
    ok = ok & keep[None, :]
    return [[names[j] for j in np.flatnonzero(row)] for row in ok]


def true_throughputs(fleet: Fleet, jobs: pd.DataFrame,
                     candidates: Sequence[Sequence[str]]) -> list[dict[str, float]]:
    """True median samples/s of each job on each of its candidates (NaN: it would not run)."""
    counts = np.array([len(c) for c in candidates], dtype=np.int64)
    rows = np.repeat(np.arange(len(jobs)), counts)
    flat = [n for c in candidates for n in c]
    if not flat:
        return [{} for _ in candidates]
    shape = _shape_frame(jobs).iloc[rows].reset_index(drop=True)
    at = jobs["submitted_at"].to_numpy()[rows]
    tp = fleet.true_throughput(shape, np.asarray(flat, dtype=object), at)
    out: list[dict[str, float]] = []
    start = 0
    for c in candidates:
        out.append(dict(zip(c, tp[start:start + len(c)].tolist(), strict=True)))
        start += len(c)
    return out


def true_values(fleet: Fleet, jobs: pd.DataFrame, candidates: Sequence[Sequence[str]],
                costs: Catalog) -> list[dict[str, float]]:
    """True value (samples per unit cost) of each job on each of its candidates.

    NaN true throughput (the job would not run there) gives value 0.
    """
    devices = job_devices(jobs)
    out = []
    for d, tps in zip(devices, true_throughputs(fleet, jobs, candidates), strict=True):
        out.append({n: (value(t, d * costs[n].cost_per_device_hour) if np.isfinite(t) else 0.0)
                    for n, t in tps.items()})
    return out


def policy_values(ranker: Ranker, jobs: pd.DataFrame, truth: Sequence[Mapping[str, float]],
                  values: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """``values`` with every premium type the ranker's premium rule leaves out, applied to
    the true throughput (true MFU, or the true speed-up over the fastest non-premium
    candidate when the job has no ``flops_per_sample``), set to 0.
    """
    serving = ranker.serving
    if serving is None:
        return [dict(v) for v in values]
    costs = ranker.costs if ranker.costs is not None else serving.artifact.catalog
    devices = job_devices(jobs)
    flops = jobs["flops_per_sample"].to_numpy(dtype=np.float64) \
        if "flops_per_sample" in jobs.columns else np.full(len(jobs), np.nan)
    precision = jobs["precision"].astype(object).where(jobs["precision"].notna(), None) \
        .to_numpy() if "precision" in jobs.columns else np.full(len(jobs), None)
    out = []
    for i, (tps, v) in enumerate(zip(truth, values, strict=True)):
        kept = dict(v)
        premium = [n for n in tps if costs[n].premium and np.isfinite(tps[n])]
        if premium:
            standard = [t for n, t in tps.items() if not costs[n].premium and np.isfinite(t)]
            best_standard = max(standard) if standard else None
            peaks = dict(zip(premium, serving.peak_flops(precision[i], premium).tolist(),
                             strict=True))
            for n in premium:
                mfu = tps[n] * flops[i] / (devices[i] * peaks[n]) \
                    if np.isfinite(flops[i]) and flops[i] > 0 else None
                speedup = tps[n] / best_standard if best_standard else None
                if not ranker.keeps_premium(n, utilization=mfu, speedup=speedup):
                    kept[n] = 0.0
        out.append(kept)
    return out


def oracle_order(values: Mapping[str, float]) -> list[str]:
    """Types by true value, best first (ties by name).

    >>> oracle_order({"B": 2.0, "A": 2.0, "C": 5.0})
    ['C', 'A', 'B']
    """
    return sorted(values, key=lambda n: (-values[n], n))


def _shape_frame(jobs: pd.DataFrame) -> pd.DataFrame:
    return jobs[[c for c in _SHAPE_COLUMNS if c in jobs.columns]].reset_index(drop=True)


# The study ------------------------------------------------------------------------------------
def ranking_study(ranker: Ranker, fleet: Fleet, jobs: pd.DataFrame, past: pd.DataFrame,
                  costs: Catalog, *, sample: int = 1000, seed: int = 0,
                  progress: Progress | None = None) -> RankingFigures:
    """Score LEAP's rankings and the simple baselines against the oracle on launched jobs.

    Parameters
    ----------
    ranker : Ranker
        LEAP's ranker for the day (a model trained on the window before it).
    fleet : Fleet
        The simulated fleet of the store (the oracle).
    jobs : pandas.DataFrame
        The held-out day's attempts (any status: they all launched).
    past : pandas.DataFrame
        The training window's attempts (for the "most used" baseline).
    costs : Catalog
        Prices for value (the ranker's cost catalog).
    sample : int
        Jobs drawn (without replacement, seeded) among those with at least two candidates.
    seed : int

    Returns
    -------
    RankingFigures
        ``methods``: per method the summary of :func:`summarize_quality`; ``leap_coverage``
        (share of sampled jobs LEAP ranked), ``n_sampled``, ``candidates_median``,
        ``best_type_share`` (which types the oracle picks most) and the definitions.
    """
    model_known = set(ranker.serving.artifact.catalog) if ranker.serving else set(costs)
    known = [n for n in fleet.hardware_names if n in costs and n in model_known]
    jobs = jobs.reset_index(drop=True)
    cands_all = eligible_names(fleet, jobs, known)
    multi = np.flatnonzero([len(c) >= 2 for c in cands_all])
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(multi, min(sample, len(multi)), replace=False)) if len(multi) \
        else multi
    picked = jobs.iloc[pick].reset_index(drop=True)
    cands = [cands_all[i] for i in pick]
    truth = true_throughputs(fleet, picked, cands)
    values = true_values(fleet, picked, cands, costs)

    leap = leap_rankings(ranker, picked, cands, progress)
    neutral = leap_rankings(ranker, picked, cands, risk="neutral")
    averse = leap_rankings(ranker, picked, cands, risk="averse")
    plain = leap_rankings(unfiltered(ranker, costs), picked, cands)
    usage = family_usage(past)
    orders: dict[str, list[list[str]]] = {
        "leap": [[r.hardware for r in res.ranking] for res in leap],
        "leap_risk_neutral": [[r.hardware for r in res.ranking] for res in neutral],
        "leap_risk_averse": [[r.hardware for r in res.ranking] for res in averse],
        "leap_no_premium_filter": [[r.hardware for r in res.ranking] for res in plain],
        CHEAPEST: [cheapest_order(c, costs) for c in cands],
        "fastest_peak": [fastest_peak_order(c, costs) for c in cands],
        "most_used": [most_used_order(c, usage.get(str(f), {}), costs)
                      for c, f in zip(cands, picked["family_id"], strict=True)],
    }
    ranked = np.array([len(o) > 0 for o in orders["leap"]], dtype=bool)
    hours = device_hours(picked)
    truths = {"policy": policy_values(ranker, picked, truth, values), "all_types": values}
    by_truth: dict[str, dict[str, dict[str, float]]] = {}
    regrets: dict[str, list[float]] = {}
    for which, vals in truths.items():
        methods: dict[str, dict[str, float]] = {}
        for name in METHODS:
            if name == "random":
                per_job = [random_quality(vals[i]) for i in np.flatnonzero(ranked)]
            else:
                per_job = [order_quality(orders[name][i], vals[i])
                           for i in np.flatnonzero(ranked)]
            methods[name] = summarize_quality(per_job, hours[ranked])
            if which == TRUTHS[0]:
                regrets[name] = [q["regret"] for q in per_job]
        by_truth[which] = methods
    values = truths[TRUTHS[0]]
    best = [oracle_order(v)[0] for v, r in zip(values, ranked, strict=True) if r and v]
    best_share = pd.Series(best, dtype=object).value_counts(normalize=True).head(8)
    reasons = pd.Series([res.reason.split(":")[0] for res in leap if res.reason],
                        dtype=object).value_counts()
    return RankingFigures(
        prediction_vs_truth=prediction_vs_truth(leap, truth),
        pick_overprediction={"leap": pick_overprediction(leap, truth),
                             "leap_risk_neutral": pick_overprediction(neutral, truth),
                             "leap_risk_averse": pick_overprediction(averse, truth)},
        n_jobs_day=len(jobs),
        n_with_two_or_more_candidates=len(multi),
        n_sampled=len(picked),
        seed=seed,
        leap_coverage=float(ranked.mean()) if len(ranked) else math.nan,
        leap_unranked_reasons={str(k): int(v) for k, v in reasons.items()},
        candidates_median=float(np.median([len(c) for c in cands])) if cands else math.nan,
        best_type_share={str(k): float(v) for k, v in best_share.items()},
        methods=by_truth[TRUTHS[0]],
        methods_all_types=by_truth["all_types"],
        regrets={k: [round(x, 5) for x in v] for k, v in regrets.items()},
        definitions={
            "value": "true samples/s x 3600 / (devices x cost_per_device_hour)",
            "methods": "scored against the best true value among the types the ranker's "
                       "premium rule keeps on the true figures (the user's policy)",
            "methods_all_types": "scored against the best true value of any eligible type "
                                 "(premium rule ignored)",
            "top1_agreement": "share of jobs whose first type has the best true value",
            "regret": "1 - true value of the first type / true value of the best type",
            "ndcg": "NDCG of the list, relevance = true value / best true value",
            "random": "expected value over uniformly random orders",
            "scored_on": "the sampled jobs LEAP ranked (every method on the same jobs)",
            "prediction_vs_truth": "LEAP's predicted samples/s of every ranked (job, type) "
                                   "against the true median, by novelty group (what history "
                                   "the family had on the type), with the share of true "
                                   "medians inside the 80% interval",
            "pick_overprediction": "predicted / true value of the first type of each list "
                                   "(median, 90th percentile, share above 1.5)",
        },
    )
