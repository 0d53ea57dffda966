"""Impact study: the cost views by hand, and the replay on the small fleet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest

from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import DataError
from leap.eval.impact import arm_costs, impact_study, top_choice_table
from leap.model.artifact import Registry
from leap.model.train import load_attempts
from leap.rank.ranker import Ranker
from leap.sim.fleet import Fleet

LAST = datetime(2026, 1, 12, tzinfo=UTC)
CAT = Catalog.default()


class FixedOracle:
    """A stand-in oracle: samples/s per hardware name, the same for every job."""

    def __init__(self, tp: dict[str, float]) -> None:
        self.tp = tp

    def true_throughput(self, jobs: Any, hardware: Any, at: Any) -> np.ndarray:
        return np.array([self.tp[str(h)] for h in hardware], dtype=float)


def test_cost_views_by_hand() -> None:
    jobs = pd.DataFrame({"trainer_count": [1, 2], "devices_per_trainer": [1, 4],
                         "duration_hours": [2.0, 1.0],
                         "submitted_at": [pd.Timestamp(LAST)] * 2})
    oracle = FixedOracle({"L4": 100.0, "A40": 300.0, "T4": float("nan")})
    l4, a40 = CAT["L4"].cost_per_device_hour, CAT["A40"].cost_per_device_hour
    base = arm_costs(oracle, jobs, np.array(["L4", "L4"]), CAT)  # type: ignore[arg-type]
    assert base["cost_fixed_time"].tolist() == pytest.approx([2 * l4, 8 * l4])
    assert base["samples_fixed_time"].tolist() == pytest.approx([100 * 2 * 3600,
                                                                 100 * 1 * 3600])
    assert base["cost_fixed_work"].tolist() == pytest.approx(base["cost_fixed_time"].tolist())
    moved = arm_costs(oracle, jobs, np.array(["A40", "T4"]), CAT,  # type: ignore[arg-type]
                      base["samples_fixed_time"], base["cost_fixed_time"])
    # Job 0 on a 3x faster type: same hours cost A40's price; same work takes a third.
    assert moved["cost_fixed_time"][0] == pytest.approx(2 * a40)
    assert moved["samples_fixed_time"][0] == pytest.approx(300 * 2 * 3600)
    assert moved["cost_fixed_work"][0] == pytest.approx(2 / 3 * a40)
    # Job 1 does not fit T4: no samples; same work = its wasted hours + redoing it at baseline.
    assert moved["not_fit"].tolist() == [False, True]
    t4 = CAT["T4"].cost_per_device_hour
    assert moved["samples_fixed_time"][1] == 0.0
    assert moved["cost_fixed_work"][1] == pytest.approx(8 * t4 + 8 * l4)


@pytest.fixture(scope="module")
def study(trained_workspace: Workspace) -> dict[str, Any]:
    art = Registry(trained_workspace.models_dir).load()
    with Store(trained_workspace.store_path, read_only=True) as store:
        fleet = Fleet.from_store(store)
        jobs = load_attempts(store, LAST, LAST + timedelta(days=1))
    stages: list[str] = []
    out = impact_study(Ranker(art), fleet, jobs, art.catalog,
                       progress=lambda stage, d, t: stages.append(stage))
    assert {"rank", "replay"} <= set(stages)
    return out


def test_replay_without_advice_reproduces_history(study: dict[str, Any]) -> None:
    assert study["replay_matches_history"] == 1.0
    base = study["arms"]["baseline"]
    assert base["fixed_work"]["total_cost_change"] == 0.0
    assert base["value_ratio_geomean_gpu_hours"] == pytest.approx(1.0)
    assert "advice" not in base["placement"]


def test_advice_is_followed_and_the_numbers_are_consistent(study: dict[str, Any]) -> None:
    assert study["days"] == ["2026-01-12"]
    assert 0.95 <= study["coverage"]["attempts"] <= 1.0
    assert 0.0 <= study["coverage"]["gpu_hours"] <= 1.0
    leap, base = study["arms"]["leap"], study["arms"]["baseline"]
    assert leap["placement"]["advice"] > 0.5 * study["n_attempts"]
    assert leap["top_choice_attempts"] > base["top_choice_attempts"]
    samples = {a["fixed_work"]["total_samples"] for a in study["arms"].values()}
    assert len(samples) == 1  # the same work in every arm
    for name in ("leap@1", "leap@all", "oracle@1", "oracle@all"):
        assert name in study["depth_sweep"]
    rows = top_choice_table(study)
    assert [r["arm"] for r in rows] == ["baseline", "leap", "oracle"]


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
