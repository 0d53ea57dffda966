"""Impact study: will advice save money? Replay days under capacity that matches the work.

Each replayed day is one :class:`~leap.eval.replay.DayProblem` (the capacity model is in
:mod:`leap.eval.replay`: an attempt books the device-hours it really uses on the chosen type,
the same samples at that type's true throughput; one that finds no room waits for its home
type). Arms, all on the same attempts and the same daily budgets:

``baseline``
    no advice: every attempt on its recorded type (the replay reproduces history).
``leap``
    LEAP's preference list (its first ``advice_depth`` types), then the home type.
``leap_aware``
    the same, but the ranker is told each type's free devices when the attempt arrives
    (``Ranker.rank(..., free_devices=)``): types without room go to the end of the list.
``greedy_oracle``
    the types by true value, best first (same depth): greedy, blind to capacity.
``optimum``
    the minimum-cost assignment of the day's attempts under the budgets (a linear program):
    the most any advice could save.

Every attempt is scored with the oracle's true median throughput, in the *same work* view
(the paper's fleet cost): ``cost = device-hours booked x cost_per_device_hour``; an attempt
that waits costs its baseline plus the delay cost. Figures are changes against the baseline
total, split by placement kind (the parts sum to the total), with the top contributors,
trimmed and per-size-band figures, and per-day spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.usage import device_hours, job_devices
from leap.errors import DataError
from leap.eval.ranking import (
    availability_rankings,
    eligible_names,
    leap_rankings,
    true_throughputs,
)
from leap.eval.replay import KINDS, WAITING, DayProblem, Optimum, Replay, optimum, replay

if TYPE_CHECKING:
    from leap.rank.ranker import Ranker
    from leap.sim.fleet import Fleet

#: Arms of the study, in report order.
ARMS: tuple[str, ...] = ("baseline", "leap", "leap_aware", "greedy_oracle", "optimum")
#: The paper's figures (coverage, first choice in attempts and GPU-hours, cost saving).
PAPER: dict[str, float] = {"coverage": 0.95, "first_choice_attempts": 0.199,
                           "first_choice_gpu_hours": 0.300, "cost_saving": 0.03}
#: Job-size bands (devices) of the per-band figures.
BANDS: tuple[tuple[str, float, float], ...] = (("1", 1, 1), ("2-8", 2, 8), ("9-64", 9, 64),
                                               ("65+", 65, math.inf))
TRIM_SHARE = 0.01
TOP_CONTRIBUTORS = 10
Progress = Callable[[str, int, int], None]


# Building the day -------------------------------------------------------------------------------
def day_problem(fleet: Fleet, jobs: pd.DataFrame, candidates: Sequence[Sequence[str]],
                costs: Catalog, names: Sequence[str]) -> tuple[DayProblem, np.ndarray]:
    """One day's :class:`DayProblem` and the true throughput matrix (NaN: not allowed).

    Parameters
    ----------
    fleet : Fleet
        The oracle and the capacity of the day.
    jobs : pandas.DataFrame
        The day's attempts (all statuses), in submission order.
    candidates : sequence of sequences of str
        Each attempt's eligible types (besides its home type).
    costs : Catalog
        Prices.
    names : sequence of str
        The types (columns); must include every attempt's recorded type.
    """
    index = {n: i for i, n in enumerate(names)}
    recorded = jobs["hardware"].astype(str).tolist()
    missing = sorted({h for h in recorded if h not in index})
    if missing:
        raise DataError(f"impact study: recorded hardware {missing} is not in the cost catalog "
                        "and the fleet; add its price to the catalog")
    home = np.array([index[h] for h in recorded], dtype=np.int64)
    allowed = [list(dict.fromkeys([h, *c])) for h, c in zip(recorded, candidates, strict=True)]
    n, t = len(jobs), len(names)
    tp = np.full((n, t), np.nan)
    for j, row in enumerate(true_throughputs(fleet, jobs, allowed)):
        for name, v in row.items():
            tp[j, index[name]] = v
    devices = job_devices(jobs)
    booked = device_hours(jobs)
    rows = np.arange(n)
    tp_home = tp[rows, home]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = tp_home[:, None] / tp
    ok = np.isfinite(ratio) & (ratio > 0)
    demand = np.where(ok, booked[:, None] * np.where(ok, ratio, 1.0), np.inf)
    # Home is always allowed; an attempt that could not run at home (NaN) stays home.
    demand[rows, home] = booked
    demand[~np.isfinite(tp_home)] = np.inf
    demand[rows, home] = booked
    price = np.array([costs[nm].cost_per_device_hour for nm in names], dtype=np.float64)
    day = fleet.day_of(jobs["submitted_at"].to_numpy()[:1])[0] if n else 0
    cap = dict(zip(fleet.hardware_names, fleet.capacity_device_hours(int(day)), strict=True))
    capacity = np.array([cap.get(nm, 0.0) for nm in names])
    used = np.bincount(home, booked, minlength=t)
    # A hair above what history used, so that float sums replay it exactly.
    budget = np.maximum(capacity, used * (1 + 1e-9) + 1e-9)
    return DayProblem(names=tuple(names), home=home, devices=devices, demand=demand,
                      price=price, budget=budget), tp


@dataclass(frozen=True)
class DayArms:
    """One replayed day: the problem, each arm's placement and the optimum."""

    day: str
    jobs: pd.DataFrame
    problem: DayProblem
    tp: np.ndarray
    placements: dict[str, Replay]
    optimum: Optimum
    within_budget: Optimum        # the optimum with every attempt served within the day
    leap_first: np.ndarray        # LEAP's first choice (type index; -1: no ranking)
    ranked: np.ndarray            # LEAP gave a non-empty ranking
    has_candidates: np.ndarray
    unranked_reasons: dict[str, int]


def replay_day(ranker: Ranker, fleet: Fleet, jobs: pd.DataFrame, costs: Catalog, *,
               advice_depth: int | None = 3, delay_cost_weight: float = 1.0,
               aware_arm: bool = True) -> DayArms:
    """Replay one day's attempts in every arm (see the module docstring)."""
    from leap.eval.ranking import oracle_order, true_values

    jobs = jobs.sort_values(["submitted_at", "attempt_id"], kind="stable").reset_index(drop=True)
    model_known = set(ranker.serving.artifact.catalog) if ranker.serving else set(costs)
    names = [n for n in fleet.hardware_names if n in costs]
    known = [n for n in names if n in model_known]
    cands = eligible_names(fleet, jobs, known)
    problem, tp = day_problem(fleet, jobs, cands, costs, names)
    index = {n: i for i, n in enumerate(names)}
    results = leap_rankings(ranker, jobs, cands)
    leap_adv = [[index[r.hardware] for r in res.ranking] for res in results]
    oracle_adv = [[index[n] for n in oracle_order(v)]
                  for v in true_values(fleet, jobs, cands, costs)]
    placements = {"baseline": replay(problem),
                  "leap": replay(problem, leap_adv, depth=advice_depth)}
    if aware_arm:
        rank = availability_rankings(ranker, jobs, cands, results)
        per_device_hours = problem.demand / np.maximum(problem.devices, 1e-12)[:, None]

        def aware(j: int, room: np.ndarray) -> list[int]:
            with np.errstate(divide="ignore", invalid="ignore"):
                free = {n: float(room[index[n]] / per_device_hours[j, index[n]])
                        if per_device_hours[j, index[n]] > 0 else math.inf for n in cands[j]}
            return [index[r.hardware] for r in rank(j, free).ranking]

        placements["leap_aware"] = replay(problem, aware, depth=advice_depth)
    placements["greedy_oracle"] = replay(problem, oracle_adv, depth=advice_depth)
    reasons = pd.Series([r.reason.split(":")[0] for r in results if r.reason],
                        dtype=object).value_counts()
    day = pd.to_datetime(jobs["submitted_at"].iloc[0], utc=True).strftime("%Y-%m-%d")
    return DayArms(day=day, jobs=jobs, problem=problem, tp=tp, placements=placements,
                   optimum=optimum(problem, delay_cost_weight=delay_cost_weight),
                   within_budget=optimum(problem, allow_wait=False),
                   leap_first=np.array([a[0] if a else -1 for a in leap_adv], dtype=np.int64),
                   ranked=np.array([len(a) > 0 for a in leap_adv], dtype=bool),
                   has_candidates=np.array([len(c) > 0 for c in cands], dtype=bool),
                   unranked_reasons={str(k): int(v) for k, v in reasons.items()})


# Per-attempt figures ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ArmCosts:
    """Per-attempt figures of one arm on one day (arrays in the day's row order)."""

    cost: np.ndarray           # fleet cost, same work (waiting: the baseline cost)
    delay_cost: np.ndarray
    kind: np.ndarray           # str: a KINDS entry, or for the optimum moved/home/waiting
    hardware: np.ndarray       # type index (optimum: its largest share)

    @property
    def total(self) -> np.ndarray:
        return self.cost + self.delay_cost


def replay_costs(problem: DayProblem, placed: Replay, *, delay_cost_weight: float = 1.0
                 ) -> ArmCosts:
    """Cost per attempt of one replay (see the module docstring of :mod:`leap.eval.replay`)."""
    rows = np.arange(len(problem.home))
    cost = problem.cost[rows, placed.hardware]
    delay = delay_cost_weight * problem.devices * problem.price[problem.home] \
        * placed.delay_hours
    return ArmCosts(cost=cost, delay_cost=np.where(placed.kind == WAITING, delay, 0.0),
                    kind=np.asarray(KINDS, dtype=object)[placed.kind],
                    hardware=placed.hardware)


def optimum_costs(problem: DayProblem, opt: Optimum, *, delay_cost_weight: float = 1.0
                  ) -> ArmCosts:
    """Per-attempt (expected, for fractional shares) cost of the optimum."""
    n = len(problem.home)
    rows = np.arange(n)
    cost_m = np.where(np.isfinite(problem.cost), problem.cost, 0.0)
    base = problem.baseline_cost
    cost = (opt.share * cost_m).sum(axis=1) + opt.wait_share * base
    delay = opt.wait_share * delay_cost_weight * problem.devices \
        * problem.price[problem.home] * problem.min_delay_hours()
    hw = np.argmax(opt.share, axis=1) if n else np.zeros(0, dtype=np.int64)
    moved = 1.0 - opt.share[rows, problem.home] - opt.wait_share
    kind = np.where(opt.wait_share > 0.5, "waiting", np.where(moved > 0.5, "moved", "home"))
    return ArmCosts(cost=cost, delay_cost=delay, kind=kind.astype(object),
                    hardware=np.where(opt.wait_share > 0.5, problem.home, hw))


# The study --------------------------------------------------------------------------------------
def impact_study(ranker: Ranker, fleet: Fleet, jobs: pd.DataFrame, costs: Catalog, *,
                 advice_depth: int | None = 3, delay_cost_weight: float = 1.0,
                 aware_arm: bool = True, progress: Progress | None = None) -> dict[str, Any]:
    """Replay ``jobs`` (whole days of attempts) in every arm and summarise (module docstring).

    Parameters
    ----------
    ranker : Ranker
        LEAP's ranker (a model trained before the first replayed day).
    fleet : Fleet
        The simulated fleet of the store (oracle and capacity).
    jobs : pandas.DataFrame
        Every attempt of the replayed days, all statuses (they all need capacity).
    costs : Catalog
        Prices (the ranker's cost catalog).
    advice_depth : int or None
        How many of the list's first types the scheduler tries before the home type
        (None: the whole list).
    delay_cost_weight : float
        Cost of an hour of delay of a waiting attempt, per device-hour of its home price.
    aware_arm : bool
        Also replay LEAP told the free devices of each type (``leap_aware``).
    progress : callable, optional
        ``progress(stage, done, total)``.

    Returns
    -------
    dict
        ``headline`` (the optimum's saving, each arm's saving and share of it, coverage and
        first-choice shares beside the paper's), per arm its totals, ``parts`` by placement
        kind, ``top_contributors``, ``trimmed``, ``bands`` and ``per_day``; the definitions.
    """
    if len(jobs) == 0:
        raise DataError("no attempts to replay; pick days the store has (see `leap stats`)")
    for col in ("attempt_id", "submitted_at", "status", "hardware"):
        if col not in jobs.columns:
            raise DataError(f"impact study: the attempts lack column '{col}'")
    if advice_depth is not None and advice_depth < 1:
        raise DataError(f"advice_depth must be >= 1 (or None for the whole list), got "
                        f"{advice_depth}")
    if not delay_cost_weight >= 0:
        raise DataError(f"delay_cost_weight must be >= 0, got {delay_cost_weight}")
    day_key = pd.to_datetime(jobs["submitted_at"], utc=True).dt.strftime("%Y-%m-%d")
    days = sorted(day_key.unique().tolist())
    out_days: list[DayArms] = []
    for i, d in enumerate(days):
        if progress:
            progress("day", i, len(days))
        out_days.append(replay_day(ranker, fleet, jobs[day_key == d], costs,
                                   advice_depth=advice_depth,
                                   delay_cost_weight=delay_cost_weight, aware_arm=aware_arm))
    if progress:
        progress("day", len(days), len(days))
    return summarize(out_days, delay_cost_weight=delay_cost_weight,
                     advice_depth=advice_depth)


def arm_costs_by_day(days: Sequence[DayArms], *, delay_cost_weight: float = 1.0
                     ) -> dict[str, list[ArmCosts]]:
    """Per arm, the per-attempt costs of each day (the optimum's expected ones)."""
    arms: dict[str, list[ArmCosts]] = {}
    for d in days:
        for name, placed in d.placements.items():
            arms.setdefault(name, []).append(
                replay_costs(d.problem, placed, delay_cost_weight=delay_cost_weight))
        arms.setdefault("optimum", []).append(
            optimum_costs(d.problem, d.optimum, delay_cost_weight=delay_cost_weight))
    return arms


def summarize(days: Sequence[DayArms], *, delay_cost_weight: float = 1.0,
              advice_depth: int | None = 3) -> dict[str, Any]:
    """The study's JSON-ready figures from replayed days (see :func:`impact_study`)."""
    costs = arm_costs_by_day(days, delay_cost_weight=delay_cost_weight)
    base = np.concatenate([d.problem.baseline_cost for d in days])
    gpu_h = np.concatenate([d.problem.demand[np.arange(len(d.problem.home)), d.problem.home]
                            for d in days])
    devices = np.concatenate([d.problem.devices for d in days])
    ranked = np.concatenate([d.ranked for d in days])
    has = np.concatenate([d.has_candidates for d in days])
    leap_first = np.concatenate([d.leap_first for d in days])
    ids = pd.concat([d.jobs["attempt_id"] for d in days], ignore_index=True).astype(str)
    names = days[0].problem.names
    home = np.concatenate([d.problem.home for d in days])
    base_total = float(base.sum())

    arms: dict[str, Any] = {}
    for name in ARMS:
        if name not in costs:
            continue
        c = costs[name]
        changes = [_change(float(x.total.sum()), float(d.problem.baseline_cost.sum()))
                   for d, x in zip(days, c, strict=True)]
        per_day = [{"day": d.day, "cost_change": v} for d, v in zip(days, changes, strict=True)]
        arms[name] = _arm_summary(
            cost=np.concatenate([x.cost for x in c]),
            delay=np.concatenate([x.delay_cost for x in c]),
            kind=np.concatenate([x.kind for x in c]),
            hw=np.concatenate([x.hardware for x in c]),
            base=base, gpu_h=gpu_h, devices=devices, leap_first=leap_first, ranked=ranked,
            ids=ids, names=names, home=home) | {"per_day": per_day,
                                                "spread": _spread(changes)}
        if name != "optimum":
            arms[name]["herding"] = _herding(days, name)
    reasons: dict[str, int] = {}
    for d in days:
        for k, v in d.unranked_reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    coverage = {"attempts": _share(ranked[has]), "gpu_hours": _share(ranked[has], gpu_h[has]),
                "eligible_attempts": int(has.sum()), "unranked_reasons": reasons}
    opt_saving = -arms["optimum"]["cost_change"]
    strict = -_change(sum(d.within_budget.cost for d in days), base_total)
    headline: dict[str, Any] = {
        "optimum_saving": opt_saving,
        "optimum_within_budget_saving": strict,
        "coverage": coverage["attempts"], "coverage_gpu_hours": coverage["gpu_hours"],
        "paper": PAPER,
    }
    for name in ("leap", "leap_aware", "greedy_oracle"):
        if name in arms:
            saving = -arms[name]["cost_change"]
            headline[name] = {
                "saving": saving,
                "share_of_optimum": saving / opt_saving if opt_saving > 0 else math.nan,
                "share_of_optimum_within_budget": saving / strict if strict > 0 else math.nan,
                "fleet_saving": -arms[name]["fleet_cost_change"],
                "first_choice_attempts": arms[name]["first_choice_attempts"],
                "first_choice_gpu_hours": arms[name]["first_choice_gpu_hours"]}
    return {
        "days": [d.day for d in days],
        "n_attempts": len(base),
        "gpu_hours": float(gpu_h.sum()),
        "advice_depth": advice_depth or "all",
        "delay_cost_weight": delay_cost_weight,
        "baseline_cost": base_total,
        "optimum_status": sorted({d.optimum.status for d in days}),
        "headline": headline,
        "coverage": coverage,
        "budget_device_hours": float(sum(d.problem.budget.sum() for d in days)),
        "arms": arms,
        "currency": "catalog cost units (USD in the default catalog)",
        "definitions": DEFINITIONS,
    }


DEFINITIONS: dict[str, str] = {
    "capacity": "an attempt books devices x its recorded hours x (true samples/s at home / "
                "on the type): the same work; each type offers max(fleet capacity, what "
                "history ran on it) device-hours a day",
    "cost": "fleet cost for the same work (device-hours booked x cost per device-hour), "
            "plus the delay cost of waiting attempts; changes are against no advice",
    "kinds": "on_advice: the arm's first advised type; displaced: a lower advised type (the "
             "ones above were full); home: the recorded type; waiting: no room, queued for "
             "the home type (delay = queued device-hours up to it / hourly budget); for the "
             "optimum, moved: mostly off its home type",
    "delay_cost": "delay hours x devices x home cost per device-hour x delay_cost_weight",
    "optimum": "linear program: minimum cost of the day's attempts under the budgets, with "
               "waiting priced at its smallest delay; a bound on any advice",
    "optimum_within_budget": "the same linear program without waiting (every attempt served "
                             "within the day): a stricter target, not a bound",
    "greedy_oracle": "types by true value, best first, blind to capacity",
    "leap_aware": "LEAP told each type's free devices when the attempt arrives",
    "coverage": "share of attempts (GPU-hours) with an eligible type that got a ranking",
    "first_choice": "share of all attempts (GPU-hours) placed on the first type of the advice "
                    "they got",
    "trimmed": f"the change without the {TRIM_SHARE:.0%} of attempts with the largest "
               "baseline cost",
    "gpu_hours": "devices x recorded duration_hours",
}


def _change(total: float, base: float) -> float:
    return total / base - 1.0 if base > 0 else math.nan


def _share(mask: np.ndarray, weights: np.ndarray | None = None) -> float:
    w = np.ones(len(mask)) if weights is None else weights
    total = float(w.sum())
    return float((w * mask).sum() / total) if total > 0 else math.nan


def _spread(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    return {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())} \
        if len(v) else {}


def _arm_summary(*, cost: np.ndarray, delay: np.ndarray, kind: np.ndarray, hw: np.ndarray,
                 base: np.ndarray, gpu_h: np.ndarray, devices: np.ndarray,
                 leap_first: np.ndarray, ranked: np.ndarray, ids: pd.Series,
                 names: Sequence[str], home: np.ndarray) -> dict[str, Any]:
    base_total = float(base.sum())
    total = cost + delay
    delta = total - base
    first = kind == "on_advice"
    on_top = (hw == leap_first) & ranked
    parts = {str(k): float(delta[kind == k].sum() / base_total) if base_total > 0 else math.nan
             for k in [*KINDS, "moved"] if (kind == k).any()}
    counts = {str(k): int((kind == k).sum()) for k in [*KINDS, "moved"] if (kind == k).any()}
    order = np.argsort(-np.abs(delta), kind="stable")[:TOP_CONTRIBUTORS]
    top = [{"attempt_id": str(ids.iloc[i]), "devices": int(devices[i]),
            "home": names[home[i]], "placed": names[hw[i]], "kind": str(kind[i]),
            "cost_change": float(delta[i]),
            "share_of_baseline": float(delta[i] / base_total) if base_total > 0 else math.nan}
           for i in order if delta[i] != 0]
    n_trim = math.ceil(TRIM_SHARE * len(base))
    keep = np.ones(len(base), dtype=bool)
    keep[np.argsort(-base, kind="stable")[:n_trim]] = False
    bands = {}
    for label, lo, hi in BANDS:
        m = (devices >= lo) & (devices <= hi)
        if m.any():
            bands[label] = {"attempts": int(m.sum()), "baseline_cost": float(base[m].sum()),
                            "cost_change": _change(float(total[m].sum()), float(base[m].sum()))}
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = cost / base
    finite = np.isfinite(ratio) & (ratio > 0) & (base > 0)
    w = gpu_h[finite]
    return {
        "total_cost": float(total.sum()),
        "fleet_cost": float(cost.sum()),
        "delay_cost": float(delay.sum()),
        "cost_change": _change(float(total.sum()), base_total),
        "fleet_cost_change": _change(float(cost.sum()), base_total),
        "parts": parts,
        "placement": counts,
        "first_choice_attempts": _share(first),
        "first_choice_gpu_hours": _share(first, gpu_h),
        "on_leap_top_attempts": _share(on_top),
        "on_leap_top_gpu_hours": _share(on_top, gpu_h),
        "cost_ratio_median": float(np.median(ratio[finite])) if finite.any() else math.nan,
        "cost_ratio_geomean_gpu_hours": float(np.exp((w * np.log(ratio[finite])).sum()
                                                     / w.sum())) if w.sum() > 0 else math.nan,
        "top_contributors": top,
        "trimmed": {"dropped_attempts": n_trim,
                    "cost_change": _change(float(total[keep].sum()), float(base[keep].sum()))},
        "bands": bands,
    }


def _herding(days: Sequence[DayArms], arm: str) -> dict[str, Any]:
    """How crowded the arm's first choices were: the share of advised attempts that did not
    get their first choice, and the type that took the most first-choice placements."""
    first_counts: dict[str, int] = {}
    advised = full = 0
    for d in days:
        placed = d.placements[arm]
        for name, cnt in pd.Series(np.asarray(d.problem.names, dtype=object)[
                placed.hardware[placed.kind == 0]]).value_counts().items():
            first_counts[str(name)] = first_counts.get(str(name), 0) + int(cnt)
        if arm == "baseline":
            continue
        # An attempt placed below its first advice, at home or waiting while it had advice,
        # found its first choice full (or its list empty).
        with_advice = d.ranked if arm.startswith("leap") else d.has_candidates
        advised += int(with_advice.sum())
        full += int((with_advice & (placed.kind != 0)).sum())
    top = max(first_counts.items(), key=lambda kv: kv[1]) if first_counts else ("", 0)
    return {"first_choice_full_share": full / advised if advised else math.nan,
            "most_common_first_choice": top[0],
            "most_common_first_choice_attempts": top[1]}


def top_choice_table(study: Mapping[str, Any], arms: Sequence[str] = ARMS
                     ) -> list[dict[str, Any]]:
    """Flat rows (one per arm) of the headline impact numbers, for tables and plots."""
    rows = []
    for name in arms:
        if name not in study["arms"]:
            continue
        a = study["arms"][name]
        rows.append({"arm": name, "first_choice_attempts": a["first_choice_attempts"],
                     "first_choice_gpu_hours": a["first_choice_gpu_hours"],
                     "total_cost": a["total_cost"], "cost_change": a["cost_change"],
                     "fleet_cost_change": a["fleet_cost_change"],
                     "trimmed_cost_change": a["trimmed"]["cost_change"],
                     **{f"part_{k}": v for k, v in a["parts"].items()}})
    return rows
