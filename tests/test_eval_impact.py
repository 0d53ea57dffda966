"""Impact study: the capacity model and the optimum by hand, and the invariants on the small
fleet (cost x value = 1, first choice never costs more, parts sum, the optimum bounds all)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import DataError
from leap.eval.impact import DayArms, impact_study, replay_day
from leap.eval.impact_summary import (
    ARMS,
    ImpactFigures,
    arm_costs_by_day,
    replay_costs,
    summarize,
)
from leap.eval.ranking import (
    availability_rankings,
    eligible_names,
    leap_rankings,
    oracle_order,
    true_values,
)
from leap.eval.replay import KINDS, DayProblem, optimum, replay
from leap.model.artifact import Registry
from leap.model.window import load_attempts
from leap.rank.ranker import Ranker
from leap.sim.fleet import Fleet

LAST = datetime(2026, 1, 12, tzinfo=UTC)
CAT = Catalog.default()


def problem(demand: list[list[float]], price: list[float], budget: list[float],
            home: list[int], devices: list[float] | None = None) -> DayProblem:
    n = len(demand)
    return DayProblem(names=tuple("ABCDEFG"[:len(price)]), home=np.array(home),
                      devices=np.ones(n) if devices is None else np.array(devices, dtype=float),
                      demand=np.array(demand, dtype=float), price=np.array(price, dtype=float),
                      budget=np.array(budget, dtype=float))


# The capacity model by hand -----------------------------------------------------------------
def test_replay_takes_advice_with_room_then_home_then_waits() -> None:
    # Three attempts at home on A (2 device-hours each); B is faster (1) and cheaper per work.
    p = problem([[2, 1], [2, 1], [2, 1]], price=[1.0, 1.5], budget=[4.0, 1.0], home=[0, 0, 0])
    r = replay(p, [[1, 0], [1, 0], [1]])
    assert r.hardware.tolist() == [1, 0, 0]
    assert [KINDS[k] for k in r.kind] == ["on_advice", "displaced", "home"]
    assert r.used.tolist() == [4.0, 1.0]
    # A smaller home budget: the third attempt waits; its delay is the queue / hourly budget.
    tight = replace(p, budget=np.array([2.0, 1.0]))
    r = replay(tight, [[1], [1], [1]])
    assert [KINDS[k] for k in r.kind] == ["on_advice", "home", "waiting"]
    assert r.delay_hours.tolist() == pytest.approx([0, 0, 2 / (2 / 24)])
    c = replay_costs(tight, r, delay_cost_weight=0.5)
    assert c.cost.tolist() == pytest.approx([1.5, 2.0, 2.0])
    assert c.delay_cost.tolist() == pytest.approx([0, 0, 0.5 * 1 * 1.0 * 24])
    # Only `depth` entries of a list are tried.
    assert [KINDS[k] for k in replay(p, [[0, 1]] * 3).kind] == ["on_advice", "on_advice",
                                                                "displaced"]
    assert [KINDS[k] for k in replay(p, [[0, 1]] * 3, depth=1).kind] == ["on_advice",
                                                                         "on_advice", "waiting"]


def test_day_problem_checks_its_shapes() -> None:
    with pytest.raises(DataError, match="allowed on its home type"):
        problem([[np.inf, 1]], price=[1, 1], budget=[1, 1], home=[0])
    with pytest.raises(DataError, match="2 demand columns but 3 names"):
        DayProblem(("A", "B", "C"), np.array([0]), np.ones(1), np.ones((1, 2)), np.ones(2),
                   np.ones(2))


def _brute_force(p: DayProblem, weight: float) -> float:
    """Cheapest integral placement (a type with room, or waiting at its smallest delay)."""
    n, t = p.demand.shape
    wait = p.baseline_cost + weight * p.devices * p.price[p.home] * p.min_delay_hours()
    best = np.inf
    for choice in itertools.product(range(t + 1), repeat=n):
        used = np.zeros(t)
        cost = 0.0
        for j, c in enumerate(choice):
            if c == t:
                cost += wait[j]
            elif np.isfinite(p.demand[j, c]):
                used[c] += p.demand[j, c]
                cost += p.demand[j, c] * p.price[c]
            else:
                cost = np.inf
        if (used <= p.budget + 1e-9).all():
            best = min(best, cost)
    return float(best)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 5), t=st.integers(1, 3))
def test_the_optimum_against_brute_force_on_tiny_fleets(seed: int, n: int, t: int) -> None:
    rng = np.random.default_rng(seed)
    home = rng.integers(0, t, n)
    price = rng.uniform(0.5, 3.0, t)
    # Unit demands make the LP integral (a transportation problem): it equals brute force.
    unit = np.where(rng.uniform(size=(n, t)) < 0.8, 1.0, np.inf)
    unit[np.arange(n), home] = 1.0
    # Budgets hold at least what the attempts at home use, as in the study.
    at_home = np.bincount(home, minlength=t).astype(float)
    p = DayProblem(tuple("ABC"[:t]), home, np.ones(n), unit, price,
                   np.maximum(at_home, rng.integers(0, n + 1, t)))
    assert optimum(p, delay_cost_weight=0.3).cost == pytest.approx(_brute_force(p, 0.3),
                                                                   rel=1e-6)
    # Any demands: the LP relaxation is never above the best integral placement.
    demand = np.where(np.isfinite(unit), rng.exponential(2.0, (n, t)), np.inf)
    used = np.bincount(home, demand[np.arange(n), home], minlength=t)
    q = replace(p, demand=demand, budget=np.maximum(used, rng.uniform(0, 2 * n, t)))
    assert optimum(q).cost <= _brute_force(q, 1.0) * (1 + 1e-6) + 1e-9


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), t=st.integers(1, 5),
       depth=st.sampled_from([1, 2, None]))
def test_the_optimum_is_never_worse_than_a_replay(seed: int, n: int, t: int,
                                                   depth: int | None) -> None:
    rng = np.random.default_rng(seed)
    home = rng.integers(0, t, n)
    demand = np.where(rng.uniform(size=(n, t)) < 0.7, rng.exponential(2.0, (n, t)), np.inf)
    demand[np.arange(n), home] = rng.exponential(2.0, n)
    used = np.bincount(home, demand[np.arange(n), home], minlength=t)
    p = DayProblem(tuple("ABCDE"[:t]), home, rng.integers(1, 9, n).astype(float), demand,
                   rng.uniform(0.5, 3.0, t), np.maximum(used, rng.uniform(0, 3 * n / t, t)))
    advice = [list(rng.permutation(t)) for _ in range(n)]
    placed = replay(p, advice, depth=depth)
    within = placed.kind != KINDS.index("waiting")
    assert (np.bincount(placed.hardware[within], demand[np.arange(n), placed.hardware][within],
                        minlength=t) <= p.budget * (1 + 1e-8) + 1e-9).all()
    cost = replay_costs(p, placed)
    assert optimum(p).cost <= cost.total.sum() * (1 + 1e-7) + 1e-9
    # Without advice the recorded placement fits: nobody waits, nothing changes.
    assert (replay(p).kind == KINDS.index("home")).all()


# The study on the small fleet ---------------------------------------------------------------
@pytest.fixture(scope="module")
def day(trained_workspace: Workspace) -> tuple[DayArms, Fleet]:
    art = Registry(trained_workspace.models_dir).load()
    with Store(trained_workspace.store_path, read_only=True) as store:
        fleet = Fleet.from_store(store)
        jobs = load_attempts(store, LAST, LAST + timedelta(days=1))
    return replay_day(Ranker(art), fleet, jobs, art.catalog), fleet


@pytest.fixture(scope="module")
def study(day: tuple[DayArms, Fleet]) -> ImpactFigures:
    return summarize([day[0]])


def test_no_advice_reproduces_history(day: tuple[DayArms, Fleet],
                                      study: ImpactFigures) -> None:
    d, _ = day
    base = d.placements["baseline"]
    assert (base.hardware == d.problem.home).all()
    assert (base.kind == KINDS.index("home")).all()
    assert study.arms["baseline"].cost_change == 0.0
    assert (np.asarray(d.problem.names)[d.problem.home]
            == d.jobs["hardware"].astype(str).to_numpy()).all()


def test_cost_ratio_times_value_ratio_is_one(day: tuple[DayArms, Fleet]) -> None:
    d, _ = day
    p, rows = d.problem, np.arange(len(d.problem.home))
    for arm in ("leap", "leap_aware", "greedy_oracle"):
        hw = d.placements[arm].hardware
        tp_home, tp = d.tp[rows, p.home], d.tp[rows, hw]
        ok = np.isfinite(tp_home) & (p.demand[rows, p.home] > 0)
        cost_ratio = p.cost[rows, hw][ok] / p.baseline_cost[ok]
        value_ratio = (tp[ok] / p.price[hw][ok]) / (tp_home[ok] / p.price[p.home][ok])
        assert np.allclose(cost_ratio * value_ratio, 1.0, rtol=1e-9)


def test_the_first_oracle_choice_never_costs_more(day: tuple[DayArms, Fleet]) -> None:
    d, _ = day
    placed = d.placements["greedy_oracle"]
    cost = replay_costs(d.problem, placed)
    first = placed.kind == KINDS.index("on_advice")
    assert first.sum() > 0
    assert (cost.cost[first] <= d.problem.baseline_cost[first] * (1 + 1e-9)).all()


def test_with_unlimited_capacity_the_greedy_oracle_is_its_first_choice(
        day: tuple[DayArms, Fleet]) -> None:
    d, fleet = day
    p = replace(d.problem, budget=np.full(len(d.problem.names), np.inf))
    names = list(p.names)
    cands = [[names[t] for t in np.flatnonzero(np.isfinite(p.demand[j]))]
             for j in range(len(p.home))]
    values = true_values(fleet, d.jobs, cands, CAT)
    advice = [[names.index(n) for n in oracle_order(v)] for v in values]
    placed = replay(p, advice, depth=3)
    best = np.array([a[0] for a in advice])
    assert (placed.hardware == best).all()
    assert (placed.kind == KINDS.index("on_advice")).all()
    cost = replay_costs(p, placed)
    assert cost.total.sum() <= p.baseline_cost.sum() * (1 + 1e-12)
    assert (cost.cost <= p.baseline_cost * (1 + 1e-9)).all()


def test_parts_sum_to_the_total_and_the_optimum_bounds_every_arm(
        day: tuple[DayArms, Fleet], study: ImpactFigures) -> None:
    d, _ = day
    assert list(study.arms) == list(ARMS)
    for name, a in study.arms.items():
        assert sum(a.parts.values()) == pytest.approx(a.cost_change, abs=1e-9), name
        assert sum(a.placement.values()) == study.n_attempts
        assert a.cost_change >= study.arms["optimum"].cost_change - 1e-7, name
    costs = arm_costs_by_day([d])
    assert costs["optimum"][0].total.sum() == pytest.approx(d.optimum.cost, rel=1e-9)
    assert d.optimum.cost <= min(c[0].total.sum() for c in costs.values()) * (1 + 1e-7)
    # Nobody waiting is a stricter target: dearer than the bound, never dearer than no advice.
    assert (d.within_budget.wait_share == 0).all()
    assert d.optimum.cost <= d.within_budget.cost * (1 + 1e-7)
    assert d.within_budget.cost <= d.problem.baseline_cost.sum() * (1 + 1e-7)
    hl = study.headline
    assert hl.optimum_saving == pytest.approx(-study.arms["optimum"].cost_change)
    assert hl.optimum_saving > 0  # the budgets leave room to save
    for arm in ("leap", "leap_aware", "greedy_oracle"):
        h = hl.arm(arm)
        assert h is not None and h.share_of_optimum <= 1.0 + 1e-7
    assert 0.95 <= study.coverage.attempts <= 1.0


def test_advice_is_followed_and_the_figures_are_consistent(study: ImpactFigures) -> None:
    leap = study.arms["leap"]
    assert leap.placement["on_advice"] > 0
    assert 0.0 < leap.first_choice_attempts <= 1.0
    assert leap.first_choice_attempts == pytest.approx(
        leap.placement["on_advice"] / study.n_attempts)
    # The aware arm offers types with room first: fewer first choices found full.
    aware, herding = study.arms["leap_aware"].herding, leap.herding
    assert aware is not None and herding is not None
    assert aware.first_choice_full_share <= herding.first_choice_full_share
    assert study.arms["optimum"].herding is None
    assert leap.top_contributors
    assert abs(leap.top_contributors[0].cost_change) >= \
        abs(leap.top_contributors[-1].cost_change)
    assert sum(b.attempts for b in leap.bands.values()) == study.n_attempts


def test_figures_read_back_to_the_same_json(study: ImpactFigures) -> None:
    text = json.dumps(study.to_dict())
    data = json.loads(text)
    assert "herding" not in data["arms"]["optimum"] and "herding" in data["arms"]["leap"]
    assert list(data["headline"])[-3:] == ["leap", "leap_aware", "greedy_oracle"]
    assert json.dumps(ImpactFigures.from_dict(data).to_dict()) == text


def test_the_folded_answers_equal_the_rankers_own(trained_workspace: Workspace,
                                                  day: tuple[DayArms, Fleet]) -> None:
    d, fleet = day
    ranker = Ranker(Registry(trained_workspace.models_dir).load())
    jobs = d.jobs.iloc[:40].reset_index(drop=True)
    cands = eligible_names(fleet, jobs, list(d.problem.names))
    folded = availability_rankings(ranker, jobs, cands, leap_rankings(ranker, jobs, cands))
    asked = availability_rankings(ranker, jobs, cands)
    rng = np.random.default_rng(0)
    for i in range(len(jobs)):
        free = {n: float(rng.choice([0.0, 1e9])) for n in cands[i]}
        a, b = folded(i, free), asked(i, free)
        assert [(r.hardware, r.flags) for r in a.ranking] == \
            [(r.hardware, r.flags) for r in b.ranking]


def test_impact_errors(trained_workspace: Workspace) -> None:
    art = Registry(trained_workspace.models_dir).load()
    with Store(trained_workspace.store_path, read_only=True) as store:
        fleet = Fleet.from_store(store)
        jobs = load_attempts(store, LAST, LAST + timedelta(hours=1))
    with pytest.raises(DataError, match="no attempts to replay"):
        impact_study(Ranker(art), fleet, jobs.iloc[:0], CAT)
    with pytest.raises(DataError, match="advice_depth must be >= 1"):
        impact_study(Ranker(art), fleet, jobs, CAT, advice_depth=0)
    with pytest.raises(DataError, match="lack column 'status'"):
        impact_study(Ranker(art), fleet, jobs.drop(columns=["status"]), CAT)
    with pytest.raises(DataError, match="delay_cost_weight must be >= 0"):
        impact_study(Ranker(art), fleet, jobs, CAT, delay_cost_weight=-1.0)
