"""Tests for `leap ingest`, `leap stats` and `leap quarantine`, run for real."""

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

DATA = Path(__file__).parent / "data"
SMALL = DATA / "attempts_small.csv"
BAD = DATA / "attempts_bad.csv"
MISSING = DATA / "attempts_missing_column.csv"

leap.cli._register()


def leap_(home: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, ["--home", str(home), *args], env=env)


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, message: str) -> None:
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_stats_numbers_on_the_hand_made_fixture(tmp_path: Path) -> None:
    home = tmp_path / "home"
    as_json(leap_(home, "ingest", str(SMALL), "--json"))
    s = as_json(leap_(home, "stats", "--json"))
    assert s["attempts"] == 12
    # s05 is 2024-05-02T01:00+02:00, i.e. still 1 May in UTC.
    assert s["per_day"] == [{"date": "2024-05-01", "attempts": 5},
                            {"date": "2024-05-02", "attempts": 4},
                            {"date": "2024-05-03", "attempts": 3}]
    assert s["per_hardware"] == {"H100-SXM": 5, "A100-SXM4-80GB": 4, "MI300X": 3}
    assert s["per_status"] == {"succeeded": 8, "failed": 2, "oom": 1, "preempted": 1}
    assert (s["families"], s["model_types"], s["days"], s["quarantined"]) == (3, 2, 3, 0)
    assert s["first_submitted_at"] == "2024-05-01T00:10:00+00:00"
    assert s["last_submitted_at"] == "2024-05-03T12:00:00+00:00"
    assert s["succeeded_share"] == pytest.approx(8 / 12)

    as_json(leap_(home, "ingest", str(BAD), "--json"))
    s = as_json(leap_(home, "stats", "--json"))
    assert (s["attempts"], s["quarantined"], s["batches"]) == (14, 6, 2)
    assert s["quarantine_reasons"]["trainer_count must be >= 1 (the number of trainers)"] == 1

    text = leap_(home, "stats")
    assert text.exit_code == 0
    for fragment in ("attempts", "14", "MI300X", "2024-05-03", "job families",
                     "quarantined rows", "preempted"):
        assert fragment in text.stdout


def test_ingest_json_report_and_idempotent_reingest(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = as_json(leap_(home, "ingest", str(SMALL), str(BAD), "--json"))
    assert out["total"] == {
        "rows_read": 20, "added": 14, "already_stored": 0, "quarantined": 6,
        "reasons": out["total"]["reasons"]}
    assert sum(out["total"]["reasons"].values()) == 6
    assert out["files"][1]["unknown_columns"] == ["cluster"]
    assert out["attempts_in_store"] == 14
    assert (home / "leap.duckdb").is_file()
    again = as_json(leap_(home, "ingest", str(SMALL), str(BAD), "--json"))
    assert (again["total"]["added"], again["total"]["already_stored"]) == (0, 14)
    assert again["attempts_in_store"] == 14
    q = as_json(leap_(home, "quarantine", "--json"))
    assert q["total"] == 6  # quarantined rows are not stored twice either


def test_ingest_text_summary_shows_counts_reasons_and_unknown_columns(tmp_path: Path) -> None:
    result = leap_(tmp_path / "home", "ingest", str(BAD))
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())  # undo Rich's wrapping
    assert "attempts_bad.csv │ 8 │ 2 │ 0 │ 6" in out
    assert "unknown hardware 'H100-SXN'; did you mean 'H100-SXM'?" in out
    assert "unknown status 'sucess'; did you mean 'succeeded'?" in out
    assert "ignored unknown column(s) in attempts_bad.csv: 'cluster'" in out
    assert "now holds 2 attempts" in out


@pytest.mark.parametrize(("args", "message"), [
    ([str(MISSING)], "attempts_missing_column.csv: missing required column(s) 'status'; for "
                     "'status' did you mean 'statuss'?"),
    (["nope.csv"], "nope.csv: no such file"),
    (["attempts.xlsx"], "attempts.xlsx: unsupported file type"),
    ([str(SMALL), str(MISSING)], "missing required column(s) 'status'"),
])
def test_bad_input_is_one_line_exit_1_and_writes_nothing(
        tmp_path: Path, args: list[str], message: str) -> None:
    home = tmp_path / "home"
    assert_one_line_error(leap_(home, "ingest", *args), message)
    assert not (home / "leap.duckdb").exists()


def test_unreadable_file_leaves_an_existing_store_untouched(tmp_path: Path) -> None:
    home = tmp_path / "home"
    as_json(leap_(home, "ingest", str(BAD), "--json"))
    before = as_json(leap_(home, "stats", "--json"))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    assert_one_line_error(leap_(home, "ingest", str(SMALL), str(junk)),
                          "junk.parquet: cannot read as Parquet")
    after = as_json(leap_(home, "stats", "--json"))
    assert after == before


def test_stats_and_quarantine_without_a_store(tmp_path: Path) -> None:
    for cmd in ("stats", "quarantine"):
        assert_one_line_error(leap_(tmp_path / "empty", cmd), "no attempt store at")
    assert not (tmp_path / "empty").exists()


def test_quarantine_lists_rows_with_reasons(tmp_path: Path) -> None:
    home = tmp_path / "home"
    as_json(leap_(home, "ingest", str(BAD), "--json"))
    q = as_json(leap_(home, "quarantine", "--limit", "2", "--json"))
    assert q["total"] == 6 and len(q["rows"]) == 2
    first = q["rows"][0]
    assert first["source"] == str(BAD.resolve())
    assert first["row_number"] == 2
    assert first["reason"].startswith("unknown hardware 'H100-SXN'")
    assert first["record"]["hardware"] == "H100-SXN"
    text = leap_(home, "quarantine")
    assert text.exit_code == 0 and "quarantine: 6 of 6 rows" in text.stdout


def test_leap_home_environment_variable(tmp_path: Path) -> None:
    home = tmp_path / "from-env"
    result = CliRunner().invoke(app, ["ingest", str(SMALL), "--json"],
                                env={"LEAP_HOME": str(home)})
    assert json.loads(result.stdout)["store"] == str(home / "leap.duckdb")
    assert (home / "leap.duckdb").is_file()


@pytest.mark.parametrize("command", ["ingest", "stats", "quarantine"])
def test_help_has_an_example(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    example = [line for line in result.stdout.splitlines() if "Example:" in line]
    assert len(example) == 1
    assert "leap " in example[0] and f" {command}" in example[0]


def test_real_process_error_is_one_line_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "leap", "--home", str(tmp_path / "h"), "ingest", str(MISSING)],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert "missing required column(s) 'status'" in proc.stderr
    assert "Traceback" not in proc.stderr
