"""Simulating into the store: deterministic, idempotent, extendable, validated like ingest."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from leap.catalog import Catalog
from leap.data.ingest import ingest_table
from leap.data.schema import ATTEMPTS_SCHEMA, STATUSES
from leap.data.store import Store
from leap.errors import ConfigError
from leap.sim.fleet import Fleet
from leap.sim.run import simulate, simulate_day
from leap.sim.scenario import Scenario

SMALL = Scenario.load().override(initial_families=300, n_model_types=60,
                                 new_families_per_day=15.0, attempts_per_day=400)
CAT = Catalog.default()


def run(home: Path, days: int, seed: int = 1, scenario: Scenario = SMALL,
        start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> tuple[pa.Table, int]:
    with Store(home / "leap.duckdb") as store:
        report = simulate(store, CAT, scenario, days=days, seed=seed, start=start,
                          chunk_days=2)
        return store.attempts(), report.added


def test_same_seed_in_two_fresh_homes_gives_identical_attempts(tmp_path: Path) -> None:
    a, added_a = run(tmp_path / "a", 3)
    b, added_b = run(tmp_path / "b", 3)
    assert added_a == added_b == 3 * 400
    assert a.equals(b)
    c, _ = run(tmp_path / "c", 3, seed=2)
    assert not a.column("throughput").equals(c.column("throughput"))


def test_running_again_adds_nothing_and_a_longer_run_extends(tmp_path: Path) -> None:
    first, _ = run(tmp_path / "h", 2)
    again, added = run(tmp_path / "h", 2)
    assert added == 0
    assert again.equals(first)
    longer, added = run(tmp_path / "h", 4)
    assert added == 2 * 400
    direct, _ = run(tmp_path / "d", 4)
    assert longer.equals(direct)
    with Store(tmp_path / "h" / "leap.duckdb") as store:
        assert store.get_meta("sim.days") == "4"
        assert store.get_meta("sim.seed") == "1"


def test_rows_are_valid_attempts_with_architecture_columns() -> None:
    fleet = Fleet(SMALL, CAT, 5, datetime(2026, 1, 1, tzinfo=UTC))
    table = simulate_day(fleet, 0).table
    assert table.schema.equals(ATTEMPTS_SCHEMA)
    assert table.num_rows == 400
    ids = table.column("attempt_id").to_pylist()
    assert ids[0] == "sim-5-0000-000000" and len(set(ids)) == len(ids)
    ts = table.column("submitted_at")
    assert pc.all(pc.greater_equal(ts[1:], ts[:-1])).as_py()       # submission order
    status = np.asarray(table.column("status").to_pylist())
    assert set(status) <= set(STATUSES)
    thr = table.column("throughput")
    assert thr.null_count == int((status != "succeeded").sum())
    for col in ("model_category", "num_params", "flops_per_sample", "num_layers", "hidden_dim",
                "precision", "devices_per_trainer", "data_parallel", "tensor_parallel",
                "pipeline_parallel", "duration_hours"):
        assert table.column(col).null_count == 0, col
    dp = table.column("data_parallel").to_numpy()
    devices = (table.column("trainer_count").to_numpy()
               * table.column("devices_per_trainer").to_numpy())
    mp = (table.column("tensor_parallel").to_numpy()
          * table.column("pipeline_parallel").to_numpy())
    assert np.array_equal(dp * mp, devices)


def test_ingest_validation_accepts_every_simulated_row(tmp_path: Path) -> None:
    fleet = Fleet(SMALL, CAT, 6, datetime(2026, 1, 1, tzinfo=UTC))
    table = simulate_day(fleet, 1).table
    with Store(tmp_path / "s.duckdb") as store:
        report = ingest_table(store, table, CAT, origin="test")
    assert report.quarantined == 0
    assert report.added == table.num_rows
    assert report.unknown_columns == []


def test_a_different_fleet_in_the_same_store_is_refused(tmp_path: Path) -> None:
    run(tmp_path / "h", 1, seed=1)
    with pytest.raises(ConfigError, match=r"already holds a fleet simulated with seed 1 "
                                          r"\(asked: 2\); use a fresh home"):
        run(tmp_path / "h", 1, seed=2)
    with pytest.raises(ConfigError, match=r"another scenario \(attempts_per_day: 400 -> 401\)"):
        run(tmp_path / "h", 1, scenario=SMALL.override(attempts_per_day=401))
    with pytest.raises(ConfigError, match=r"start 2026-01-01T00:00:00\+00:00 \(asked: 2026-02"):
        run(tmp_path / "h", 1, start=datetime(2026, 2, 1, tzinfo=UTC))


def test_real_attempts_in_the_store_are_not_mixed_with_a_simulation(tmp_path: Path) -> None:
    fleet = Fleet(SMALL, CAT, 9, datetime(2026, 1, 1, tzinfo=UTC))
    with Store(tmp_path / "leap.duckdb") as store:
        ingest_table(store, simulate_day(fleet, 0).table.slice(0, 5), CAT, origin="real.csv")
    with pytest.raises(ConfigError, match="already holds 5 attempts that were not simulated"):
        run(tmp_path, 1)


def test_days_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="days must be >= 1, got 0"):
        run(tmp_path, 0)


def test_the_oracle_rebuilt_from_the_store_matches_the_simulation(tmp_path: Path) -> None:
    table, _ = run(tmp_path, 2, seed=4)
    with Store(tmp_path / "leap.duckdb", read_only=True) as store:
        fleet = Fleet.from_store(store)
    ok = pc.equal(table.column("status"), "succeeded")
    succ = table.filter(ok)
    truth = fleet.true_throughput(succ, succ.column("hardware"), succ.column("submitted_at"))
    measured = succ.column("throughput").to_numpy()
    ratio = np.log(measured / truth)
    # Measured = truth x log-normal noise (sd 0.1), and a few stragglers far below.
    assert np.isfinite(ratio).all()
    assert abs(np.median(ratio)) < 0.03
    assert 0.6 < (np.abs(ratio) < 0.15).mean() < 0.95
    assert (ratio > 0.5).mean() < 0.001
