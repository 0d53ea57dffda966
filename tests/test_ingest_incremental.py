"""`leap ingest` of a Hive-partitioned directory or a glob, and `--incremental`: each file once."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import leap.data.ingest as ingest_mod
from leap.cli import _register, app
from leap.data.ingest import expand_inputs
from leap.data.store import Store
from leap.errors import DataError

runner = CliRunner()
_register()


def _day(root: Path, day: str, n: int, start: int = 0) -> Path:
    """One partition ``date=DAY/part-0.parquet`` with ``n`` attempts."""
    part = root / f"date={day}"
    part.mkdir(parents=True, exist_ok=True)
    ids = [f"{day}-{i}" for i in range(start, start + n)]
    table = pa.table({"attempt_id": ids, "family_id": [f"fam-{i % 3}" for i in range(n)],
                      "model_type": ["resnet50"] * n,
                      "submitted_at": [f"{day}T0{i % 10}:00:00Z" for i in range(n)],
                      "hardware": ["H100-SXM"] * n, "trainer_count": [2] * n,
                      "batch_size": [256] * n, "status": ["succeeded"] * n,
                      "throughput": [1000.0 + i for i in range(n)]})
    path = part / "part-0.parquet"
    pq.write_table(table, path)
    return path


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each file is read by the ingest code."""
    counts: Counter[str] = Counter()
    real = ingest_mod.read_attempts_file

    def counting(path: Path) -> pa.Table:
        counts[str(Path(path).resolve())] += 1
        return real(path)

    monkeypatch.setattr(ingest_mod, "read_attempts_file", counting)
    return counts


def _ingest(home: Path, *args: str) -> dict[str, object]:
    res = runner.invoke(app, ["--home", str(home), "ingest", *args, "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, object] = json.loads(res.output)
    return out


def test_incremental_ingest_reads_each_file_once(tmp_path: Path, reads: Counter[str]) -> None:
    export = tmp_path / "export"
    files = [_day(export, d, 5) for d in ("2026-01-01", "2026-01-02", "2026-01-03")]
    (export / "_SUCCESS").write_text("")  # a warehouse marker, not data
    home = tmp_path / "home"
    first = _ingest(home, "--incremental", str(export))
    assert first["total"]["added"] == 15 and first["skipped_files"] == 0  # type: ignore[index]
    assert sorted(reads) == sorted(str(f.resolve()) for f in files)
    again = _ingest(home, "--incremental", str(export))
    assert again["files"] == [] and again["skipped_files"] == 3
    new = _day(export, "2026-01-04", 4)
    third = _ingest(home, "--incremental", str(export))
    assert [f["source"] for f in third["files"]] == [str(new.resolve())]  # type: ignore[index]
    # A partition rewritten with more rows (new size and time) is read again, once.
    _day(export, "2026-01-02", 7)
    os.utime(files[1], ns=(10**18, 10**18))
    fourth = _ingest(home, "--incremental", str(export))
    assert fourth["total"]["added"] == 2 and fourth["skipped_files"] == 3  # type: ignore[index]
    assert _ingest(home, "--incremental", str(export))["files"] == []
    assert reads == Counter({**{str(f.resolve()): 1 for f in files}, str(new.resolve()): 1,
                             str(files[1].resolve()): 2})
    with Store(home / "leap.duckdb", read_only=True) as store:
        assert store.count() == 21
        assert set(store.ingested_files()) == {str(p.resolve()) for p in [*files, new]}


def test_a_glob_pattern_and_plain_ingest_also_record_files(tmp_path: Path) -> None:
    export = tmp_path / "export"
    for d in ("2026-02-01", "2026-02-02"):
        _day(export, d, 3)
    home = tmp_path / "home"
    out = _ingest(home, str(export / "date=2026-02-0*" / "*.parquet"))
    assert out["total"]["added"] == 6  # type: ignore[index]
    assert _ingest(home, "--incremental", str(export))["files"] == []


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(tmp_path / "empty")])
    assert res.exit_code == 1 and "no attempt files" in res.output
    res = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest",
                              str(tmp_path / "nowhere" / "*.parquet")])
    assert res.exit_code == 1 and "no file matches this pattern" in res.output
    assert "Traceback" not in res.output
    with pytest.raises(DataError, match="no attempt files"):
        expand_inputs([tmp_path / "empty"])
