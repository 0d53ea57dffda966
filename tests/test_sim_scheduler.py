"""The capacity-limited baseline scheduler: budgets, preference order, advice, replay."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leap.catalog import Catalog
from leap.errors import CatalogError, DataError
from leap.sim.fleet import Fleet
from leap.sim.run import simulate_day
from leap.sim.scenario import Scenario
from leap.sim.scheduler import CHOICES, CapacityScheduler, assign

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SMALL = Scenario.load().override(initial_families=400, n_model_types=80,
                                 new_families_per_day=20.0, attempts_per_day=1500)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60), t=st.integers(1, 6),
       k=st.integers(0, 3))
def test_within_capacity_placements_never_exceed_a_budget(seed: int, n: int, t: int,
                                                           k: int) -> None:
    rng = np.random.default_rng(seed)
    eligible = rng.uniform(size=(n, t)) < 0.7
    pref = np.where(rng.uniform(size=(n, k)) < 0.8, rng.integers(0, t, (n, k)), -1)
    demand = rng.exponential(1.0, n)
    capacity = rng.uniform(0, n / t, t)
    out = assign(pref, eligible, demand, capacity, np.ones(t), np.random.default_rng(seed))
    within = out.choice != CHOICES.index("over_capacity")
    used = np.bincount(out.hardware[within], demand[within], minlength=t)
    assert (used <= capacity + 1e-9).all()
    assert ((out.hardware >= 0) & (out.hardware < t)).all()
    # Placed on an eligible type whenever the row has one.
    has = eligible.any(axis=1)
    assert eligible[np.flatnonzero(has), out.hardware[has]].all()
    # A preference taken is the one at its rank.
    ranked = out.rank >= 0
    assert (pref[ranked, out.rank[ranked]] == out.hardware[ranked]).all()


def test_earlier_attempts_get_their_first_choice_first() -> None:
    pref = np.array([[0, 1]] * 4)
    out = assign(pref, np.ones((4, 2), dtype=bool), np.ones(4), np.array([2.0, 1.0]),
                 np.ones(2), np.random.default_rng(0))
    assert out.hardware.tolist()[:3] == [0, 0, 1]
    assert out.choice.tolist()[3] == CHOICES.index("over_capacity")


def test_a_huge_request_does_not_block_later_small_ones() -> None:
    pref = np.array([[0], [0], [0]])
    out = assign(pref, np.ones((3, 1), dtype=bool), np.array([1.0, 50.0, 1.0]),
                 np.array([3.0]), np.ones(1), np.random.default_rng(0))
    assert out.choice.tolist() == [CHOICES.index("home"), CHOICES.index("over_capacity"),
                                   CHOICES.index("home")]


@pytest.fixture(scope="module")
def day_fleet() -> tuple[Fleet, object]:
    fleet = Fleet(SMALL, Catalog.default(), 11, T0)
    return fleet, simulate_day(fleet, 3).table


def test_replaying_a_day_without_advice_reproduces_its_placements(day_fleet: tuple) -> None:
    _, table = day_fleet
    # The replay rebuilds the fleet from scratch, as evaluation code would.
    fresh = Fleet(SMALL, Catalog.default(), 11, T0)
    placed = CapacityScheduler(fresh).place(table)
    assert placed.hardware.tolist() == table.column("hardware").to_pylist()
    assert (placed.advice_rank == -1).all()
    assert set(placed.choice.tolist()) <= {"home", "other", "over_capacity"}
    # Input order does not matter: rows are served by submission time.
    shuffled = table.take(np.random.default_rng(0).permutation(table.num_rows))
    again = CapacityScheduler(fresh).place(shuffled)
    assert again.hardware.tolist() == shuffled.column("hardware").to_pylist()


def test_advice_is_followed_when_eligible_and_capacity_allows(day_fleet: tuple) -> None:
    fleet, table = day_fleet
    eligible = fleet.eligible(table, table.column("submitted_at"))
    cost = fleet.pool.cost_per_device_hour
    advice = [[fleet.hardware_names[j] for j in np.argsort(np.where(e, cost, np.inf))[:2]
               if e[j]] for e in eligible]
    placed = CapacityScheduler(fleet).place(table, advice=advice)
    took = placed.choice == "advice"
    # Cheap types are small pools: capacity, not the advice, limits how often it is taken.
    assert took.mean() > 0.1
    for i in np.flatnonzero(took)[:200]:
        assert placed.hardware[i] == advice[i][placed.advice_rank[i]]
    # Following cheap advice lowers the fleet's cost per device-hour.
    idx = {n: i for i, n in enumerate(fleet.hardware_names)}
    base = np.array([cost[idx[h]] for h in table.column("hardware").to_pylist()])
    advised = np.array([cost[idx[h]] for h in placed.hardware])
    assert advised.mean() < base.mean()


def test_advice_errors_name_the_problem(day_fleet: tuple) -> None:
    fleet, table = day_fleet
    with pytest.raises(DataError, match=r"got 1 advice lists for \d+ jobs"):
        CapacityScheduler(fleet).place(table, advice=[["T4"]])
    bad = [["H10O"]] + [[] for _ in range(table.num_rows - 1)]
    with pytest.raises(CatalogError, match="advice for job 0 names unknown hardware 'H10O'"):
        CapacityScheduler(fleet).place(table, advice=bad)
