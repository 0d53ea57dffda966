"""`leap simulate`, run for real through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import leap.cli
from leap.cli import app

leap.cli._register()

SMALL_TOML = "initial_families = 300\nn_model_types = 60\nnew_families_per_day = 10.0\n"


def leap_(home: Path, *args: str) -> Result:
    return CliRunner().invoke(app, ["--home", str(home), *args])


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def one_line_error(result: Result, message: str) -> None:
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


@pytest.fixture()
def small(tmp_path: Path) -> Path:
    f = tmp_path / "small.toml"
    f.write_text(SMALL_TOML)
    return f


def test_simulate_writes_attempts_and_a_second_run_adds_nothing(tmp_path: Path,
                                                                small: Path) -> None:
    home = tmp_path / "home"
    args = ("simulate", "--days", "2", "--attempts-per-day", "300", "--seed", "3",
            "--scenario", str(small), "--json")
    first = as_json(leap_(home, *args))
    assert first["simulation"]["added"] == 600
    assert first["simulation"]["quarantined"] == 0
    assert first["attempts_in_store"] == 600
    assert sum(first["simulation"]["status"].values()) == 600
    second = as_json(leap_(home, *args))
    assert second["simulation"]["added"] == 0
    assert second["simulation"]["already_stored"] == 600
    stats = as_json(leap_(home, "stats", "--json"))
    assert stats["attempts"] == 600
    assert stats["days"] == 2
    assert stats["first_submitted_at"].startswith("2026-01-01")


def test_human_output_and_check_table(tmp_path: Path, small: Path) -> None:
    home = tmp_path / "home"
    out = leap_(home, "simulate", "--days", "2", "--attempts-per-day", "300", "--scenario",
                str(small), "--start", "2026-03-01", "--check")
    assert "simulated 2 days from 2026-03-01 (seed 0)" in out.stdout
    assert "fleet calibration" in out.stdout
    assert "oracle ceiling" in out.stdout
    assert out.exit_code in (0, 1)


def test_check_alone_reads_the_store_and_exits_by_the_spec_ranges(tmp_path: Path,
                                                                  small: Path) -> None:
    home = tmp_path / "home"
    as_json(leap_(home, "simulate", "--days", "3", "--attempts-per-day", "500",
                  "--scenario", str(small), "--json"))
    result = leap_(home, "simulate", "--check", "--json")
    report = json.loads(result.stdout)
    cal = report["calibration"]
    assert cal["attempts"] == 1500 and cal["days"] == 3
    assert 0.8 < cal["oracle_ceiling"] < 1.0
    assert set(report["calibration_ok"]) == {"throughput_span_orders", "oracle_ceiling",
                                             "observed_pair_share"}
    assert result.exit_code == (0 if all(report["calibration_ok"].values()) else 1)


def test_errors_are_one_line_with_the_fix(tmp_path: Path) -> None:
    one_line_error(leap_(tmp_path, "simulate"), "nothing to do: pass --days N")
    one_line_error(leap_(tmp_path, "simulate", "--days", "1", "--start", "01/02/2026"),
                   "--start '01/02/2026' is not a date; write it as YYYY-MM-DD")
    typo = tmp_path / "typo.toml"
    typo.write_text("initial_familes = 10\n")
    one_line_error(leap_(tmp_path, "simulate", "--days", "1", "--scenario", str(typo)),
                   "unknown scenario key 'initial_familes'; did you mean 'initial_families'?")
    one_line_error(leap_(tmp_path / "empty", "simulate", "--check"), "no attempt store at")


def test_check_on_a_store_that_was_not_simulated(tmp_path: Path) -> None:
    from leap.data.store import Store

    with Store(tmp_path / "leap.duckdb"):
        pass
    one_line_error(leap_(tmp_path, "simulate", "--check"), "holds no simulated fleet")


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(app, ["simulate", "--help"])
    assert result.exit_code == 0
    assert "leap --home /tmp/fleet simulate --days 31 --seed 1" in result.stdout
    assert "--attempts-per-day" in result.stdout


@pytest.mark.slow
def test_a_month_of_the_default_fleet(tmp_path: Path) -> None:
    """The issue's acceptance check: ~775,000 attempts over 31 days, via the real CLI."""
    home = str(tmp_path / "x")
    cmd = [sys.executable, "-m", "leap", "--home", home]
    subprocess.run([*cmd, "simulate", "--days", "31", "--seed", "1", "--json"], check=True,
                   capture_output=True)
    stats = json.loads(subprocess.run([*cmd, "stats", "--json"], check=True,
                                      capture_output=True, text=True).stdout)
    assert stats["attempts"] == 775_000
    assert stats["days"] == 31
    check = subprocess.run([*cmd, "simulate", "--check", "--json"], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr
    cal = json.loads(check.stdout)["calibration"]
    assert 0.85 <= cal["oracle_ceiling"] <= 0.95
