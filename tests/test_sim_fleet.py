"""The fleet and its oracle: deterministic, extendable in time, honest about what fits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leap.catalog import Catalog
from leap.data.store import Store
from leap.errors import CatalogError, ConfigError, DataError
from leap.sim.fleet import Fleet
from leap.sim.scenario import Scenario

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SMALL = Scenario.load().override(initial_families=400, n_model_types=80,
                                 new_families_per_day=20.0, attempts_per_day=500)


def fleet(seed: int = 1, scenario: Scenario = SMALL) -> Fleet:
    return Fleet(scenario, Catalog.default(), seed, T0)


def test_same_seed_same_fleet_other_seed_other_fleet() -> None:
    a, b, c = fleet(1), fleet(1), fleet(2)
    a.ensure_days(6)
    b.ensure_days(6)
    c.ensure_days(6)
    assert np.array_equal(a.types.flops_per_sample, b.types.flops_per_sample)
    assert np.array_equal(a.families.log_eff, b.families.log_eff)
    assert np.array_equal(a.families.home, b.families.home)
    jobs = a.base_jobs(np.arange(50))
    assert np.array_equal(a.true_throughput(jobs, "H100-SXM", T0 + timedelta(days=5)),
                          b.true_throughput(jobs, "H100-SXM", T0 + timedelta(days=5)),
                          equal_nan=True)
    assert not np.array_equal(a.families.log_eff[:50], c.families.log_eff[:50])


def test_growing_step_by_step_equals_growing_at_once() -> None:
    # Each day has its own random stream: a longer simulation repeats a shorter one.
    a, b = fleet(3), fleet(3)
    a.ensure_days(4)
    a.ensure_days(9)
    b.ensure_days(9)
    assert len(a.families) == len(b.families)
    assert np.array_equal(a.families.arrival_day, b.families.arrival_day)
    jobs = a.base_jobs(np.arange(len(a.families)))
    at = T0 + timedelta(days=8, hours=3)
    assert np.array_equal(a.true_throughput(jobs, "A100-SXM4-80GB", at),
                          b.true_throughput(jobs, "A100-SXM4-80GB", at), equal_nan=True)


def test_new_families_arrive_every_day() -> None:
    f = fleet(4)
    f.ensure_days(11)
    arrivals = np.bincount(f.families.arrival_day[f.families.arrival_day >= 0], minlength=11)
    assert arrivals[0] == 0
    assert (arrivals[1:] > 0).all()
    assert 10 < arrivals[1:].mean() < 30


def test_efficiency_drifts_over_time() -> None:
    f = fleet(5)
    jobs = f.base_jobs(np.arange(200))
    day0 = f.true_throughput(jobs, "H100-SXM", T0)
    day20 = f.true_throughput(jobs, "H100-SXM", T0 + timedelta(days=20))
    ok = np.isfinite(day0)
    change = np.abs(np.log(day20[ok] / day0[ok]))
    assert change.max() > 0.0
    assert np.median(change) < 0.2     # slow drift, a few step changes


def test_oracle_answers_hypothetical_placements_and_nan_when_it_does_not_fit() -> None:
    f = fleet(6)
    jobs = f.base_jobs(np.arange(300))
    eligible = f.eligible(jobs, T0)
    assert eligible.shape == (300, len(f.hardware_names))
    for j, name in enumerate(f.hardware_names):
        truth = f.true_throughput(jobs, name, T0)
        fits = np.isfinite(truth)
        available = f.pool.available_from_day[j] <= 0
        assert np.array_equal(fits & available, eligible[:, j]), name
        assert (truth[fits] > 0).all()
    # New hardware only becomes eligible on its day.
    b200 = f.hardware_names.index("B200")
    assert not eligible[:, b200].any()
    later = f.eligible(jobs, T0 + timedelta(days=SMALL.new_hardware_day))
    assert later[:, b200].any()


def test_oracle_takes_arrow_or_pandas_and_per_row_times() -> None:
    f = fleet(7)
    jobs = f.base_jobs(np.arange(40))
    at = [T0 + timedelta(days=i % 5, hours=i) for i in range(40)]
    hw = ["H100-SXM" if i % 2 else "A10G" for i in range(40)]
    arrow = f.true_throughput(jobs, hw, at)
    frame = f.true_throughput(jobs.to_pandas(), np.array(hw), pd.Series(at))
    assert np.array_equal(arrow, frame, equal_nan=True)
    one = f.true_throughput(jobs.slice(3, 1), hw[3], at[3])
    assert np.array_equal(one, arrow[3:4], equal_nan=True)


def test_oracle_uses_the_job_columns_not_only_the_family() -> None:
    f = fleet(8)
    jobs = f.base_jobs(np.arange(100)).to_pandas()
    base = f.true_throughput(jobs, "H100-SXM", T0)
    doubled = jobs.assign(trainer_count=jobs.trainer_count * 2)
    more = f.true_throughput(doubled, "H100-SXM", T0)
    ok = np.isfinite(base) & np.isfinite(more)
    assert (more[ok] > base[ok]).mean() > 0.9
    # Optional shape columns may be absent: the family's base shape fills them.
    bare = jobs[["family_id", "trainer_count", "batch_size"]]
    assert np.array_equal(f.true_throughput(bare, "H100-SXM", T0), base, equal_nan=True)


def test_oracle_errors_name_the_problem() -> None:
    f = fleet(9)
    jobs = f.base_jobs(np.arange(3))
    with pytest.raises(CatalogError, match=r"unknown hardware 'H10O'; did you mean 'H100"):
        f.true_throughput(jobs, "H10O", T0)
    with pytest.raises(DataError, match="family_id 'fam-999999' is not a family"):
        f.true_throughput(pd.DataFrame({"family_id": ["fam-999999"], "trainer_count": [1],
                                        "batch_size": [8]}), "T4", T0)
    with pytest.raises(DataError, match="before the simulation start"):
        f.true_throughput(jobs, "T4", T0 - timedelta(hours=1))
    with pytest.raises(DataError, match="got 2 hardware names for 3 jobs"):
        f.true_throughput(jobs, ["T4", "L4"], T0)
    with pytest.raises(DataError, match="lack required column 'batch_size'"):
        f.true_throughput(jobs.drop_columns(["batch_size"]), "T4", T0)
    with pytest.raises(ConfigError, match="new_hardware 'B20O' is not in the catalog; did you "
                                          "mean 'B200'"):
        Fleet(SMALL.override(new_hardware="B20O"), Catalog.default(), 1, T0)
    with pytest.raises(ConfigError, match="seed must be a whole number >= 0"):
        Fleet(SMALL, Catalog.default(), -1, T0)


def test_from_store_refuses_a_store_that_was_not_simulated(tmp_path: Path) -> None:
    with Store(tmp_path / "leap.duckdb") as store, \
            pytest.raises(ConfigError, match="holds no simulated fleet"):
        Fleet.from_store(store)


def test_families_have_few_home_types_that_fit() -> None:
    f = fleet(10)
    fam = f.families
    k = (fam.home >= 0).sum(axis=1)
    live = fam.weight > 0
    # Fewer homes only when fewer types fit (initial families: among types of day 0).
    few_fit = k[live] == (fam.fit_base[live] & f.pool.available(0)).sum(axis=1)
    assert ((k[live] >= SMALL.home_types_min) | few_fit).all()
    assert (k <= SMALL.home_types_max).all()
    rows, cols = np.nonzero(fam.home >= 0)
    assert fam.fit_base[rows, fam.home[rows, cols]].all()
    # Shapes are consistent: devices divide into the model-parallel groups.
    s = fam.shape()
    assert (s.devices % (s.tensor_parallel * s.pipeline_parallel) == 0).all()
    assert (fam.weight > 0).mean() > 0.99
