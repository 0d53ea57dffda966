"""The impact study's figures: each arm's per-attempt costs and their summary (the headline,
parts by placement kind, top contributors, trimmed and per-band figures, per-day spread,
herding) as :class:`ImpactFigures`; the replay itself is :mod:`leap.eval.impact`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from leap.eval.replay import KINDS, WAITING, DayProblem, Optimum, Replay
from leap.records import Record

if TYPE_CHECKING:
    from leap.eval.impact import DayArms

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


# The figures ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contributor(Record):
    """One attempt among those that move an arm's total most."""

    attempt_id: str
    devices: int
    home: str
    placed: str
    kind: str
    cost_change: float
    share_of_baseline: float


@dataclass(frozen=True)
class Trimmed(Record):
    """An arm's cost change without the attempts of largest baseline cost."""

    dropped_attempts: int
    cost_change: float


@dataclass(frozen=True)
class Band(Record):
    """An arm's figures on one job-size band (devices)."""

    attempts: int
    baseline_cost: float
    cost_change: float


@dataclass(frozen=True)
class DayChange(Record):
    """An arm's cost change on one replayed day."""

    day: str
    cost_change: float


@dataclass(frozen=True)
class Herding(Record):
    """How crowded an arm's first choices were (see :func:`_herding`)."""

    first_choice_full_share: float
    most_common_first_choice: str
    most_common_first_choice_attempts: int


@dataclass(frozen=True)
class ArmSummary(Record):
    """One arm over the replayed days: totals, changes against no advice, their parts by
    placement kind, first-choice shares, top contributors, trimmed, per band and per day."""

    OMIT_NONE = frozenset({"herding"})

    total_cost: float
    fleet_cost: float
    delay_cost: float
    cost_change: float
    fleet_cost_change: float
    parts: dict[str, float]
    placement: dict[str, int]
    first_choice_attempts: float
    first_choice_gpu_hours: float
    on_leap_top_attempts: float
    on_leap_top_gpu_hours: float
    cost_ratio_median: float
    cost_ratio_geomean_gpu_hours: float
    top_contributors: list[Contributor]
    trimmed: Trimmed
    bands: dict[str, Band]
    per_day: list[DayChange]
    spread: dict[str, float]
    herding: Herding | None = None


@dataclass(frozen=True)
class HeadlineArm(Record):
    """An advice arm's saving beside the optimum's, and its first-choice shares."""

    saving: float
    share_of_optimum: float
    share_of_optimum_within_budget: float
    fleet_saving: float
    first_choice_attempts: float
    first_choice_gpu_hours: float


@dataclass(frozen=True)
class Headline(Record):
    """The optimum's saving, LEAP's coverage and each advice arm beside the paper."""

    OMIT_NONE = frozenset({"leap", "leap_aware", "greedy_oracle"})

    optimum_saving: float
    optimum_within_budget_saving: float
    coverage: float
    coverage_gpu_hours: float
    paper: dict[str, float]
    leap: HeadlineArm | None = None
    leap_aware: HeadlineArm | None = None
    greedy_oracle: HeadlineArm | None = None

    def arm(self, name: str) -> HeadlineArm | None:
        """The arm called ``name`` (``leap``, ``leap_aware``, ``greedy_oracle``), if run."""
        found: HeadlineArm | None = getattr(self, name, None)
        return found


@dataclass(frozen=True)
class ImpactCoverage(Record):
    """Share of attempts (GPU-hours) with an eligible type that LEAP ranked, and why not."""

    attempts: float
    gpu_hours: float
    eligible_attempts: int
    unranked_reasons: dict[str, int]


@dataclass(frozen=True)
class ImpactFigures(Record):
    """The impact study (:func:`leap.eval.impact.impact_study`): its JSON is :meth:`to_dict`."""

    days: list[str]
    n_attempts: int
    gpu_hours: float
    advice_depth: int | str
    delay_cost_weight: float
    baseline_cost: float
    optimum_status: list[str]
    headline: Headline
    coverage: ImpactCoverage
    budget_device_hours: float
    arms: dict[str, ArmSummary]
    currency: str
    definitions: dict[str, str]


# Per-attempt costs ------------------------------------------------------------------------------
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
              advice_depth: int | None = 3) -> ImpactFigures:
    """The study's figures from replayed days (see :func:`impact_study`)."""
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

    arms: dict[str, ArmSummary] = {}
    for name in ARMS:
        if name not in costs:
            continue
        c = costs[name]
        changes = [_change(float(x.total.sum()), float(d.problem.baseline_cost.sum()))
                   for d, x in zip(days, c, strict=True)]
        arms[name] = _arm_summary(
            cost=np.concatenate([x.cost for x in c]),
            delay=np.concatenate([x.delay_cost for x in c]),
            kind=np.concatenate([x.kind for x in c]),
            hw=np.concatenate([x.hardware for x in c]),
            base=base, gpu_h=gpu_h, devices=devices, leap_first=leap_first, ranked=ranked,
            ids=ids, names=names, home=home,
            per_day=[DayChange(d.day, v) for d, v in zip(days, changes, strict=True)],
            spread=_spread(changes),
            herding=None if name == "optimum" else _herding(days, name))
    reasons: dict[str, int] = {}
    for d in days:
        for k, v in d.unranked_reasons.items():
            reasons[k] = reasons.get(k, 0) + v
    coverage = ImpactCoverage(attempts=_share(ranked[has]),
                              gpu_hours=_share(ranked[has], gpu_h[has]),
                              eligible_attempts=int(has.sum()), unranked_reasons=reasons)
    opt_saving = -arms["optimum"].cost_change
    strict = -_change(sum(d.within_budget.cost for d in days), base_total)

    def headline_arm(name: str) -> HeadlineArm | None:
        if name not in arms:
            return None
        a = arms[name]
        saving = -a.cost_change
        return HeadlineArm(
            saving=saving,
            share_of_optimum=saving / opt_saving if opt_saving > 0 else math.nan,
            share_of_optimum_within_budget=saving / strict if strict > 0 else math.nan,
            fleet_saving=-a.fleet_cost_change, first_choice_attempts=a.first_choice_attempts,
            first_choice_gpu_hours=a.first_choice_gpu_hours)

    headline = Headline(optimum_saving=opt_saving, optimum_within_budget_saving=strict,
                        coverage=coverage.attempts, coverage_gpu_hours=coverage.gpu_hours,
                        paper=PAPER, leap=headline_arm("leap"),
                        leap_aware=headline_arm("leap_aware"),
                        greedy_oracle=headline_arm("greedy_oracle"))
    return ImpactFigures(
        days=[d.day for d in days],
        n_attempts=len(base),
        gpu_hours=float(gpu_h.sum()),
        advice_depth=advice_depth or "all",
        delay_cost_weight=delay_cost_weight,
        baseline_cost=base_total,
        optimum_status=sorted({d.optimum.status for d in days}),
        headline=headline,
        coverage=coverage,
        budget_device_hours=float(sum(d.problem.budget.sum() for d in days)),
        arms=arms,
        currency="catalog cost units (USD in the default catalog)",
        definitions=DEFINITIONS,
    )


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
                 names: Sequence[str], home: np.ndarray, per_day: list[DayChange],
                 spread: dict[str, float], herding: Herding | None) -> ArmSummary:
    base_total = float(base.sum())
    total = cost + delay
    delta = total - base
    first = kind == "on_advice"
    on_top = (hw == leap_first) & ranked
    parts = {str(k): float(delta[kind == k].sum() / base_total) if base_total > 0 else math.nan
             for k in [*KINDS, "moved"] if (kind == k).any()}
    counts = {str(k): int((kind == k).sum()) for k in [*KINDS, "moved"] if (kind == k).any()}
    order = np.argsort(-np.abs(delta), kind="stable")[:TOP_CONTRIBUTORS]
    top = [Contributor(attempt_id=str(ids.iloc[i]), devices=int(devices[i]),
                       home=names[home[i]], placed=names[hw[i]], kind=str(kind[i]),
                       cost_change=float(delta[i]),
                       share_of_baseline=float(delta[i] / base_total) if base_total > 0
                       else math.nan)
           for i in order if delta[i] != 0]
    n_trim = math.ceil(TRIM_SHARE * len(base))
    keep = np.ones(len(base), dtype=bool)
    keep[np.argsort(-base, kind="stable")[:n_trim]] = False
    bands: dict[str, Band] = {}
    for label, lo, hi in BANDS:
        m = (devices >= lo) & (devices <= hi)
        if m.any():
            bands[label] = Band(attempts=int(m.sum()), baseline_cost=float(base[m].sum()),
                                cost_change=_change(float(total[m].sum()),
                                                    float(base[m].sum())))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = cost / base
    finite = np.isfinite(ratio) & (ratio > 0) & (base > 0)
    w = gpu_h[finite]
    return ArmSummary(
        total_cost=float(total.sum()),
        fleet_cost=float(cost.sum()),
        delay_cost=float(delay.sum()),
        cost_change=_change(float(total.sum()), base_total),
        fleet_cost_change=_change(float(cost.sum()), base_total),
        parts=parts,
        placement=counts,
        first_choice_attempts=_share(first),
        first_choice_gpu_hours=_share(first, gpu_h),
        on_leap_top_attempts=_share(on_top),
        on_leap_top_gpu_hours=_share(on_top, gpu_h),
        cost_ratio_median=float(np.median(ratio[finite])) if finite.any() else math.nan,
        cost_ratio_geomean_gpu_hours=float(np.exp((w * np.log(ratio[finite])).sum()
                                                  / w.sum())) if w.sum() > 0 else math.nan,
        top_contributors=top,
        trimmed=Trimmed(dropped_attempts=n_trim,
                        cost_change=_change(float(total[keep].sum()), float(base[keep].sum()))),
        bands=bands,
        per_day=per_day,
        spread=spread,
        herding=herding,
    )


def _herding(days: Sequence[DayArms], arm: str) -> Herding:
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
    return Herding(first_choice_full_share=full / advised if advised else math.nan,
                   most_common_first_choice=top[0], most_common_first_choice_attempts=top[1])
