"""Calibration of the reference fleet against the spec: varied, sparse, honestly noisy."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from leap.catalog import Catalog
from leap.data.store import Store
from leap.metrics import within
from leap.sim.calibrate import calibrate, calibration_from_table, check_targets
from leap.sim.fleet import Fleet
from leap.sim.run import simulate, simulate_day
from leap.sim.scenario import Scenario

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAYS = 14


@pytest.fixture(scope="module", params=[1, 2])
def default_fleet(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Two weeks of the default (full-size) fleet, in memory: about 350,000 attempts."""
    fleet = Fleet(Scenario.load(), Catalog.default(), request.param, T0)
    table = pa.concat_tables([simulate_day(fleet, d).table for d in range(DAYS)])
    return calibration_from_table(fleet, table)


def test_volume_matches_the_paper_fleet(default_fleet: dict[str, Any]) -> None:
    cal = default_fleet
    assert cal["days"] == DAYS
    assert cal["attempts_per_day"] == 25000
    assert cal["families"] > 5000
    assert cal["model_types"] > 500
    assert cal["hardware_types_used"] == len(Catalog.default())
    assert 120 < cal["new_families_per_day"] < 180


def test_throughput_spans_at_least_five_orders_of_magnitude(default_fleet: dict[str, Any]
                                                            ) -> None:
    assert default_fleet["throughput_span_orders"] >= 5.0


def test_oracle_ceiling_is_between_85_and_95_percent(default_fleet: dict[str, Any]) -> None:
    assert 0.85 <= default_fleet["oracle_ceiling"] <= 0.95
    # GPU-hour weighting rests on few huge attempts: only roughly the same.
    assert 0.8 <= default_fleet["oracle_ceiling_gpu_hours"] <= 0.98


def test_most_families_are_seen_on_few_of_their_eligible_types(default_fleet: dict[str, Any]
                                                               ) -> None:
    assert default_fleet["observed_pair_share"] < 0.4
    assert default_fleet["median_observed_types_per_family"] <= 4
    assert default_fleet["median_eligible_types_per_family"] >= 10


def test_gpu_hours_are_heavy_tailed_and_statuses_realistic(default_fleet: dict[str, Any]
                                                           ) -> None:
    cal = default_fleet
    assert cal["gpu_hours_share_of_top_1pct_attempts"] > 0.2
    share = cal["status_share"]
    assert 0.85 < share["succeeded"] < 0.95
    assert 0.03 < share["failed"] < 0.05
    assert 0.0 < share["oom"] < 0.05
    assert share["preempted"] > 0.02
    assert check_targets(cal) == {k: True for k in check_targets(cal)}


def test_new_hardware_appears_mid_history(default_fleet: dict[str, Any]) -> None:
    sc = Scenario.load()
    assert default_fleet["new_hardware"] == sc.new_hardware
    assert default_fleet["new_hardware_first_day"] == sc.new_hardware_day
    assert default_fleet["new_hardware_attempts"] > 100


def test_calibrate_reads_the_store_like_the_in_memory_path(tmp_path: Path) -> None:
    sc = Scenario.load().override(initial_families=300, n_model_types=60, attempts_per_day=500)
    with Store(tmp_path / "leap.duckdb") as store:
        simulate(store, Catalog.default(), sc, days=2, seed=3, start=T0)
        from_store = calibrate(store)
        fleet = Fleet(sc, Catalog.default(), 3, T0)
        direct = calibration_from_table(fleet, store.attempts())
    assert from_store == direct
    assert from_store["attempts"] == 1000


def test_within_tolerance_is_relative_to_the_measured_value() -> None:
    measured = np.array([100.0, 100.0, 100.0, 100.0, 100.0])
    predicted = np.array([120.0, 80.0, 121.0, 79.0, np.nan])
    assert within(predicted, measured).tolist() == [True, True, False, False, False]
