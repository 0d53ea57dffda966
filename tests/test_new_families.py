"""leap experiment new-families: families left out of training, with and without the prior."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import SMALL_AS_OF, small_train_config
from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import ConfigError
from leap.eval.new_families import (
    FamilyComparison,
    NewFamiliesResult,
    choose_left_out,
    new_families_study,
)
from leap.eval.report import report_tables

#: The study's models: what is compared is the model-type prior, so no pair model (for speed).
NEW_FAMILIES_CFG = small_train_config(pair_model=False)


@pytest.fixture(scope="module")
def study(sim_workspace: Workspace) -> NewFamiliesResult:
    with Store(sim_workspace.store_path, read_only=True) as store:
        return new_families_study(store, Catalog.default(), NEW_FAMILIES_CFG,
                                  as_of=SMALL_AS_OF, type_share=0.2, seed=3)


def _blocks(c: FamilyComparison) -> tuple[dict[str, float], dict[str, float],
                                          dict[str, float]]:
    assert c.seen is not None and c.held_out_with_prior is not None
    assert c.held_out_without_prior is not None
    return c.seen, c.held_out_with_prior, c.held_out_without_prior


def test_left_out_families_are_new_to_the_held_out_model(study: NewFamiliesResult) -> None:
    groups, single = study.model_type_groups, study.single_family
    assert groups.n > 50 and single.n > 5
    assert groups.new_to_held_out_model == 1.0 and single.new_to_held_out_model == 1.0
    assert groups.model_types == len(study.left_out_model_types)
    assert study.single_family_id is not None and single.families == 1


def test_leaving_families_out_costs_accuracy(study: NewFamiliesResult) -> None:
    groups = study.model_type_groups
    seen, with_prior, _ = _blocks(groups)
    # History is what the seen model has and the held-out one lacks: it must show.
    assert seen["accuracy"] > with_prior["accuracy"] + 0.1
    assert groups.drop_points == pytest.approx(100 * (seen["accuracy"] - with_prior["accuracy"]))
    # Without architecture columns the model knows less about a family it has never seen:
    # the typical miss (in log space: MdAPE caps under-predictions at 100%) grows, as the
    # simulator's throughput follows FLOPs and parameters.
    for block in (groups, study.single_family):
        _, with_prior, without_prior = _blocks(block)
        assert without_prior["median_abs_log_ratio"] > with_prior["median_abs_log_ratio"]
    _, with_prior, without_prior = _blocks(study.single_family)
    assert with_prior["accuracy"] >= without_prior["accuracy"]
    assert set(study.model_type_groups_by_category) <= {
        "recommendation", "vision", "language", "llm", "speech", "tabular", "graph"}


def test_the_draw_is_seeded_and_keeps_a_type_in(sim_workspace: Workspace) -> None:
    past = pd.DataFrame({"model_type": list("abcd"), "family_id": ["fa", "fb", "fc", "fd"]})
    held = pd.DataFrame({"model_type": list("abcdd"), "family_id": ["fa", "fb", "fc", "fd",
                                                                   "fd"]})
    a = choose_left_out(past, held, type_share=0.5, seed=1)
    assert a == choose_left_out(past, held, type_share=0.5, seed=1)
    assert len(a[0]) == 2 and a[1] not in {f"f{t}" for t in a[0]}
    assert len(choose_left_out(past, held, type_share=0.99, seed=1)[0]) == 3
    with pytest.raises(ConfigError, match=r"^type_share must be between 0 and 1"):
        choose_left_out(past, held, type_share=1.5, seed=1)
    with pytest.raises(ConfigError, match="fewer than two model types"):
        choose_left_out(past.head(1), held.head(1), type_share=0.5, seed=1)


def test_report_table_and_json(study: NewFamiliesResult) -> None:
    text = json.dumps(study.to_dict())  # plain JSON, read back to the same
    assert json.dumps(NewFamiliesResult.from_dict(json.loads(text)).to_dict()) == text
    assert FamilyComparison(n=0).to_dict() == {"n": 0}
    (table,) = [t for t in report_tables(new_families=study) if t.key == "new_families"]
    assert len(table.rows) >= 2 and table.rows[0][1] == f"{study.model_type_groups.n:,}"


def test_cli_writes_the_json(sim_workspace: Workspace, tmp_path: Any) -> None:
    from leap.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["--home", str(sim_workspace.home), "experiment",
                                   "new-families", "--as-of", "2026-01-12", "--window-days",
                                   "3", "--model", "global", "--type-share", "0.2",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "new_families.json").read_text())
    assert data["day"] == "2026-01-12" and data["model_type_groups"]["n"] > 0
    assert "new families on 2026-01-12" in res.output


def test_a_block_counts_the_rows_inside_their_interval() -> None:
    from leap.eval.new_families import score_block

    jobs = pd.DataFrame({"throughput": [100.0, 100.0, 100.0, 100.0]})
    pred = np.full(4, 100.0)
    lo, hi = np.array([90.0, 101.0, np.nan, 50.0]), np.array([110.0, 120.0, 200.0, 100.0])
    # Rows 1 and 4 are inside (bounds included), row 2 is not, row 3 has no interval.
    assert score_block(pred, jobs, (lo, hi))["interval_coverage"] == pytest.approx(2 / 3)
    assert "interval_coverage" not in score_block(pred, jobs)
    assert np.isnan(score_block(pred, jobs, (lo * np.nan, hi))["interval_coverage"])
