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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.usage import device_hours, job_devices
from leap.errors import DataError
from leap.eval.impact_summary import ImpactFigures, summarize
from leap.eval.ranking import (
    availability_rankings,
    eligible_names,
    leap_rankings,
    true_throughputs,
)
from leap.eval.replay import DayProblem, Optimum, Replay, optimum, replay

if TYPE_CHECKING:
    from leap.rank.ranker import Ranker
    from leap.sim.fleet import Fleet

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
def impact_study(ranker: Ranker, fleet: Fleet, jobs: pd.DataFrame, costs: Catalog, *,
                 advice_depth: int | None = 3, delay_cost_weight: float = 1.0,
                 aware_arm: bool = True, progress: Progress | None = None) -> ImpactFigures:
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
    ImpactFigures
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
