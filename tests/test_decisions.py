"""The decision log: every ranking recorded off the request path, drops counted, retention."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from leap.errors import ConfigError
from leap.rank.decisions import DecisionLog, _Pending, read_decisions
from leap.rank.ranker import Ranker
from leap.serve.app import create_app
from test_rank import jobs, ranker  # noqa: F401


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_python_api_rankings_are_recorded_with_ids_and_entries(
        ranker: Ranker, jobs: list[dict[str, Any]], tmp_path: Path,  # noqa: F811
        process: bool) -> None:
    """The same rows whether this process writes them or a child does (as `leap serve`)."""
    log = DecisionLog(tmp_path / "d.duckdb", flush_interval_s=0.05, process=process)
    mine = ranker.with_options()
    mine.decision_sink = log.sink("python")
    results = []
    for i, job in enumerate(jobs[:5]):
        req = {**job, "attempt_id": f"a{i}", "submitted_at": f"2026-01-12T0{i}:30:00Z"}
        results.append(mine.rank(req, ["H100-SXM", "A100-SXM4-80GB", "L4", "T4"]))
    results.append(mine.rank({"family_id": "f"}))  # a bad request fails open, also recorded
    assert log.flush(120)
    log.close()
    assert (log.recorded, log.written, log.dropped) == (6, 6, 0)
    dec, ent = read_decisions(tmp_path / "d.duckdb")
    assert len(dec) == 6
    by_attempt = dec.set_index("attempt_id")
    for i, res in enumerate(results[:5]):
        row = by_attempt.loc[f"a{i}"]
        assert row["source"] == "python" and row["model_version"] == res.model_version
        assert row["launch_at"].isoformat().startswith(f"2026-01-12T0{i}:30:00")
        assert json.loads(row["candidates"]) == ["H100-SXM", "A100-SXM4-80GB", "L4", "T4"]
        assert row["n_ranked"] == len(res.ranking) and not row["fail_open"]
        got = ent[ent["decision_id"] == row["decision_id"]].sort_values("position")
        assert got["hardware"].tolist() == [r.hardware for r in res.ranking]
        assert got["predicted_throughput"].tolist() == pytest.approx(
            [r.predicted_throughput for r in res.ranking])
        assert got["throughput_p10"].tolist() == pytest.approx(
            [r.throughput_p10 for r in res.ranking])
    bad = dec[dec["attempt_id"].isna()].iloc[0]
    assert bad["fail_open"] and bad["reason"].startswith("invalid_request")
    assert bad["n_ranked"] == 0 and pd.isna(bad["first_choice"])


def test_steady_traffic_is_flushed_at_most_once_per_interval(
        ranker: Ranker, jobs: list[dict[str, Any]], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush costs tens of milliseconds whatever its size: records arriving every few
    milliseconds are gathered into one batch per interval, not written one flush each."""
    flushes: list[int] = []
    write = DecisionLog._write
    monkeypatch.setattr(DecisionLog, "_write",
                        lambda self, batch: (flushes.append(len(batch)), write(self, batch))[1])
    log = DecisionLog(tmp_path / "d.duckdb", flush_interval_s=0.25)
    answer = ranker.rank(jobs[0], ["H100-SXM", "L4"])
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < 1.0:
        log.record(jobs[0], ["H100-SXM", "L4"], answer)
        sent += 1
        time.sleep(0.005)
    assert log.flush(120)
    log.close()
    assert log.written == sent and sum(flushes) == sent
    # 1 s of traffic at one flush per 0.25 s: about 5 flushes (one record each: over 100).
    assert len(flushes) <= 7, flushes
    assert len(read_decisions(tmp_path / "d.duckdb")[0]) == sent


@pytest.mark.parametrize("process", [False, True], ids=["thread", "process"])
def test_full_queue_drops_and_counts_without_blocking(ranker: Ranker,  # noqa: F811
                                                      jobs: list[dict[str, Any]],  # noqa: F811
                                                      tmp_path: Path, process: bool) -> None:
    # The log's path is a directory: every flush fails, so the queue fills and stays full.
    (tmp_path / "d.duckdb").mkdir()
    log = DecisionLog(tmp_path / "d.duckdb", max_queue=2, max_batch=1, flush_interval_s=0.05,
                      process=process)
    mine = ranker.with_options()
    mine.decision_sink = log.sink("python")
    time.sleep(0.1)
    for _ in range(20):
        t0 = time.perf_counter()
        res = mine.rank(jobs[0])
        assert res.ok and time.perf_counter() - t0 < 1.0
    assert log.recorded + log.dropped == 20
    assert log.dropped >= 17 and log.written == 0
    deadline = time.monotonic() + 120
    while not log.write_errors and time.monotonic() < deadline:
        time.sleep(0.02)
    assert log.write_errors >= 1 and log.last_error
    # The child reports DuckDB's own error, as the thread does (not wrapped).
    assert log.last_error.startswith("IOException: ") and "Is a directory" in log.last_error
    log.close(2)


def test_a_writer_process_that_dies_is_replaced_and_loses_nothing(
        ranker: Ranker, jobs: list[dict[str, Any]], tmp_path: Path) -> None:  # noqa: F811
    log = DecisionLog(tmp_path / "d.duckdb", flush_interval_s=0.05, process=True)
    answer = ranker.rank(jobs[0], ["H100-SXM", "L4"])
    log.record({**jobs[0], "job_id": "first"}, ["H100-SXM", "L4"], answer)
    assert log.flush(120)
    assert log._child is not None
    first = log._child.proc
    first.kill()
    first.wait(10)
    for i in range(3):
        log.record({**jobs[0], "job_id": f"after-{i}"}, None, answer)
    assert log.flush(120)
    log.close()
    assert log._child is None and first.poll() is not None
    assert (log.recorded, log.written, log.dropped) == (4, 4, 0)
    dec, ent = read_decisions(tmp_path / "d.duckdb")
    assert sorted(dec["job_id"]) == ["after-0", "after-1", "after-2", "first"]
    assert len(ent) == 4 * len(answer.ranking)


# A writer child that writes the first batch it is sent, commits it, and then never answers
# (as one starved of CPU, or stopped between its commit and its answer).
_SILENT_CHILD = """
import sys, time, orjson
from pathlib import Path
from leap.rank.decisions import _Store, _receive
_Store(Path(sys.argv[1]), None).write(orjson.loads(_receive(sys.stdin.buffer)))
Path(sys.argv[1] + ".committed").touch()
time.sleep(600)
"""


def test_close_writes_what_a_silent_child_holds_and_stores_each_decision_once(
        ranker: Ranker, jobs: list[dict[str, Any]], tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping, the writer does not wait on a child that does not answer: the child is
    stopped and the thread writes its batch and the rest itself; the batch the child had
    committed already is not stored twice."""
    import subprocess
    import sys

    import leap.rank.decisions as decisions

    started: list[subprocess.Popen[bytes]] = []

    def silent_child(path: Path, retention_days: float | None) -> Any:
        proc = subprocess.Popen([sys.executable, "-c", _SILENT_CHILD, str(path)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        return decisions._Child(proc, proc.stdin, proc.stdout)

    monkeypatch.setattr(decisions, "_start_child", silent_child)
    path = tmp_path / "d.duckdb"
    log = DecisionLog(path, flush_interval_s=0.05, process=True)
    try:
        _close_with_a_silent_child(log, ranker, jobs, path)
    finally:  # never leave a sleeping child behind, whatever failed
        for proc in started:
            proc.kill()
            proc.wait()


def _close_with_a_silent_child(log: DecisionLog, ranker: Ranker,  # noqa: F811
                               jobs: list[dict[str, Any]], path: Path) -> None:  # noqa: F811
    answer = ranker.rank(jobs[0], ["H100-SXM", "L4"])
    for i in range(3):
        log.record({**jobs[0], "job_id": f"sent-{i}"}, None, answer)
    committed = Path(f"{path}.committed")
    deadline = time.monotonic() + 120
    while not committed.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert committed.exists(), "the child never wrote its batch"
    child = log._child
    assert child is not None
    for i in range(2):  # queued while the writer waits on the child's answer
        log.record({**jobs[0], "job_id": f"queued-{i}"}, None, answer)
    t0 = time.monotonic()
    log.close(9)
    assert time.monotonic() - t0 < 30  # not the child's 600 s
    assert child.proc.poll() is not None  # stopped, not left behind
    assert (log.recorded, log.written, log.dropped) == (5, 5, 0)
    dec, ent = read_decisions(path)
    assert sorted(dec["job_id"]) == ["queued-0", "queued-1", "sent-0", "sent-1", "sent-2"]
    assert dec["decision_id"].is_unique
    assert len(ent) == 5 * len(answer.ranking)


def test_a_batch_written_twice_is_stored_once(ranker: Ranker,  # noqa: F811
                                              jobs: list[dict[str, Any]],  # noqa: F811
                                              tmp_path: Path) -> None:
    from leap.rank.decisions import _Store

    answer = ranker.rank(jobs[0], ["H100-SXM", "L4"])
    records = [_Pending.of(time.time(), "python", {**jobs[0], "job_id": f"j{i}"}, None, answer)
               for i in range(3)]
    store = _Store(tmp_path / "d.duckdb", None)
    store.write(records[:2])
    store.write(records)  # the first two again, with a new one
    dec, ent = read_decisions(tmp_path / "d.duckdb")
    assert sorted(dec["job_id"]) == ["j0", "j1", "j2"]
    assert len(ent) == 3 * len(answer.ranking)
    store.write(records)  # nothing new: nothing written, no error
    assert len(read_decisions(tmp_path / "d.duckdb")[0]) == 3


def test_records_are_queued_as_json_bytes_the_collector_never_tracks(
        ranker: Ranker, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    """Live result objects held until a flush were promoted to the oldest generation and made
    a busy server run full collections (see ``_Pending``)."""
    import gc

    values = _Pending.of(time.time(), "http", jobs[0], ["H100-SXM", "L4"],
                         ranker.rank(jobs[0], ["H100-SXM", "L4"]))
    record = _Pending.encoded(values)
    assert type(record) is bytes and not gc.is_tracked(record)
    back = _Pending._make(json.loads(record))
    assert back.entries[0][0] in ("H100-SXM", "L4") and back.at == values[1]
    assert back.decision_id == values[0] and len(back.decision_id) == 32
    assert json.loads(back.job)["family_id"] == jobs[0]["family_id"]


def test_a_failing_sink_never_changes_the_answer(ranker: Ranker,  # noqa: F811
                                                 jobs: list[dict[str, Any]]  # noqa: F811
                                                 ) -> None:
    mine = ranker.with_options()

    def broken(*_: Any) -> None:
        raise RuntimeError("disk on fire")

    mine.decision_sink = broken
    assert [r.hardware for r in mine.rank(jobs[0]).ranking] == \
        [r.hardware for r in ranker.rank(jobs[0]).ranking]


def test_retention_deletes_old_decisions(ranker: Ranker, jobs: list[dict[str, Any]],  # noqa: F811
                                         tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "d.duckdb", retention_days=1, flush_interval_s=0.05)
    res = ranker.rank(jobs[0])
    log._queue.put(_Pending.encoded(_Pending.of(time.time() - 3 * 86400, "python",
                                                {**jobs[0], "job_id": "old"}, None, res)))
    with log._count_lock:
        log.recorded += 1
    log.record({**jobs[0], "job_id": "new"}, None, res)
    assert log.flush(120)
    log.close()
    dec, ent = read_decisions(tmp_path / "d.duckdb")
    assert dec["job_id"].tolist() == ["new"]
    assert set(ent["decision_id"]) == set(dec["decision_id"])


def test_bad_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="retention must be a positive"):
        DecisionLog(tmp_path / "d.duckdb", retention_days=0)
    with pytest.raises(ConfigError, match="source must be one of"):
        DecisionLog(tmp_path / "e.duckdb").sink("ftp")


def _metric(text: str, name: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    raise KeyError(name)


def test_http_rankings_are_recorded_and_counted_in_metrics(
        ranker: Ranker, jobs: list[dict[str, Any]], tmp_path: Path) -> None:  # noqa: F811
    log = DecisionLog(tmp_path / "d.duckdb", flush_interval_s=0.05)
    mine = ranker.with_options()
    with TestClient(create_app(mine, decisions=log)) as client:
        for i, job in enumerate(jobs[:3]):
            r = client.post("/v1/rank", json={"job": {**job, "job_id": f"j{i}"}})
            assert r.status_code == 200 and r.json()["ranking"]
        assert client.post("/v1/rank", json={"job": {"family_id": "x"}}).status_code == 422
        assert log.flush(120)
        text = client.get("/metrics").text
        assert _metric(text, "leap_decisions_written_total") == 3
        assert _metric(text, "leap_decisions_dropped_total") == 0
    assert mine.decision_sink is None  # detached at shutdown
    dec, _ = read_decisions(tmp_path / "d.duckdb")
    assert sorted(dec["job_id"]) == ["j0", "j1", "j2"] and set(dec["source"]) == {"http"}


def test_cli_rank_record_logs_one_decision(fresh_copy: Any, jobs: list[dict[str, Any]],  # noqa: F811
                                           tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from leap.cli import _register, app
    from leap.rank.decisions import decisions_path

    _register()
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps({**jobs[0], "job_id": "cli-1"}))
    res = CliRunner().invoke(app, ["--home", str(fresh_copy.home), "rank", "--job",
                                   str(job_file), "--record", "--json"])
    assert res.exit_code == 0, res.output
    dec, ent = read_decisions(decisions_path(fresh_copy.home))
    assert dec["job_id"].tolist() == ["cli-1"] and dec["source"].tolist() == ["cli"]
    assert len(ent) == len(json.loads(res.output)["ranking"]) > 0
