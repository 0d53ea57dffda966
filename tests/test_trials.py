"""leap trials plan / check: trial jobs on a new type, and the simulator's measurement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import SMALL_AS_OF, small_train_config
from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import CatalogError, ConfigError
from leap.eval.report import report_tables
from leap.eval.trials import PLAN_COLUMNS, PlanSummary, choose, expected_loss, plan_trials
from leap.eval.trials_check import TrialsResult, trials_study
from leap.model.artifact import Registry
from leap.model.window import load_attempts
from leap.sim.fleet import Fleet
from leap.sim.measure import measure_jobs


def _fast_config() -> Any:
    return replace(small_train_config(), window_days=5, pair_model=False, mask_share=0.1)


@pytest.fixture(scope="module")
def fast_home(sim_workspace: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A copy of the small fleet with a published model (fast settings: no pair model)."""
    import shutil

    from leap.model.train import train_nightly

    ws = Workspace(tmp_path_factory.mktemp("trials-home"))
    shutil.copy(sim_workspace.store_path, ws.home / "leap.duckdb")
    with Store(ws.store_path, read_only=True) as store:
        train_nightly(store, Catalog.default(), Registry(ws.models_dir), as_of=SMALL_AS_OF,
                      cfg=_fast_config())
    return ws


@pytest.fixture(scope="module")
def study(sim_workspace: Workspace) -> TrialsResult:
    with Store(sim_workspace.store_path, read_only=True) as store:
        return trials_study(store, Catalog.default(), _fast_config(), hardware="MI300X",
                            budgets=(0, 10), as_of=SMALL_AS_OF, sample=150, seed=1)


# The choice -----------------------------------------------------------------------------------
@settings(deadline=None)
@given(st.floats(-3, 3), st.floats(0.01, 2))
def test_expected_loss_is_non_negative_and_largest_when_undecided(mu: float, sd: float
                                                                  ) -> None:
    loss = expected_loss(np.array([mu, 0.0]), np.array([sd, sd]))
    assert loss[0] >= 0 and loss[1] >= loss[0] - 1e-12


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.01, 100)), min_size=1,
                max_size=12), st.integers(1, 12))
def test_choice_is_greedy_and_a_smaller_plan_is_a_prefix(rows: list[tuple[str, float]],
                                                         n: int) -> None:
    c = pd.DataFrame({"family_id": [f"f{i}" for i in range(len(rows))],
                      "model_type": [t for t, _ in rows], "score": [s for _, s in rows]})
    big = choose(c, n)
    assert len(big) == min(n, len(c)) and big["family_id"].is_unique
    small = choose(c, max(1, n // 2))
    assert list(small["family_id"]) == list(big["family_id"][:len(small)])
    # Without the model-type discount it is simply the best scores.
    plain = choose(c, n, type_discount=1.0)
    assert sorted(plain["score"], reverse=True) == list(plain["score"])


def test_bad_budget_and_unknown_hardware(fast_home: Workspace) -> None:
    with pytest.raises(ConfigError, match=r"^budget must be >= 1"):
        choose(pd.DataFrame({"family_id": [], "model_type": [], "score": []}), 0)
    art = Registry(fast_home.models_dir).load()
    with pytest.raises(CatalogError, match="unknown hardware 'B20'; did you mean 'B200'"):
        plan_trials(art, pd.DataFrame(), "B20", 5)


def test_plan_covers_types_and_says_why(fast_home: Workspace) -> None:
    art = Registry(fast_home.models_dir).load()
    with Store(fast_home.store_path, read_only=True) as store:
        hist = load_attempts(store, SMALL_AS_OF - pd.Timedelta(days=10), SMALL_AS_OF)
    plan = plan_trials(art, hist, "MI300X", 10, type_discount=0.5)
    rows = plan.rows
    assert len(rows) == 10 and list(rows["rank"]) == list(range(1, 11))
    assert set(PLAN_COLUMNS) <= set(rows.columns) and rows["family_id"].is_unique
    assert (rows["estimated_cost"] > 0).all() and (rows["devices"] >= 1).all()
    assert rows["why"].str.contains("spent in the window").all()
    # Every family fits a host of the type (the planner's own eligibility, no oracle).
    assert (rows["devices_per_trainer"].fillna(1) <= Catalog.default()["MI300X"]
            .devices_per_host).all()
    # Without the discount, the plan covers no more model types than with it.
    plain = plan_trials(art, hist, "MI300X", 10, type_discount=1.0)
    assert rows["model_type"].nunique() >= plain.rows["model_type"].nunique()
    text = json.dumps(plan.to_dict())
    summary = plan.summary()
    assert json.dumps(PlanSummary.from_dict(json.loads(text)).to_dict()) == text
    assert [t.family_id for t in summary.trials] == list(rows["family_id"])
    assert summary.planned == 10 and summary.trials[0].rank == 1


# The simulator's measurement ------------------------------------------------------------------
def test_measure_follows_the_oracle(sim_workspace: Workspace) -> None:
    with Store(sim_workspace.store_path, read_only=True) as store:
        fleet = Fleet.from_store(store)
    jobs = fleet.base_jobs(np.arange(200)).to_pandas()
    rows = measure_jobs(fleet, jobs, "H100-SXM", SMALL_AS_OF, np.random.default_rng(0),
                        id_prefix="trial-x-", duration_hours=0.5)
    assert rows["attempt_id"].str.startswith("trial-x-").all()
    truth = fleet.true_throughput(jobs, "H100-SXM", SMALL_AS_OF)
    assert ((rows["status"] == "oom") == np.isnan(truth)).all()
    ok = (rows["status"] == "succeeded").to_numpy()
    ratio = rows["throughput"].to_numpy()[ok] / truth[ok]
    assert 0.9 < np.median(ratio) < 1.1 and (rows["duration_hours"] == 0.5).all()
    again = measure_jobs(fleet, jobs, "H100-SXM", SMALL_AS_OF, np.random.default_rng(0))
    assert np.allclose(again["throughput"].fillna(0), rows["throughput"].fillna(0))


# The check ------------------------------------------------------------------------------------
def test_check_compares_planned_and_random_of_the_same_size(study: TrialsResult) -> None:
    assert study.type_attempts_on_day > 10 and study.budgets == [0, 10]
    arm = study.arms["10"]
    assert arm.random is not None
    assert arm.planned.trials == arm.random.trials == 10
    # The random draw is matched on cost, to within a factor.
    assert 0.3 < arm.random.cost / arm.planned.cost < 3
    for a in (study.arms["0"].planned, arm.planned, arm.random):
        assert 0 <= a.accuracy["accuracy"] <= 1
        assert a.ranking["n"] > 0
    # Measured trials on a type the model has never seen make more of its predictions there
    # land within 20% (the measure; on this small fleet the median error barely moves:
    # 0.329 -> 0.331, while the share within 20% goes 28% -> 41%).
    assert arm.planned.accuracy["accuracy"] > study.arms["0"].planned.accuracy["accuracy"]
    # The simple rule ranks the same jobs as every arm.
    assert study.cheapest is not None
    assert study.cheapest["n"] == study.arms["0"].planned.ranking["n"]
    (table,) = [t for t in report_tables(trials=study) if t.key == "trials"]
    assert [r[:2] for r in table.rows] == [("0", "planned"), ("10", "planned"),
                                           ("10", "random"), ("any", "rule: cheapest type")]
    text = json.dumps(study.to_dict())
    assert json.dumps(TrialsResult.from_dict(json.loads(text)).to_dict()) == text


# The CLI --------------------------------------------------------------------------------------
def _cli(args: list[str]) -> Any:
    from leap.cli import _register, app

    _register()
    return CliRunner().invoke(app, args)


def test_cli_plan_writes_csv_and_refuses_bad_input(fast_home: Workspace,
                                                   tmp_path: Path) -> None:
    home = str(fast_home.home)
    out = tmp_path / "plan.csv"
    res = _cli(["--home", home, "trials", "plan", "--hardware", "MI300X", "--budget", "5",
                "--out", str(out)])
    assert res.exit_code == 0, res.output
    plan = pd.read_csv(out)
    assert list(plan.columns) == list(PLAN_COLUMNS) and len(plan) == 5
    res = _cli(["--home", home, "trials", "plan", "--hardware", "MI30X", "--budget", "5"])
    assert res.exit_code == 1 and "did you mean 'MI300X'" in res.output
    assert "Traceback" not in res.output
    res = _cli(["--home", home, "trials", "plan", "--hardware", "MI300X", "--budget", "0"])
    assert res.exit_code == 1 and "--budget must be >= 1" in res.output


def test_check_reads_back_to_the_same_json(study: TrialsResult) -> None:
    text = json.dumps(study.to_dict())
    data = json.loads(text)
    # The arm without trials has neither a success count nor model types.
    assert list(data["arms"]["0"]["planned"]) == ["trials", "cost", "accuracy", "ranking"]
    assert list(data["arms"]["10"]["planned"])[:4] == ["trials", "succeeded", "cost",
                                                       "model_types"]
    assert json.dumps(TrialsResult.from_dict(data).to_dict()) == text


def test_report_picks_up_the_saved_check(study: TrialsResult, tmp_path: Path) -> None:
    from leap.eval.backtest import write_json_atomic
    from leap.eval.report import write_report
    from leap.eval.studies import saved_study

    (tmp_path / "reports").mkdir()
    write_json_atomic(tmp_path / "reports" / "trials.json", study.to_dict())
    saved = saved_study(tmp_path, "trials.json", TrialsResult, "arms")
    assert saved is not None and saved.hardware == "MI300X"
    page = write_report(tmp_path / "out", trials=saved)
    assert "Trial jobs on a new type" in page.read_text()
    (tmp_path / "reports" / "trials.json").write_text('{"arms": {"0": {}}}')
    with pytest.raises(ConfigError, match="rerun the experiment that wrote it"):
        saved_study(tmp_path, "trials.json", TrialsResult, "arms")
