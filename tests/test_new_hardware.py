"""leap experiment new-hardware: a type held out of training, and the newest type's curve."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import SMALL_AS_OF, small_train_config
from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import CatalogError
from leap.eval.new_hardware import (
    NewHardwareResult,
    TypeRanking,
    check_hardware,
    new_hardware_study,
    newest_type,
)
from leap.eval.report import report_tables, write_report


def _fast_config() -> Any:
    return replace(small_train_config(), window_days=5, pair_model=False, mask_share=0.1)


@pytest.fixture(scope="module")
def study(sim_workspace: Workspace) -> NewHardwareResult:
    with Store(sim_workspace.store_path, read_only=True) as store:
        return new_hardware_study(store, Catalog.default(), _fast_config(),
                                  hardware=("MI300X",), as_of=SMALL_AS_OF, sample=150,
                                  curve_days=(0, 1))


def test_held_out_type_is_scored_beside_seen(study: NewHardwareResult) -> None:
    b = study.types["MI300X"]
    assert b.seen is not None and b.held_out is not None
    assert b.n > 10 and b.training_attempts_left_out > 100
    assert b.drop_points == pytest.approx(100 * (b.seen["accuracy"] - b.held_out["accuracy"]))
    # History of the type is what the seen model has and the held-out one lacks.
    assert b.seen["median_abs_log_ratio"] < b.held_out["median_abs_log_ratio"]
    # Both models' 80% intervals are scored on the type's attempts.
    assert 0.0 <= b.seen["interval_coverage"] <= 1.0
    assert 0.0 <= b.held_out["interval_coverage"] <= 1.0
    rk = b.ranking
    assert rk is not None and rk.type_is_best is not None
    assert rk.n_sampled > 0 and 0 <= rk.type_is_best <= 1
    for key in ("seen", "held_out", "cheapest"):
        assert 0 <= rk.model(key)["mean_regret"] <= 1 and 0 <= rk.model(key)["picks_type"] <= 1
    # The simple rule is scored on the jobs the first model ranked, so on the same rows.
    assert rk.model("cheapest")["n"] == rk.model("seen")["n"]
    (table, *_) = report_tables(new_hardware=study)
    assert "regret cheapest" in table.columns and "top-1 cheapest" in table.columns


def test_result_reads_back_to_the_same_json(study: NewHardwareResult) -> None:
    text = json.dumps(study.to_dict())
    data = json.loads(text)
    # Each type's ranking blocks sit beside its counts, as the files always had them.
    assert set(data["types"]["MI300X"]["ranking"]) >= {"n_eligible", "n_sampled",
                                                      "type_is_best", "seen", "held_out"}
    back = NewHardwareResult.from_dict(data)
    assert json.dumps(back.to_dict()) == text
    assert back.curve is not None and back.curve.nights[0].days_of_history == 0
    assert TypeRanking.from_dict({"n_sampled": 0}).to_dict() == {"n_sampled": 0}


def test_newest_type_curve(study: NewHardwareResult, sim_workspace: Workspace) -> None:
    with Store(sim_workspace.store_path, read_only=True) as store:
        name, first = newest_type(store)  # type: ignore[misc]
    # The default scenario's new type arrives on day 10 of the simulation.
    assert name == "B200" and first.date().isoformat() == "2026-01-11"
    curve = study.curve
    assert curve is not None and curve.hardware == "B200"
    assert [n.days_of_history for n in curve.nights] == [0, 1]
    assert all(0 <= n.fleet_accuracy <= 1 for n in curve.nights)


def test_unknown_type_says_what_it_meant() -> None:
    with pytest.raises(CatalogError, match="unknown hardware 'MI300'; did you mean 'MI300X'"):
        check_hardware(["MI300"], Catalog.default())


def test_report_has_the_tables(study: NewHardwareResult, tmp_path: Path) -> None:
    keys = [t.key for t in report_tables(new_hardware=study)]
    assert keys == ["new_hardware", "new_hardware_curve"]
    page = write_report(tmp_path, new_hardware=study)
    assert "New hardware: a type held out of training" in page.read_text()


def test_cli_refuses_an_unknown_type(sim_workspace: Workspace) -> None:
    from leap.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["--home", str(sim_workspace.home), "experiment",
                                   "new-hardware", "--hardware", "B20O"])
    assert res.exit_code == 1 and "unknown hardware 'B20O'" in res.output


def test_a_type_nobody_ran_on_takes_the_history_estimate_without_the_trees(
        sim_workspace: Workspace) -> None:
    import numpy as np

    from leap.eval.new_hardware import held_out_type
    from leap.features.encode import FEATURE_NAMES
    from leap.model.window import day_start, window_attempts

    cfg = _fast_config()
    day = day_start(SMALL_AS_OF)
    with Store(sim_workspace.store_path, read_only=True) as store:
        attempts = window_attempts(store, day, cfg)
    model = held_out_type(attempts, Catalog.default(), day, cfg, "MI300X")
    jobs = model.eval_jobs
    art = model.artifact
    X = art.encode_full(jobs)
    hist = X[:, FEATURE_NAMES.index("hist_est")]
    pred = art.predict_log(jobs)
    new = (jobs["hardware"] == "MI300X").to_numpy() & np.isfinite(hist)
    assert new.sum() > 5
    np.testing.assert_array_equal(pred[new], hist[new])
    # Every other type ran in the window: the trees' correction applies there.
    seen = ~(jobs["hardware"] == "MI300X").to_numpy() & np.isfinite(hist)
    assert (np.abs(pred[seen] - hist[seen]) > 1e-9).mean() > 0.5
