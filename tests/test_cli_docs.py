"""The CLI against its docs: every command is in the README and has an example in --help."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from leap.cli import _register, app

README = (Path(__file__).parent.parent / "README.md").read_text()
runner = CliRunner()
_register()


def _commands() -> list[list[str]]:
    root = get_command(app)
    out: list[list[str]] = []
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        if subs:
            out += [[name, sub] for sub in subs]
        else:
            out.append([name])
    return out


@pytest.mark.parametrize("words", _commands(), ids=lambda w: " ".join(w))
def test_every_command_is_in_the_readme_and_has_an_example(words: list[str]) -> None:
    assert re.search(r"leap " + r"\s+".join(map(re.escape, words)) + r"\b", README), \
        f"`leap {' '.join(words)}` is not in README.md"
    res = runner.invoke(app, [*words, "--help"])
    assert res.exit_code == 0
    assert "Example" in res.output


def test_python_dash_m_leap_works() -> None:
    res = subprocess.run([sys.executable, "-m", "leap", "--help"], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0 and "Predict training throughput" in res.stdout


def test_import_leap_is_cheap() -> None:
    code = ("import sys, leap; heavy = {'fastapi', 'dask', 'lightgbm', 'matplotlib', "
            "'uvicorn'} & set(sys.modules); print(sorted(heavy))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert res.stdout.strip() == "[]"


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    res = runner.invoke(app, ["--home", str(tmp_path), "demo", "--days", "5",
                              "--attempts-per-day", "600", "--model", "global"])
    assert res.exit_code == 0, res.output
    assert "held-out day 2026-01-05" in res.output
    assert "A job with history" in res.output and "preference list" in res.output
    assert "80% range" in res.output and "…" not in res.output  # 80 columns, nothing cut
    text = " ".join(res.output.split())  # Rich wraps long lines at word boundaries
    assert "x the prediction" in text and "best true value among the ranked types" in text
    assert (tmp_path / "models" / "LATEST").is_file()
