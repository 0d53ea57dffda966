"""Hardening (issue 11): a bad model never takes the service down, bad data never poisons the
nightly run, every entry point validates alike.

Anything that could crash the interpreter before the fix (LightGBM aborting on a malformed
model text whose checksum matches) runs in a subprocess: `leap rank`, `leap serve`, `leap
models rollback` and the verification child itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner, Result

import leap.model.artifact as artifact_module
import leap.model.verify as verify_module
from conftest import SERVER_STOP_S
from leap.catalog import Catalog
from leap.cli import _register, app
from leap.config import Workspace
from leap.data.ingest import IngestLimits, ingest_files, ingest_table, validate
from leap.data.jobs import check_jobs_frame
from leap.data.store import Store
from leap.errors import ArtifactError, DataError
from leap.model.artifact import MANIFEST, PROBE, Registry, load_artifact, verify_artifact
from leap.model.verify import PROOF, write_proof
from leap.model.window import default_as_of
from leap.rank.ranker import Ranker
from leap.serve.app import create_app

# Shared fixtures (as in test_serve).
from test_rank import jobs, point_latest, ranker  # noqa: F401
from test_serve import TIMEOUT, serving, wait_for

SPECIALIST = "model/seen.specialist_00.txt"  # the cascade part of the novelty split


# Helpers ----------------------------------------------------------------------------------
def broken_copy(reg: Registry, version: str, *, how: str = "truncate") -> str:
    """Copy the latest version as ``version`` with one model file damaged *and its SHA-256
    rewritten in the manifest*: checksums pass, only loading can tell."""
    src = reg.path(reg.latest_version() or "")
    dst = reg.root / version
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    manifest["version"] = version
    target = dst / SPECIALIST
    data = target.read_bytes()
    new = data[: len(data) // 2] if how == "truncate" else b"\xff\xfe\x00" + data[3:]
    target.write_bytes(new)
    manifest["files"][SPECIALIST] = hashlib.sha256(new).hexdigest()
    (dst / MANIFEST).write_text(json.dumps(manifest))
    return version


def good_copy(reg: Registry, version: str) -> str:
    src = reg.path(reg.latest_version() or "")
    shutil.copytree(src, reg.root / version)
    manifest = json.loads((reg.root / version / MANIFEST).read_text())
    manifest["version"] = version
    (reg.root / version / MANIFEST).write_text(json.dumps(manifest))
    return version


def leap(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "leap", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def leap_serve(home: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "leap", "--home", str(home), "serve",
                             "--port", str(port), "--check-interval", "0.1", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None, f"leap serve exited with {proc.returncode}"
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 120)
        yield base, proc
    finally:
        proc.terminate()
        proc.wait(SERVER_STOP_S)


def metrics(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{base}/metrics", timeout=TIMEOUT).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def reg(fresh_copy: Workspace) -> Registry:
    return Registry(fresh_copy.models_dir)


# 1. Load before trust -----------------------------------------------------------------------
def test_artifact_records_probe_predictions_and_verifies(reg: Registry) -> None:
    path = reg.path(reg.latest_version() or "")
    manifest = json.loads((path / MANIFEST).read_text())
    assert PROBE in manifest["files"], "the probe is checksummed like every file"
    probe = json.loads((path / PROBE).read_text())
    assert len(probe["jobs"]) == len(probe["log_throughput"]) > 0
    report = verify_artifact(path)
    assert report["ok"] and report["max_abs_diff"] <= 1e-6
    assert verify_artifact(path) is report, "one child per version, not per load"


def test_a_passed_check_is_recorded_and_vouches_only_for_the_same_files_and_code(
        reg: Registry, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = reg.path(reg.latest_version() or "")
    assert (path / PROOF).is_file(), "publishing records its check beside the manifest"

    def no_child(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the check process ran")

    def new_process() -> None:  # what a later process knows: only the files
        monkeypatch.setattr(artifact_module, "_VERIFIED", {})

    monkeypatch.setattr(artifact_module, "subprocess",
                        SimpleNamespace(run=no_child, TimeoutExpired=subprocess.TimeoutExpired))
    new_process()
    assert verify_artifact(path)["ok"], "the recorded check stands for the same files"
    extra = path / "model" / "extra.txt"
    extra.write_text("tree=0\n")  # a file the check never loaded
    new_process()
    with pytest.raises(AssertionError, match="the check process ran"):
        verify_artifact(path)
    extra.unlink()
    monkeypatch.setattr(verify_module, "_runtime", lambda: "another leap or LightGBM")
    new_process()
    with pytest.raises(AssertionError, match="the check process ran"):
        verify_artifact(path)
    assert not write_proof(tmp_path / "absent", "key", {"ok": True}), "unwritable: no proof"


def test_malformed_but_checksummed_model_is_refused_by_a_child(reg: Registry) -> None:
    bad = broken_copy(reg, "29990101-01")
    files = json.loads((reg.root / bad / MANIFEST).read_text())["files"]
    assert all(hashlib.sha256((reg.root / bad / rel).read_bytes()).hexdigest() == digest
               for rel, digest in files.items()), "every checksum matches"
    with pytest.raises(ArtifactError, match="29990101-01: model failed verification"):
        reg.verify(bad)
    with pytest.raises(ArtifactError, match="failed verification"):
        reg.load(bad)


def test_publish_refuses_a_version_that_does_not_verify(reg: Registry) -> None:
    before = reg.latest_version()
    staged = reg.staging_dir("29990101-01")
    shutil.copytree(reg.root / broken_copy(reg, "tmp-bad"), staged)
    with pytest.raises(ArtifactError, match="failed verification"):
        reg.publish(staged, "29990101-01")
    assert reg.latest_version() == before and "29990101-01" not in reg.versions()


def test_leap_rank_fails_open_on_a_malformed_latest(fresh_copy: Workspace,
                                                    jobs: list[dict[str, Any]],  # noqa: F811
                                                    tmp_path: Path) -> None:
    reg = Registry(fresh_copy.models_dir)
    point_latest(reg, broken_copy(reg, "29990101-01"))
    job = tmp_path / "job.json"
    job.write_text(json.dumps(jobs[0]))
    out = leap(fresh_copy.home, "rank", "--job", str(job), "--json")
    assert out.returncode == 0, out.stderr[-2000:]  # was 134 (SIGABRT) before
    body = json.loads(out.stdout)
    assert body["ranking"] == [] and body["reason"].startswith("no_model: ")
    assert "29990101-01 failed to load" in body["reason"] and "verification" in body["reason"]


def test_leap_serve_starts_degraded_on_a_bad_latest_and_rollback_checks_first(
        fresh_copy: Workspace, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    reg = Registry(fresh_copy.models_dir)
    good = reg.latest_version() or ""
    bad = broken_copy(reg, "29990101-01")
    point_latest(reg, bad)
    with leap_serve(fresh_copy.home) as (base, proc):
        health = httpx.get(f"{base}/healthz", timeout=TIMEOUT).json()
        assert health["status"] == "degraded" and health["refused_version"] == bad
        assert "verification" in health["reason"]
        r = httpx.post(f"{base}/v1/rank", json={"job": jobs[0]}, timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["reason"].startswith("no_model: ")
        # 2. rollback to the broken version is refused before LATEST moves ...
        point_latest(reg, good)
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=TIMEOUT).json()["status"] == "ok",
                 180)
        refused = leap(fresh_copy.home, "models", "rollback", "--to", bad)
        assert refused.returncode == 1 and "failed verification" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert reg.latest_version() == good, "LATEST still names the good version"
        # ... and a good one goes through, picked up by the running server.
        other = good_copy(reg, "29990102-01")
        ok = leap(fresh_copy.home, "models", "rollback", "--to", other)
        assert ok.returncode == 0 and reg.latest_version() == other
        wait_for(lambda: httpx.get(f"{base}/healthz", timeout=TIMEOUT).json()
                 ["model_version"] == other, 180)
        assert proc.poll() is None


def test_registry_rollback_verifies_before_moving_latest(reg: Registry) -> None:
    before = reg.latest_version()
    bad = broken_copy(reg, "29990101-01")
    with pytest.raises(ArtifactError, match="failed verification"):
        reg.rollback(bad)
    assert reg.latest_version() == before


def test_hot_swap_to_a_malformed_version_drops_no_request(
        fresh_copy: Workspace, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    """A malformed-but-checksummed version is published while `leap serve` answers."""
    reg = Registry(fresh_copy.models_dir)
    old = reg.latest_version()
    seen: list[tuple[int, str | None, str | None]] = []
    stop = threading.Event()
    with leap_serve(fresh_copy.home) as (base, proc):
        def hammer() -> None:
            with httpx.Client(base_url=base, timeout=TIMEOUT) as c:
                while not stop.is_set():
                    try:
                        r = c.post("/v1/rank", json={"job": jobs[0]})
                        body = r.json()
                        seen.append((r.status_code, body.get("model_version"),
                                     body.get("reason")))
                    except httpx.HTTPError as exc:
                        seen.append((0, None, repr(exc)))

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            wait_for(lambda: len(seen) > 5)
            bad = broken_copy(reg, "29990101-01")
            point_latest(reg, bad)
            wait_for(lambda: httpx.get(f"{base}/healthz", timeout=TIMEOUT).json()
                     ["refused_version"] == bad, 180)
            n = len(seen)
            wait_for(lambda: len(seen) > n + 5)
        finally:
            stop.set()
            thread.join(30)
        assert proc.poll() is None, "the server is alive"
        health = httpx.get(f"{base}/healthz", timeout=TIMEOUT).json()
        assert health["status"] == "ok" and health["model_version"] == old
        assert "failed verification" in health["refused_reason"]
        m = metrics(base)
        assert m[("leap_model_reload_failures_total", ())] == 1.0
        assert m[("leap_model_refused_info", (("version", bad),))] == 1.0
    assert len(seen) > 10
    assert all(code == 200 and reason is None and version == old
               for code, version, reason in seen), "no failed request, the old model serves"


# 3. Plausibility at ingest ------------------------------------------------------------------
HEADER = ("attempt_id,family_id,model_type,submitted_at,hardware,trainer_count,batch_size,"
          "status,throughput,flops_per_sample\n")


def test_implausible_rows_are_quarantined_with_their_reason(tmp_path: Path) -> None:
    rows = {
        "ok": "2026-01-05T10:00:00Z,H100-SXM,2,64,succeeded,1500,1e9",
        "future": "2999-01-01T00:00:00Z,H100-SXM,2,64,succeeded,1500,",
        "y1969": "1969-12-31T00:00:00Z,H100-SXM,2,64,succeeded,1500,",
        "y1900": "1900-06-01T00:00:00Z,H100-SXM,2,64,succeeded,1500,",
        "year1": "0001-01-01T00:00:00Z,H100-SXM,2,64,succeeded,1500,",
        "huge_tp": "2026-01-05T10:00:00Z,H100-SXM,2,64,succeeded,1e308,",
        "trainers": "2026-01-05T10:00:00Z,H100-SXM,1000000000000,64,succeeded,1500,",
        "batch": "2026-01-05T10:00:00Z,H100-SXM,2,10000000000000,succeeded,1500,",
        "mfu": "2026-01-05T10:00:00Z,H100-SXM,1,64,succeeded,1e7,1e12",
    }
    path = tmp_path / "day.csv"
    path.write_text(HEADER + "".join(f"{k},f,m,{v}\n" for k, v in rows.items()))
    home = tmp_path / "home"
    out = leap(home, "ingest", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["total"]["added"] == 1
    q = json.loads(leap(home, "quarantine", "--json", "--limit", "50").stdout)
    reasons = {r["record"]["attempt_id"]: r["reason"] for r in q["rows"]}
    assert set(reasons) == set(rows) - {"ok"}
    assert "in the future" in reasons["future"]
    assert all("before 2000-01-01" in reasons[k] for k in ("y1969", "y1900", "year1"))
    assert "above 1e+11 samples/s" in reasons["huge_tp"]
    assert "implausible trainer_count" in reasons["trainers"]
    assert "implausible batch_size" in reasons["batch"]
    assert "peak FLOP/s of H100-SXM" in reasons["mfu"]
    # The settings come from the command line: a looser floor keeps the 1969 row.
    again = tmp_path / "again.csv"
    again.write_text(HEADER + f"y1969b,f,m,{rows['y1969']}\n")
    out = leap(home, "ingest", str(again), "--earliest", "1960-01-01", "--json")
    assert json.loads(out.stdout)["total"]["added"] == 1


def test_limits_are_parameters_of_the_library(tmp_path: Path) -> None:
    table = pa.table({"attempt_id": ["a", "b"], "family_id": ["f", "f"], "model_type": ["m"] * 2,
                      "submitted_at": ["2026-01-05T00:00:00Z", "2026-03-01T00:00:00Z"],
                      "hardware": ["L4", "L4"], "trainer_count": [1, 1], "batch_size": [8, 8],
                      "status": ["succeeded"] * 2, "throughput": [10.0, 10.0]})
    now = datetime(2026, 2, 1, tzinfo=UTC)
    v = validate(table, Catalog.default(), origin="t", limits=IngestLimits(now=now))
    assert v.good.column("attempt_id").to_pylist() == ["a"]
    assert validate(table, Catalog.default(), origin="t").good.num_rows == 2, \
        "no wall clock given: no upper bound (a simulation or a replay)"
    with pytest.raises(Exception, match="max_throughput must be a positive number"):
        IngestLimits(max_throughput=float("nan"))


def test_default_as_of_ignores_attempts_after_now(sim_workspace: Workspace,
                                                  tmp_path: Path) -> None:
    shutil.copy(sim_workspace.store_path, tmp_path / "s.duckdb")
    with Store(tmp_path / "s.duckdb") as store:
        honest = default_as_of(store)
        row = pa.table({"attempt_id": ["from-2999"], "family_id": ["f"], "model_type": ["m"],
                        "submitted_at": ["2999-01-01T12:00:00Z"], "hardware": ["L4"],
                        "trainer_count": [1], "batch_size": [8], "status": ["succeeded"],
                        "throughput": [10.0]})
        ingest_table(store, row, Catalog.default(), origin="old leap, no rules")
        assert default_as_of(store) > datetime(2998, 1, 1, tzinfo=UTC)  # the old failure
        now = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
        assert default_as_of(store, now) == honest
        early = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
        assert default_as_of(store, early) <= datetime(2026, 1, 5, tzinfo=UTC)


# 4. Bounded work in the service ---------------------------------------------------------------
def test_body_limit_row_cap_and_concurrency_limit(ranker: Ranker,  # noqa: F811
                                                  jobs: list[dict[str, Any]],  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    entered = threading.Event()
    original = ranker.predict

    def slow_predict(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return original(*args, **kwargs)

    app = create_app(ranker, max_body_bytes=50_000, max_predict_rows=100,
                     max_concurrent_predicts=1)
    with serving(app) as base, httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        big = {"jobs": [jobs[0]] * 2000}
        r = c.post("/v1/predict", json=big)
        assert r.status_code == 413 and "larger than 50,000 bytes" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:  # no content-length: counted as it streams
            for _ in range(100):
                yield b" " * 1000

        r = c.post("/v1/rank", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = c.post("/v1/predict", json={"jobs": [jobs[0]] * 60, "candidates": ["L4", "T4"]})
        assert r.status_code == 422 and "more than 100" in r.json()["detail"]

        monkeypatch.setattr(ranker, "predict", slow_predict)
        body = {"jobs": [jobs[0]], "candidates": ["L4"]}
        first: list[httpx.Response] = []
        t = threading.Thread(target=lambda: first.append(c.post("/v1/predict", json=body)))
        t.start()
        assert entered.wait(20)
        second = httpx.post(f"{base}/v1/predict", json=body, timeout=TIMEOUT)
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert "retry after" in second.json()["detail"]
        assert c.post("/v1/rank", json={"job": jobs[0]}).status_code == 200, \
            "rank is not limited by batch predictions"
        release.set()
        t.join(30)
        assert first[0].status_code == 200 and first[0].json()["predictions"]
        monkeypatch.setattr(ranker, "predict", original)
        assert c.post("/v1/predict", json=body).status_code == 200, "the slot is free again"


# 5. One validation for every entry point -------------------------------------------------------
BAD_FIELDS = [
    ("trainer_count", -4), ("trainer_count", 0), ("trainer_count", True),
    ("batch_size", -16), ("num_params", -5.0), ("num_params", float("nan")),
    ("flops_per_sample", float("inf")), ("trainer_count", np.bool_(True)),
    ("batch_size", 10**400),
]


def _base_job() -> dict[str, Any]:
    return {"family_id": "f", "model_type": "m", "trainer_count": 2, "batch_size": 64}


def test_a_text_column_names_the_first_row_of_a_bad_value() -> None:
    # A text column's distinct values are checked once each; the error names the first row
    # that holds the bad one, as a row-by-row check would.
    frame = pd.DataFrame({"family_id": ["a", "b", "b", "", "c", ""], "model_type": "m",
                          "trainer_count": 1, "batch_size": 8,
                          "precision": ["bf16", None, "fp8x", "bf16", "fp8x", "fp16"]})
    frame = frame.astype({"family_id": "string", "precision": "string"})
    with pytest.raises(DataError, match="jobs row 3: job field 'family_id' must be a "
                                        "non-empty string, got ''"):
        check_jobs_frame(frame)
    frame.loc[[3, 5], "family_id"] = "d"
    with pytest.raises(DataError, match="jobs row 2: job field 'precision' must be one of"):
        check_jobs_frame(frame)
    frame.loc[[2, 4], "precision"] = "fp8"
    assert check_jobs_frame(frame) is frame


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_every_python_entry_point_refuses_alike(ranker: Ranker, field: str,  # noqa: F811
                                                value: Any) -> None:
    job = {**_base_job(), field: value}
    r = ranker.rank(job)
    assert r.ranking == [] and (r.reason or "").startswith("invalid_request: ")
    assert f"'{field}'" in (r.reason or "")
    with pytest.raises(DataError, match=f"job field '{field}'"):
        ranker.rank(job, strict=True)
    p = ranker.predict([_base_job(), job], ["L4"])
    assert p.frame.empty and f"jobs row 1: job field '{field}'" in (p.reason or "")
    if not isinstance(value, bool | np.bool_) and abs(value) < 1e300:  # a typed column
        frame = pd.DataFrame([_base_job(), job])
        p = ranker.predict(frame, ["L4"])
        assert p.frame.empty and f"jobs row 1: job field '{field}'" in (p.reason or "")


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, v in BAD_FIELDS
                                              if isinstance(v, bool) or
                                              (isinstance(v, int | float) and abs(v) < 1e300
                                               and v == v and abs(v) != float("inf"))])
def test_http_refuses_the_same_values(ranker: Ranker, field: str, value: Any,  # noqa: F811
                                      ) -> None:
    with serving(create_app(ranker)) as base:
        for path, body in (("/v1/rank", {"job": {**_base_job(), field: value}}),
                           ("/v1/predict", {"jobs": [{**_base_job(), field: value}]})):
            r = httpx.post(f"{base}{path}", json=body, timeout=TIMEOUT)
            assert r.status_code == 422 and field in r.json()["detail"], (path, r.text)


def test_numpy_scalars_are_numbers_everywhere(ranker: Ranker) -> None:  # noqa: F811
    job = {**_base_job(), "trainer_count": np.int64(4), "batch_size": np.int32(64),
           "num_params": np.float32(1e8)}
    r = ranker.rank(job, ["L4", "T4"], strict=True)
    assert r.reason is None and r.ranking
    plain = ranker.rank({**_base_job(), "trainer_count": 4, "num_params": float(np.float32(1e8))},
                        ["L4", "T4"])
    assert [e.predicted_throughput for e in r.ranking] == \
        [e.predicted_throughput for e in plain.ranking]
    p = ranker.predict([job], ["L4"], strict=True)
    assert p.reason is None and len(p.frame) == 1


def test_rank_never_raises_and_empty_results_say_why(ranker: Ranker) -> None:  # noqa: F811
    r = ranker.rank({**_base_job(), "batch_size": 10**400})
    assert r.ranking == [] and "batch_size" in (r.reason or "")
    r = ranker.rank(_base_job(), max_cost_per_hour=10**400)  # type: ignore[arg-type]
    assert r.reason is None or r.reason.startswith("no_eligible_type")
    r = ranker.rank(_base_job(), ["NOPE-1", "NOPE-2"])
    assert r.ranking == [] and (r.reason or "").startswith("no_eligible_type: ")
    assert {e.reason for e in r.excluded} == {"unknown_hardware"}
    r = ranker.rank("not a job")  # type: ignore[arg-type]
    assert r.ranking == [] and (r.reason or "").startswith("invalid_request: ")


def test_leap_predict_refuses_bad_counts(trained_workspace: Workspace, tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("family_id,model_type,trainer_count,batch_size\nf,m,2,64\nf,m,-4,64\n")
    out = leap(trained_workspace.home, "predict", str(path), "--candidates", "L4")
    assert out.returncode == 1
    assert "jobs row 1: job field 'trainer_count' must be >= 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_batch_files_refuse_booleans_for_numbers(tmp_path: Path) -> None:
    from leap.model.predict import read_jobs

    path = tmp_path / "jobs.csv"
    path.write_text("family_id,model_type,trainer_count,batch_size\nf,m,true,64\n")
    with pytest.raises(DataError, match="job field 'trainer_count' must be a number"):
        read_jobs(path)


# 6. No tracebacks ------------------------------------------------------------------------------
def test_a_model_file_that_is_not_utf8_is_an_artifact_error(reg: Registry, tmp_path: Path,
                                                           jobs: list[dict[str, Any]],  # noqa: F811
                                                           ) -> None:
    bad = broken_copy(reg, "29990101-01", how="not_utf8")
    with pytest.raises(ArtifactError, match="is not UTF-8 text"):
        load_artifact(reg.root / bad)
    home = reg.root.parent
    job = tmp_path / "job.json"
    job.write_text(json.dumps(jobs[0]))
    out = leap(home, "rank", "--job", str(job), "--version", bad, "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "not UTF-8" in json.loads(out.stdout)["reason"]
    jobs_csv = tmp_path / "jobs.csv"
    jobs_csv.write_text("family_id,model_type,trainer_count,batch_size\nf,m,2,64\n")
    out = leap(home, "predict", str(jobs_csv), "--version", bad)
    assert out.returncode == 1 and "not UTF-8" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("command", ["ingest", "predict"])
def test_binary_garbage_named_csv_is_one_clear_line(trained_workspace: Workspace,
                                                    tmp_path: Path, command: str) -> None:
    path = tmp_path / "garbage.csv"
    path.write_bytes(bytes(np.random.default_rng(3).integers(0, 256, 4000, dtype=np.uint8)))
    home = trained_workspace.home if command == "predict" else tmp_path / "home"
    out = leap(home, command, str(path))
    assert out.returncode == 1
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not a CSV text file" in lines[0], out.stderr
    assert all(ch.isprintable() for ch in lines[0]) and "\ufffd" not in out.stderr
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "home" / "leap.duckdb").exists(), "nothing written"


def test_invalid_utf8_deep_in_a_csv_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes((HEADER + "a,f,m,2026-01-05T10:00:00Z,L4,1,8,succeeded,10,\n").encode()
                     * 1 + b"b,f\xff,m,2026-01-05T10:00:00Z,L4,1,8,succeeded,10,\n")
    with Store(tmp_path / "s.duckdb") as store, \
            pytest.raises(DataError, match=r"not a CSV text file \(invalid UTF-8 near byte"):
        ingest_files(store, [path], Catalog.default())


# 7. Versions are names -------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["/etc", "../../x", "..", "a/b", "", "x" * 200])
def test_versions_are_names_in_the_models_folder(reg: Registry, version: str) -> None:
    with pytest.raises(ArtifactError, match="is not a version name"):
        reg.path(version)
    with pytest.raises(ArtifactError, match="is not a version name"):
        Ranker(reg, version=version, background_reload=False)
    before = reg.latest_version()
    with pytest.raises(ArtifactError, match="is not a version name"):
        reg.rollback(version)
    assert reg.latest_version() == before


def test_cli_refuses_paths_as_versions(fresh_copy: Workspace, tmp_path: Path,
                                       jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    # In process: every model here is sound, so nothing can crash the interpreter.
    _register()

    def cli(*args: str) -> Result:
        return CliRunner().invoke(app, ["--home", str(fresh_copy.home), *args])

    reg = Registry(fresh_copy.models_dir)
    outside = tmp_path / "elsewhere"
    shutil.copytree(reg.path(reg.latest_version() or ""), outside)
    job = tmp_path / "job.json"
    job.write_text(json.dumps(jobs[0]))
    before = reg.latest_version()
    for version in (str(outside), f"../../{outside.name}"):
        out = cli("rank", "--job", str(job), "--version", version)
        assert out.exit_code == 1 and "is not a version name" in out.stderr
        out = cli("models", "rollback", "--to", version)
        assert out.exit_code == 1 and "is not a version name" in out.stderr
    assert reg.latest_version() == before
    (fresh_copy.models_dir / "LATEST").write_text(str(outside) + "\n")  # a hand-edited pointer
    out = cli("rank", "--job", str(job), "--json")
    assert out.exit_code == 0 and "is not a version name" in json.loads(out.stdout)["reason"]


# 8. OpenAPI lists every status -----------------------------------------------------------------
def test_openapi_lists_every_status_and_400_is_json(ranker: Ranker) -> None:  # noqa: F811
    with serving(create_app(ranker)) as base:
        spec = httpx.get(f"{base}/openapi.json", timeout=TIMEOUT).json()
        predict = spec["paths"]["/v1/predict"]["post"]["responses"]
        rank = spec["paths"]["/v1/rank"]["post"]["responses"]
        assert {"200", "400", "401", "413", "422", "429"} <= set(predict)
        assert {"200", "400", "401", "413", "422"} <= set(rank)
        r = httpx.post(f"{base}/v1/rank", content=b'{"job": "\xff\xfe"}',
                       headers={"content-type": "application/json"}, timeout=TIMEOUT)
        assert r.status_code in (400, 422) and str(r.status_code) in rank
        assert r.json()["detail"]

