"""The alternatives study: every method on the same held-out day, with its fit and latency."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import SMALL_AS_OF, small_train_config
from leap.catalog import Catalog
from leap.cli import _register, app
from leap.config import Workspace
from leap.data.store import Store
from leap.eval.alternatives import AlternativesResult, alternatives_study, drop_features
from leap.eval.report import report_tables
from leap.features.encode import HARDWARE_SPEC_FEATURES


@pytest.fixture(scope="module")
def study(sim_workspace: Workspace) -> AlternativesResult:
    with Store(sim_workspace.store_path, read_only=True) as store:
        return alternatives_study(store, Catalog.default(),
                                  small_train_config(pair_model=False, window_days=5),
                                  as_of=SMALL_AS_OF,
                                  sample_rows=5000, knn_rows=2000, latency_jobs=20)


def test_every_method_is_scored_on_the_same_attempts(study: AlternativesResult) -> None:
    names = [m.name for m in study.methods]
    for expected in ("leap (cascade + novel-rows model)", "one LightGBM model",
                     "linear regression on log features", "k-nearest neighbours (k = 10)",
                     "small MLP (64, 32)", "analytic roofline alone", "base margin alone",
                     "lookup table (exact configuration)", "leap without history features",
                     "leap without hardware-spec columns", "leap, mean (L2) objective",
                     "spec-ratio transfer"):
        assert expected in names
    assert study.eval_rows > 100 and study.masked_eval_rows > 10
    by = {m.name: m for m in study.methods}
    for m in study.methods:
        assert 0 <= m.accuracy <= 1 and m.job_ms_p50 > 0 and m.predict_us_per_row > 0
        # Accuracy counts a missing prediction as a miss: it is coverage x covered accuracy.
        assert math.isclose(m.accuracy, m.coverage * m.accuracy_covered, abs_tol=1e-9)
    # Every learned model answers every row; the lookup table only configurations it saw,
    # and never a masked pair.
    assert by["small MLP (64, 32)"].coverage == 1.0
    lookup = by["lookup table (exact configuration)"]
    assert 0 < lookup.coverage < 1 and lookup.masked_pairs_accuracy == 0
    # The spec-ratio rule never reads the pair's own type: it answers a masked pair as it
    # answers the attempt, and a family that ran on one type not at all.
    ratio = by["spec-ratio transfer"]
    assert 0 < ratio.coverage < 1 and ratio.masked_pairs_accuracy > 0
    # History is what leap's accuracy rests on; the roofline alone is far from it.
    leap = by["leap (cascade + novel-rows model)"]
    assert leap.accuracy > by["leap without history features"].accuracy
    assert leap.accuracy > by["analytic roofline alone"].accuracy
    text = json.dumps(study.to_dict())
    back = AlternativesResult.from_dict(json.loads(text))
    assert json.dumps(back.to_dict()) == text and back.methods[0].name == study.methods[0].name
    (table,) = [t for t in report_tables(alternatives=back) if t.key == "alternatives"]
    assert len(table.rows) == len(study.methods)


def test_dropping_features_keeps_the_rows_and_the_other_columns(sim_workspace: Workspace
                                                                 ) -> None:
    from leap.model.window import build_training_set, window_attempts

    cfg = small_train_config(pair_model=False, window_days=3)
    with Store(sim_workspace.store_path, read_only=True) as store:
        ts = build_training_set(window_attempts(store, SMALL_AS_OF, cfg), Catalog.default(),
                                SMALL_AS_OF, cfg)
    less = drop_features(ts, set(HARDWARE_SPEC_FEATURES))
    assert less.X.shape == (ts.X.shape[0], ts.X.shape[1] - len(HARDWARE_SPEC_FEATURES))
    assert not set(HARDWARE_SPEC_FEATURES) & set(less.spec.names)
    j = list(ts.spec.names).index("log_phys_sps")
    np.testing.assert_array_equal(less.eval_X[:, list(less.spec.names).index("log_phys_sps")],
                                  ts.eval_X[:, j])
    assert less.eval_masked_X.shape[0] == ts.eval_masked_X.shape[0]


def test_cli_writes_the_study_where_the_report_finds_it(sim_workspace: Workspace,
                                                        tmp_path: Path) -> None:
    _register()
    res = CliRunner().invoke(app, ["--home", str(sim_workspace.home), "experiment",
                                   "alternatives", "--as-of", "2026-01-12", "--window-days",
                                   "3", "--sample-rows", "2000", "--out", str(tmp_path),
                                   "--json"])
    assert res.exit_code == 0, res.output
    saved = json.loads((tmp_path / "alternatives.json").read_text())
    assert saved["day"] == "2026-01-12" and len(saved["methods"]) >= 10
    bad = CliRunner().invoke(app, ["--home", str(sim_workspace.home), "experiment",
                                   "alternatives", "--as-of", "2026-02-30"])
    assert bad.exit_code != 0 and "--as-of" in bad.output
