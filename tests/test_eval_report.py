"""`leap backtest`, `leap experiment lookup|ranking|impact` and `leap report` on the small fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import leap.cli
from leap.cli import app
from leap.config import Workspace
from leap.errors import ConfigError
from leap.eval.backtest import BacktestResult
from leap.eval.real_data import RealDataResult
from leap.eval.real_splits import ProtocolSettings
from leap.eval.report import PLOTS, report_tables, write_report
from leap.eval.studies import ImpactResult, LookupResult, RankingResult

leap.cli._register()
runner = CliRunner()
SMALL = ["--nights", "2", "--window-days", "3", "--model", "global", "--workers", "1"]


def leap(ws: Workspace, *args: str) -> str:
    result = runner.invoke(app, ["--home", str(ws.home), *args])
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def backtested(trained_workspace: Workspace,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Workspace, dict[str, Any]]:
    """A copy of the trained workspace after `leap backtest --json`, and what it printed."""
    import shutil

    home = tmp_path_factory.mktemp("report-home")
    shutil.copytree(trained_workspace.home, home, dirs_exist_ok=True)
    ws = Workspace(home)
    return ws, json.loads(leap(ws, "backtest", *SMALL, "--json"))


@pytest.fixture(scope="module")
def report_dir(backtested: tuple[Workspace, dict[str, Any]]) -> Path:
    """`leap report` of the backtested workspace: its backtest is the one already run."""
    ws = backtested[0]
    out = ws.home / "report"
    text = leap(ws, "report", "--out", str(out), *SMALL, "--sample", "40")
    assert "wrote" in text and "backtest: 2 nights" in text
    return out


def test_report_writes_page_plots_and_every_number(report_dir: Path) -> None:
    page = (report_dir / "index.html").read_text()
    data = json.loads((report_dir / "report.json").read_text())
    for name in PLOTS.values():
        png = report_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f'src="{name}"' in page
    assert len(data["backtest"]["nights"]) == 2
    # The report reads the nights `leap backtest` kept instead of training them again.
    assert data["backtest"]["reused"] == ["2026-01-11", "2026-01-12"]
    assert data["lookup"]["day"] == "2026-01-12"
    assert data["ranking"]["n_sampled"] == 40
    assert set(data["impact"]["arms"]) == {"baseline", "leap", "leap_aware", "greedy_oracle",
                                           "optimum"}
    assert data["impact"]["headline"]["optimum_saving"] > 0
    assert any("kept by the backtest" in n for n in data["notes"])
    assert "Ranking quality against the oracle" in page and "Impact" in page
    assert "LP optimum" in page and "greedy oracle" in page and "of the optimum" in page


#: The typed result of each part of report.json that ``leap report`` computes.
PARTS = {"backtest": BacktestResult, "lookup": LookupResult, "ranking": RankingResult,
         "impact": ImpactResult}


def _typed(data: dict) -> dict:
    return {name: kind.from_dict(data[name]) for name, kind in PARTS.items()}


def test_each_part_reads_back_to_the_same_json(report_dir: Path) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    for name, part in _typed(data).items():
        assert json.dumps(part.to_dict()) == json.dumps(data[name]), name
    lookup = LookupResult.from_dict(data["lookup"])
    assert lookup.figures.n == data["lookup"]["n"] and lookup.day == "2026-01-12"
    impact = ImpactResult.from_dict(data["impact"])
    assert impact.figures.arms["leap"].trimmed.cost_change == \
        data["impact"]["arms"]["leap"]["trimmed"]["cost_change"]
    assert impact.figures.headline.arm("leap") is impact.figures.headline.leap


def test_report_tables_cover_each_study(report_dir: Path) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    keys = [t.key for t in report_tables(**_typed(data))]
    assert keys == ["backtest", "nights", "backtest_novelty", "lookup", "spec_ratio_transfer",
                    "ranking", "ranking_all_types", "ranking_novelty", "ranking_picks",
                    "impact", "impact_parts", "impact_bands"]
    with pytest.raises(ConfigError, match="nothing to report"):
        write_report(report_dir / "empty")


def test_report_includes_a_real_data_result(report_dir: Path, tmp_path: Path) -> None:
    data = json.loads((report_dir / "report.json").read_text())
    real = RealDataResult.from_dict({
        "generated_at": "2026-01-31T00:00:00+00:00",
        "data": {"checksum": "abc", "rows": 3, "include_flagged": False,
                 "sources": {"gavel": {"rows": 3, "repo": "r", "license": "MIT",
                                       "commits": []}}},
        "settings": ProtocolSettings(10, 0, ["unseen_hardware"], ["lookup"], ["gavel"],
                                     "x").to_dict(),
        "results": {"gavel": {"unseen_hardware": {"lookup": {
            "n": 3, "n_covered": 0, "coverage": 0.0, "accuracy_within_20pct": float("nan"),
            "accuracy_within_20pct_all": 0.0, "median_ape": float("nan"), "folds": 3}}}}})
    page = write_report(tmp_path, lookup=LookupResult.from_dict(data["lookup"]),
                        real_data=real)
    assert 'id="real-data"' in page.read_text() and "gavel  (3 rows)" in page.read_text()


def test_backtest_cli_resumes_and_prints_json(
        backtested: tuple[Workspace, dict[str, Any]]) -> None:
    ws, first = backtested
    assert first["computed"] == ["2026-01-11", "2026-01-12"]
    again = leap(ws, "backtest", *SMALL)
    assert "0 night(s) computed, 2 reused" in again
    assert "accuracy ±20% (attempts)" in again


def test_experiment_commands_use_the_published_model(fresh_copy: Workspace) -> None:
    lookup = json.loads(leap(fresh_copy, "experiment", "lookup", "--json"))
    assert lookup["model"].startswith("published") and 0 < lookup["table_coverage"] <= 1
    ranking = json.loads(leap(fresh_copy, "experiment", "ranking", "--sample", "30", "--json"))
    assert ranking["n_sampled"] == 30
    impact = leap(fresh_copy, "experiment", "impact", "--advice-depth", "1")
    assert "LEAP advice" in impact and "LP optimum" in impact
    data = json.loads(leap(fresh_copy, "experiment", "impact", "--json", "--delay-cost", "0"))
    assert data["delay_cost_weight"] == 0.0 and data["wall_s"] > 0
    assert data["arms"]["leap"]["cost_change"] == data["arms"]["leap"]["fleet_cost_change"]


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args, message in ((["backtest"], "no attempt store"),
                          (["backtest", "--dask", "nowhere"], "scheduler address"),
                          (["experiment", "lookup"], "no attempt store")):
        result = runner.invoke(app, ["--home", str(tmp_path), *args])
        assert result.exit_code == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_table_too_wide_for_the_terminal_is_printed_turned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    import leap.cli as cli
    from leap.eval.tables import Table

    cols = ("type", *(f"figure number {i}" for i in range(12)))
    wide = Table("wide", "a wide table", cols,
                 (("B200", *(f"{i}.0%" for i in range(12))),
                  ("MI300X", *(f"{i}.5%" for i in range(12)))))
    narrow = Table("narrow", "a narrow table", ("type", "n"), (("B200", "3"),))
    out = Console(width=80, record=True, force_terminal=False)
    monkeypatch.setattr(cli, "console", out)
    cli.print_tables([wide, narrow])
    lines = out.export_text().splitlines()
    # Turned: one line per figure, the rows' labels as the header; nothing cut short.
    assert any("B200" in ln and "MI300X" in ln for ln in lines)
    assert sum("figure number" in ln for ln in lines) == 12
    assert not any("…" in ln for ln in lines)
    # A table that fits keeps its shape.
    assert any("type" in ln and ln.rstrip().endswith("n ┃") for ln in lines)
