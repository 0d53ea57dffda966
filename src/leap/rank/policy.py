"""The ranking policy: exclusions, the premium rule, flags and the order under a risk rule.

:func:`rank_rows` turns one job's encoded rows and their predictions into the preference list
and the left-out types (the fields of each entry: :mod:`leap.rank.ranker`);
:func:`order_ranking` orders it under a risk rule and :func:`fold_availability` moves types
without room last.

Premium types (``premium = true`` in the cost catalog) are kept only when one rule passes,
and the entry's flags say which: with ``flops_per_sample``, MFU must reach the type's
``min_utilization`` (catalog, overridable per type with ``min_utilization=``) ->
``premium_kept_mfu``; without it, the speed-up must reach ``premium_min_speedup`` (default
1.25, overridable per type with ``min_speedup=``) -> ``premium_kept_speedup``. Otherwise the
type is excluded with reason ``premium_below_threshold``.

Other exclusions, each listed with a reason and a detail: ``unknown_hardware`` (the model's
catalog does not have the type, or it is in no catalog at all when not ``strict``),
``invalid_cost`` (a cost of 0 in the catalog), ``does_not_fit_host`` (more devices per trainer
than the type has per host), ``does_not_fit_memory`` (the learner's physics estimate
``mem_fit`` > 1, and the family never succeeded on a type with at least that much device
memory: history overrules the conservative estimate) and ``over_budget`` (``cost_per_hour``
above ``max_cost_per_hour``). Flags: ``missing_family_history``, ``missing_hardware_history``
(the family never ran on the type in the history window), ``memory_fit_unknown`` (no
``num_params``), ``utilization_above_peak`` (MFU > 1: check ``flops_per_sample``),
``premium_kept_mfu``, ``premium_kept_speedup``, ``no_free_devices`` (with ``free_devices=``:
the type has too few free devices for the job now; it is ordered after the types with room).
When every candidate is left out the ranking is empty and ``reason`` is
``"no_eligible_type: ..."`` (an empty answer always says why; this one is not a failure and is
not counted as fail-open).

Objectives: ``value`` (default) sorts by value; ``throughput`` sorts by predicted throughput
(fastest within an optional ``max_cost_per_hour`` budget). Ties break by name, so the order
never depends on the order of the candidates. The ``risk`` rule (:func:`order_ranking`) says
how the 80% intervals enter: ``cautious`` (default) keeps the cheapest type first unless a
dearer one beats it confidently, ``neutral`` sorts by the median, ``averse`` by the low end.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from leap.catalog import Catalog, Hardware
from leap.features.encode import FEATURE_NAMES, NOVELTY_GROUPS
from leap.rank.results import DEFAULT_RISK, Excluded, RankedType, value

if TYPE_CHECKING:
    from leap.rank.serving import Serving

#: Standard errors of value gain a dearer type needs to rank above the cheapest (``cautious``).
#: Chosen on validation days among 0, 0.25, 0.5, 0.75, 1 and 1.5: days 29 and 30 of the
#: reference fleet, each with a model trained on the 30 days before it, both best at 0.25
#: (top-1 78.3% and 79.2%, against 77.8% and 78.4% at the earlier 0.75), then checked on the
#: held-out day 31 (78.1% against 77.9%; mean value regret 4.1% against 4.7%).
CAUTIOUS_Z = 0.25
# An 80% interval spans +-1.2816 standard deviations of a normal (log scale).
_Z80 = 1.2815515655446004
#: An entry whose 80% interval spans more than this factor (p90 / p10) is flagged uncertain.
UNCERTAIN_RATIO = 2.0
#: Every flag a ranked entry can carry, and what it says.
FLAGS: dict[str, str] = {
    "missing_family_history": "new family",
    "missing_hardware_history": "never ran on this type",
    "uncertain": f"uncertain (p90 over {UNCERTAIN_RATIO:g}x p10)",
    "memory_fit_unknown": "memory fit unknown",
    "utilization_above_peak": "utilization above peak",
    "premium_kept_mfu": "premium type, kept on utilization",
    "premium_kept_speedup": "premium type, kept on speed-up",
    "no_free_devices": "too few free devices now",
}
DEFAULT_PREMIUM_MIN_SPEEDUP = 1.25

# Feature columns the ranker reads for its fit filter and history flags.
_COL_MEM_FIT, _COL_FAM_N, _COL_FAM_HW_N = (FEATURE_NAMES.index(c)
                                           for c in ("mem_fit", "fam_n", "fam_hw_n"))


@dataclass(frozen=True)
class _Price:
    hw: Hardware
    min_utilization: float
    min_speedup: float


def _premium_rule(price: _Price, mfu: float | None, speedup: float | None
                  ) -> tuple[str, str | None]:
    """``(flag, None)`` when the premium rule keeps the type, else ``("", why)``."""
    n = price.hw.name
    if mfu is not None:
        if mfu < price.min_utilization:
            return "", (f"predicted MFU {mfu:.3f} < min_utilization {price.min_utilization:g} "
                        f"of premium '{n}'")
        return "premium_kept_mfu", None
    if speedup is None or speedup < price.min_speedup:
        got = "no non-premium type to compare with" if speedup is None else \
            f"speed-up {speedup:.2f}x"
        return "", (f"no flops_per_sample for MFU, and {got} < {price.min_speedup:g}x needed "
                    f"by premium '{n}'")
    return "premium_kept_speedup", None



def _log_sd(r: RankedType) -> float:
    """Standard deviation of the log prediction implied by the 80% interval (0 without one)."""
    if r.throughput_p10 is None or r.throughput_p90 is None:
        return 0.0
    return (math.log(r.throughput_p90) - math.log(r.throughput_p10)) / (2.0 * _Z80)


def order_ranking(ranking: list[RankedType], objective: str, risk: str) -> list[RankedType]:
    """The preference order of ``ranking`` for ``objective`` under the ``risk`` rule.

    ``cautious`` (value only; for throughput it is ``neutral``) starts from the neutral order
    and moves the cheapest type ahead of every type whose predicted value gain over it is
    below :data:`CAUTIOUS_Z` standard errors, ``log(value / value_cheapest) /
    sqrt(sd^2 + sd_cheapest^2)`` with each ``sd`` from its 80% interval: ranking by the
    largest point estimate picks overpredictions, and the cheapest type is the best value
    more often than any other. Without intervals it equals ``neutral``.

    Examples
    --------
    >>> a = RankedType("cheap", 10.0, 1.0, 36000.0, None, None, 1, 1.0, False, (), 5.0, 20.0)
    >>> b = RankedType("dear", 30.0, 2.5, 43200.0, None, None, 1, 2.5, False, (), 10.0, 90.0)
    >>> [r.hardware for r in order_ranking([a, b], "value", "neutral")]
    ['dear', 'cheap']
    >>> [r.hardware for r in order_ranking([a, b], "value", "cautious")]
    ['cheap', 'dear']
    """
    out = sorted(ranking, key=lambda r: _sort_key(r, objective, risk))
    if risk != "cautious" or objective != "value" or len(out) < 2:
        return out
    anchor = min(out, key=lambda r: (r.cost_per_hour, r.hardware))
    sd_a = _log_sd(anchor)

    def confident(r: RankedType) -> bool:
        gain = math.log(r.value / anchor.value)
        sd = math.hypot(_log_sd(r), sd_a)
        return gain > CAUTIOUS_Z * sd if sd > 0 else gain > 0

    ahead = [r for r in out if r is not anchor and confident(r)]
    return ahead + [anchor] + [r for r in out if r is not anchor and not confident(r)]


def _sort_key(r: RankedType, objective: str, risk: str) -> tuple[float, str]:
    """Best first; ties by name, so the order never depends on the candidates' order."""
    averse = risk == "averse" and r.throughput_p10 is not None
    tp = r.throughput_p10 if averse and r.throughput_p10 is not None else r.predicted_throughput
    return (-(tp / r.cost_per_hour if objective == "value" else tp), r.hardware)



def fold_availability(ranking: Sequence[RankedType], free_devices: Mapping[str, float]
                      ) -> list[RankedType]:
    """Types without room for the job after those with room (each part keeps its order).

    A type with fewer free devices than the job's ``devices`` gets the flag
    ``no_free_devices``; its value is unchanged (it is what the job would get once it runs),
    but a job sent there would wait, so advice that knows the fleet is finite offers the
    types with room first instead of herding every job onto the same best type.

    Examples
    --------
    >>> r = [RankedType("A40", 10.0, 1.0, 9.0, None, None, 4, 0.25, False),
    ...      RankedType("L4", 5.0, 1.0, 5.0, None, None, 4, 0.25, False)]
    >>> [(x.hardware, x.flags) for x in fold_availability(r, {"A40": 2.0})]
    [('L4', ()), ('A40', ('no_free_devices',))]
    """
    room = [r for r in ranking if free_devices.get(r.hardware, math.inf) >= r.devices]
    full = [dataclasses.replace(r, flags=(*r.flags, "no_free_devices")) for r in ranking
            if not free_devices.get(r.hardware, math.inf) >= r.devices]
    return room + full


@dataclass
class _Plan:
    """One job's rows to score: its runnable candidates, then the reference types the premium
    speed-up needs, with the prices and the types already left out."""

    job: dict[str, Any]
    runnable: list[str]
    refs: list[str]
    prices: dict[str, _Price]
    excluded: list[Excluded]

    @property
    def rows(self) -> list[str]:
        return self.runnable + self.refs


def _plan(serving: Serving, job: dict[str, Any], names: list[str], costs: Catalog,
          price_of: Callable[[str], _Price]) -> _Plan:
    """The rows to encode for ``job``, and the candidates left out before any prediction."""
    model_cat = serving.artifact.catalog
    excluded: list[Excluded] = []
    dpt = job["devices_per_trainer"] or 1
    prices: dict[str, _Price] = {}
    runnable: list[str] = []
    for n in names:
        if n not in model_cat or n not in costs:
            where = "the model's catalog (retrain to include it)" if n not in model_cat \
                else "the cost catalog (add its price)"
            excluded.append(Excluded(n, "unknown_hardware", f"'{n}' is not in {where}"))
            continue
        price = price_of(n)
        if not price.hw.cost_per_device_hour > 0:
            excluded.append(Excluded(n, "invalid_cost", f"cost_per_device_hour of '{n}' is "
                                     f"{price.hw.cost_per_device_hour!r} in the catalog; "
                                     "set a positive price"))
            continue
        if dpt > model_cat[n].devices_per_host:
            excluded.append(Excluded(n, "does_not_fit_host", f"{dpt} devices per trainer "
                                     f"but '{n}' has {model_cat[n].devices_per_host} per "
                                     "host"))
            continue
        prices[n] = price
        runnable.append(n)

    flops = job["flops_per_sample"]
    mfu_rule = flops is not None and flops > 0
    # Without FLOPs, premium types are judged by speed-up over the fastest non-premium
    # type; when no such candidate is left, the model catalog's standard types stand in.
    need_ref = not mfu_rule and any(prices[n].hw.premium for n in runnable) and not any(
        not prices[n].hw.premium for n in runnable)
    refs = [n for n in model_cat if n not in prices and n in costs
            and not costs[n].premium and dpt <= model_cat[n].devices_per_host] \
        if need_ref else []
    return _Plan(job, runnable, refs, prices, excluded)


def _fits(serving: Serving, plan: _Plan, X: np.ndarray) -> np.ndarray:
    """Whether the job fits each row's device memory: the physics estimate says so, or the
    family has succeeded on a type with at least as much memory."""
    proven = serving.family_min_memory_gb.get(str(plan.job["family_id"]), math.inf)
    mem = serving.specs["memory_gb"][[serving.pos[r] for r in plan.rows]]
    return ~(X[:, _COL_MEM_FIT] > 1.0) | (mem >= proven)


def _scores(serving: Serving, X: np.ndarray, fits: np.ndarray, rows: Sequence[str]
            ) -> tuple[np.ndarray, ...]:
    """Samples/s, its 80% interval and the novelty group of each row that fits (NaN and -1
    elsewhere), from one call of the artifact's prediction path."""
    log_tp, log_lo, log_hi, fit_group = serving.artifact.predict_encoded(X[fits])
    bad = ~np.isfinite(log_tp)
    if bad.any():
        which = [r for r, f in zip(rows, fits, strict=True) if f]
        raise FloatingPointError(f"non-finite prediction for "
                                 f"{[which[i] for i in np.flatnonzero(bad)]}")
    tp = np.full(len(rows), np.nan)
    lo, hi = tp.copy(), tp.copy()
    with np.errstate(over="ignore"):
        tp[fits] = np.exp(log_tp)
        lo[fits], hi[fits] = np.exp(log_lo), np.exp(log_hi)
    group = np.full(len(rows), -1)
    group[fits] = fit_group
    if not np.all(np.isfinite(tp[fits] * 3600.0)):
        raise FloatingPointError("predicted throughput overflows")
    return tp, lo, hi, group


def rank_rows(serving: Serving, job: dict[str, Any], names: list[str], costs: Catalog,
              price_of: Callable[[str], _Price], objective: str, budget: float | None,
              risk: str = DEFAULT_RISK) -> tuple[list[RankedType], list[Excluded]]:
    """The preference list of ``names`` for one validated ``job``, and the types left out.

    Encodes the rows (one per runnable type, plus the reference types the premium speed-up
    needs), scores them in one call of the artifact's prediction path, and applies the
    exclusions, flags and premium rule of :mod:`leap.rank.ranker`.
    """
    plan = _plan(serving, job, names, costs, price_of)
    X = serving.encode(job, plan.rows)
    fits = _fits(serving, plan, X)
    return _entries(serving, plan, X, fits, _scores(serving, X, fits, plan.rows), costs,
                    objective, budget, risk)


def rank_rows_many(serving: Serving, jobs: Sequence[dict[str, Any]],
                   names: Sequence[list[str]], costs: Catalog,
                   price_of: Callable[[str], _Price], objective: str, budget: float | None,
                   risk: str = DEFAULT_RISK) -> list[tuple[list[RankedType], list[Excluded]]]:
    """:func:`rank_rows` of each job on its names, with one encoding and one model call for
    the rows of all of them (every row depends only on its own job and type, so each answer
    is the one :func:`rank_rows` gives)."""
    plans = [_plan(serving, job, n, costs, price_of) for job, n in zip(jobs, names, strict=True)]
    X = serving.encode_many([(p.job, p.rows) for p in plans])
    ends = np.cumsum([len(p.rows) for p in plans]).tolist()
    starts = [0, *ends[:-1]]
    fits = np.concatenate([_fits(serving, p, X[a:b]) for p, a, b in zip(plans, starts, ends,
                                                                         strict=True)]
                          ) if plans else np.zeros(0, dtype=bool)
    scores = _scores(serving, X, fits, [r for p in plans for r in p.rows])
    return [_entries(serving, p, X[a:b], fits[a:b], tuple(s[a:b] for s in scores), costs,
                     objective, budget, risk)
            for p, a, b in zip(plans, starts, ends, strict=True)]


def _entries(serving: Serving, plan: _Plan, X: np.ndarray, fits: np.ndarray,
             scores: tuple[np.ndarray, ...], costs: Catalog, objective: str,
             budget: float | None, risk: str) -> tuple[list[RankedType], list[Excluded]]:
    """The exclusions, flags and premium rule over one job's scored rows, in order."""
    job, rows, runnable, prices = plan.job, plan.rows, plan.runnable, plan.prices
    model_cat = serving.artifact.catalog
    excluded = list(plan.excluded)
    devices = int(job["trainer_count"]) * int(job["devices_per_trainer"] or 1)
    flops = job["flops_per_sample"]
    mfu_rule = flops is not None and flops > 0
    tp, lo, hi, group = scores
    no_family = not np.isfinite(X[0, _COL_FAM_N]) if len(rows) else True
    # Plain Python lists: the loop below reads one value at a time, and NumPy scalar
    # access costs far more per read.
    peak = serving.peak_flops(job["precision"], rows).tolist()
    mem_fit, fam_hw_n = X[:, _COL_MEM_FIT].tolist(), X[:, _COL_FAM_HW_N].tolist()
    tp_, fits_ = tp.tolist(), fits.tolist()
    lo_, hi_, group_ = lo.tolist(), hi.tolist(), group.tolist()
    standard = [tp_[i] for i, r in enumerate(rows) if fits_[i] and not costs[r].premium]
    best_standard = max(standard) if standard else None

    ranking: list[RankedType] = []
    for i, n in enumerate(runnable):
        if not fits_[i]:
            excluded.append(Excluded(n, "does_not_fit_memory", f"needs about "
                                     f"{mem_fit[i]:.2f}x the device memory of '{n}' "
                                     f"({model_cat[n].memory_gb:g} GB) and the family has "
                                     "never succeeded on a type with that much memory"))
            continue
        price = prices[n]
        flags: list[str] = []
        if no_family:
            flags.append("missing_family_history")
        if not math.isfinite(fam_hw_n[i]):
            flags.append("missing_hardware_history")
        if not math.isfinite(mem_fit[i]):
            flags.append("memory_fit_unknown")
        interval = math.isfinite(lo_[i]) and math.isfinite(hi_[i])
        if interval and hi_[i] > UNCERTAIN_RATIO * lo_[i]:
            flags.append("uncertain")
        mfu = tp_[i] * flops / (devices * peak[i]) if mfu_rule else None
        if mfu is not None and not mfu <= 1.0:
            flags.append("utilization_above_peak")
        speedup = tp_[i] / best_standard if best_standard else None
        if price.hw.premium:
            kept, why = _premium_rule(price, mfu, speedup)
            if why is not None:
                excluded.append(Excluded(n, "premium_below_threshold", why))
                continue
            flags.append(kept)
        cost_h = devices * price.hw.cost_per_device_hour
        if budget is not None and cost_h > budget:
            excluded.append(Excluded(n, "over_budget", f"cost_per_hour {cost_h:.2f} > "
                                     f"max_cost_per_hour {budget:g}"))
            continue
        ranking.append(RankedType(
            hardware=n, predicted_throughput=tp_[i], cost_per_hour=float(cost_h),
            value=value(tp_[i], cost_h),
            predicted_utilization=mfu if mfu is None or math.isfinite(mfu) else None,
            speedup=speedup if speedup is None or math.isfinite(speedup) else None,
            devices=devices,
            cost_per_device_hour=float(price.hw.cost_per_device_hour),
            premium=price.hw.premium, flags=tuple(flags),
            throughput_p10=lo_[i] if interval else None,
            throughput_p90=hi_[i] if interval else None,
            novelty=NOVELTY_GROUPS[group_[i]]))
    return order_ranking(ranking, objective, risk), excluded
