"""`leap serve` over real HTTP on loopback: rank, predict, ops endpoints, 422s, fail-open,
hot reload, token, and a schema-driven fuzz."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

import leap.serve.app as app_module
from conftest import SERVER_STOP_S
from leap.config import Workspace
from leap.features.pair_rows import native_kernels
from leap.features.transfer import transfer_kernels
from leap.model.artifact import Registry
from leap.rank.decisions import decisions_path, read_decisions
from leap.rank.ranker import Ranker
from leap.serve.app import GcFreezer, _Edge, create_app
from leap.serve.payloads import ModelInfo, PredictResponse, RankResponse

# The ranker fixtures are shared with test_rank (candidates for tests/conftest.py).
from test_rank import copy_models, jobs, publish_copy, ranker  # noqa: F401

TIMEOUT = httpx.Timeout(20.0)


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on a free loopback port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def url(ranker: Ranker) -> Iterator[str]:  # noqa: F811
    with serving(create_app(ranker)) as base:
        yield base


@pytest.fixture(scope="module")
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        yield client


def wait_for(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def wait_until_serving(proc: subprocess.Popen[bytes], base: str, timeout_s: float = 60.0
                       ) -> None:
    """Wait until the `leap serve` process ``proc`` answers ``base``/healthz (its output in
    the failure if it exits first)."""
    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return False

    wait_for(up, timeout_s)


# The endpoints ----------------------------------------------------------------------------
def test_rank_endpoint_matches_the_library(http: httpx.Client, ranker: Ranker,  # noqa: F811
                                           jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    resp = http.post("/v1/rank", json={"job": jobs[0], "candidates": ["H100-SXM", "L4", "T4",
                                                                      "B200"]})
    assert resp.status_code == 200
    body = resp.json()
    assert {"ranking", "excluded", "model_version", "reason", "objective",
            "latency_ms"} <= set(body)
    first = body["ranking"][0]
    assert {"hardware", "predicted_throughput", "cost_per_hour", "value",
            "predicted_utilization", "flags"} <= set(first)
    local = ranker.rank(jobs[0], ["H100-SXM", "L4", "T4", "B200"])
    assert [e["hardware"] for e in body["ranking"]] == [e.hardware for e in local.ranking]
    assert body["model_version"] == ranker.model_version and body["reason"] is None
    assert RankResponse.model_validate(body).ranking[0].value == pytest.approx(
        local.ranking[0].value)


def test_rank_body_is_exactly_the_response_model(http: httpx.Client,
                                                jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    """The body is written by orjson without pydantic: it must be what RankResponse gives."""
    for job in jobs[:6]:
        for fmt in ("json", "slurm"):
            body = http.post("/v1/rank", json={"job": job, "format": fmt}).json()
            expect = RankResponse.model_validate(body).model_dump(mode="json")
            assert body == expect
            assert body["format"] == fmt and (body["formatted"] is None) == (fmt == "json")


def test_rank_answered_at_the_edge_is_fastapis_answer(http: httpx.Client,
                                                      jobs: list[dict[str, Any]]  # noqa: F811
                                                      ) -> None:
    """A JSON body is answered by the edge middleware without FastAPI's layers; another
    ``+json`` content type goes through FastAPI's route: the same answer, and the same error
    for a bad request."""
    def both(body: Any) -> list[httpx.Response]:
        content = json.dumps(body).encode()
        return [http.post("/v1/rank", content=content, headers={"content-type": kind})
                for kind in ("application/json", "application/vnd.leap+json")]

    for job in jobs[:4]:
        for extra in ({}, {"candidates": ["L4", "H100-SXM", "T4"], "risk": "averse",
                           "objective": "throughput", "format": "kubernetes"},
                      {"free_devices": {"L4": 0}, "max_cost_per_hour": 50.0}):
            direct, routed = (r.json() for r in both({"job": job, **extra}))
            direct.pop("latency_ms"), routed.pop("latency_ms")
            assert direct == routed and direct["ranking"]
    for bad in ({"job": jobs[0], "candidates": ["H10O"]}, {"job": {**jobs[0],
                "trainer_count": "many"}}, {"job": jobs[0], "colour": "red"}, [1]):
        direct, routed = both(bad)
        assert direct.status_code == routed.status_code == 422
        assert direct.json() == routed.json()


def test_edge_answers_json_rank_posts_and_hands_the_rest_to_the_app() -> None:
    from prometheus_client import CollectorRegistry, Counter, Histogram

    seen: list[tuple[str, bytes]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        seen.append((scope["path"], message.get("body", b"")))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})

    async def rank(body: bytes) -> tuple[int, bytes] | None:
        return None if body == b"invalid" else (200, b'{"ranked": true}')

    metrics = CollectorRegistry()
    edge = _Edge(app, token=None, requests=Counter("r", "r", ["path", "method", "status"],
                                                   registry=metrics),
                 latency=Histogram("l", "l", ["path"], registry=metrics), rank=rank)

    def call(path: str, body: bytes, method: str = "POST",
             kind: bytes | None = b"application/json; charset=utf-8") -> tuple[int, bytes]:
        out: list[Any] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> Any:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            out.append(message)

        headers = [] if kind is None else [(b"content-type", kind)]
        asyncio.run(edge({"type": "http", "path": path, "method": method, "headers": headers},
                         receive, send))
        return out[0]["status"], out[1]["body"]

    assert call("/v1/rank", b"{}") == (200, b'{"ranked": true}') and not seen
    assert call("/v1/rank", b"invalid") == (299, b"app") and seen[-1] == ("/v1/rank", b"invalid")
    for args in (("/v1/rank", b"{}", "POST", b"text/plain"), ("/v1/rank", b"{}", "POST", None),
                 ("/v1/rank", b"{}", "PUT"), ("/v1/predict", b"{}")):
        assert call(*args) == (299, b"app")  # type: ignore[arg-type]
    assert len(seen) == 5


def test_rank_with_free_devices(http: httpx.Client, ranker: Ranker,  # noqa: F811
                                jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    cands = ["H100-SXM", "L4", "T4", "B200"]
    plain = [r.hardware for r in ranker.rank(jobs[0], cands).ranking]
    resp = http.post("/v1/rank", json={"job": jobs[0], "candidates": cands,
                                       "free_devices": {plain[0]: 0}})
    assert resp.status_code == 200
    body = resp.json()
    assert [e["hardware"] for e in body["ranking"]] == [*plain[1:], plain[0]]
    assert "no_free_devices" in body["ranking"][-1]["flags"]


def test_rank_reports_ignored_fields_and_objective(http: httpx.Client,
                                                   jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    resp = http.post("/v1/rank", json={"job": {**jobs[0], "throughput": 1.0, "typo_field": 2},
                                       "objective": "throughput", "max_cost_per_hour": 50})
    body = resp.json()
    assert resp.status_code == 200 and body["objective"] == "throughput"
    assert body["ignored_fields"] == ["throughput", "typo_field"]
    assert all(e["cost_per_hour"] <= 50 for e in body["ranking"])


def test_predict_endpoint(http: httpx.Client, ranker: Ranker,  # noqa: F811
                          jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    req = {"jobs": [jobs[0], {**jobs[1], "hardware": "L4"}], "candidates": ["H100-SXM", "T4"]}
    resp = http.post("/v1/predict", json=req)
    assert resp.status_code == 200
    out = PredictResponse.model_validate_json(resp.content)
    assert out.reason is None and len(out.predictions) == 3
    local = ranker.predict(req["jobs"], ["H100-SXM", "T4"]).frame
    assert [p.predicted_throughput for p in out.predictions] == pytest.approx(
        local["predicted_throughput"].tolist(), rel=1e-12)
    assert [p.hardware for p in out.predictions] == local["hardware"].tolist()


def test_only_big_batches_pay_for_handing_memory_back(
        http: httpx.Client, jobs: list[dict[str, Any]],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(app_module, "release_memory", lambda: calls.append(1))
    req = {"jobs": jobs[:2], "candidates": ["H100-SXM", "T4"]}
    assert http.post("/v1/predict", json=req).status_code == 200
    assert calls == [], "a 4-row batch runs no full collection"
    monkeypatch.setattr(app_module, "RELEASE_ROWS", 4)
    assert http.post("/v1/predict", json=req).status_code == 200
    assert calls == [1], "the endpoint hands a batch of RELEASE_ROWS rows back"
    monkeypatch.setattr(app_module, "RELEASE_BYTES", 10)
    assert http.post("/v1/predict", json=req).status_code == 200
    assert calls == [1, 1, 1], "and the edge a body of RELEASE_BYTES"


def test_health_and_model_info(http: httpx.Client, ranker: Ranker) -> None:  # noqa: F811
    health = http.get("/healthz").json()
    assert health == {"status": "ok", "model_version": ranker.model_version, "reason": None,
                      "refused_version": None, "refused_reason": None}
    info = ModelInfo.model_validate(http.get("/v1/model").json())
    assert info.version == ranker.model_version
    assert info.window_start and info.window_end and info.as_of
    assert "train_rows" in info.metrics
    assert "H100-SXM" in info.hardware
    assert info.pair_rows == ("compiled" if native_kernels() is not None else "numpy")
    assert info.transfer_features == ("compiled" if transfer_kernels() is not None
                                      else "numpy")


def _metrics(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = http.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_metrics(http: httpx.Client, ranker: Ranker,  # noqa: F811
                 jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    before = _metrics(http)
    for _ in range(3):
        assert http.post("/v1/rank", json={"job": jobs[0]}).status_code == 200
    http.post("/v1/rank", json={"job": {"family_id": "x"}})
    m = _metrics(http)
    ok = ("leap_http_requests_total", (("method", "POST"), ("path", "/v1/rank"),
                                       ("status", "200")))
    bad = ("leap_http_requests_total", (("method", "POST"), ("path", "/v1/rank"),
                                        ("status", "422")))
    assert m[ok] - before.get(ok, 0) == 3
    assert m[bad] - before.get(bad, 0) == 1
    count = ("leap_http_request_duration_seconds_count", (("path", "/v1/rank"),))
    assert m[count] - before.get(count, 0) == 4
    assert ("leap_http_request_duration_seconds_bucket",
            (("le", "0.025"), ("path", "/v1/rank"))) in m
    assert m[("leap_model_info", (("version", ranker.model_version),))] == 1.0
    assert m[("leap_model_loaded", ())] == 1.0
    assert ("leap_fail_open_total", (("reason", "prediction_failed"),)) in m


@pytest.mark.parametrize(("body", "field"), [
    ({"job": {"model_type": "m", "trainer_count": 1, "batch_size": 1}}, "job.family_id"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 0, "batch_size": 1}},
     "job.trainer_count"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": "many", "batch_size": 1}},
     "job.trainer_count"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1,
              "precision": "bf61"}}, "job.precision"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1,
              "num_params": -5}}, "job.num_params"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1},
      "candidate": ["L4"]}, "candidate"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1},
      "candidates": []}, "candidates"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1},
      "candidates": ["H10O"]}, "candidates: unknown hardware 'H10O'; did you mean"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1},
      "objective": "cheapest"}, "objective"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1},
      "max_cost_per_hour": -1}, "max_cost_per_hour"),
    ({"job": {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 1},
      "free_devices": {"L4": -2}}, "free_devices"),
    ([1, 2], "body"),
    ({}, "job"),
])
def test_bad_rank_requests_are_422_naming_the_field(http: httpx.Client, body: Any,
                                                    field: str) -> None:
    resp = http.post("/v1/rank", json=body)
    assert resp.status_code == 422
    assert field in resp.json()["detail"]


def test_malformed_json_and_bad_predict_requests(http: httpx.Client,
                                                 jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    resp = http.post("/v1/rank", content=b"{not json", headers={"content-type":
                                                                "application/json"})
    assert resp.status_code == 422 and "json" in resp.json()["detail"].lower()
    assert http.post("/v1/predict", json={"jobs": []}).status_code == 422
    resp = http.post("/v1/predict", json={"jobs": [jobs[0]], "candidates": ["T44"]})
    assert resp.status_code == 422 and "did you mean" in resp.json()["detail"]
    app = create_app(Ranker(Path("/nonexistent/models"), background_reload=False),
                     max_predict_rows=5)
    with serving(app) as base:
        resp = httpx.post(f"{base}/v1/predict", json={"jobs": [jobs[0]] * 3,
                                                      "candidates": ["L4", "T4"]}, timeout=TIMEOUT)
    assert resp.status_code == 422 and "more than 5" in resp.json()["detail"]


def test_openapi_and_docs(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    assert {"/v1/rank", "/v1/predict", "/healthz", "/v1/model", "/metrics"} <= set(spec["paths"])
    assert "422" in spec["paths"]["/v1/rank"]["post"]["responses"]
    assert http.get("/docs").status_code == 200


# Fail-open --------------------------------------------------------------------------------
def test_broken_artifact_fails_open_then_recovers(trained_workspace: Workspace, tmp_path: Path,
                                                  jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    reg = copy_models(trained_workspace, tmp_path / "models")
    good = reg.latest_version()
    publish_copy(reg, "29990101-01", corrupt="model")
    rk = Ranker(reg, check_interval_s=0.05)
    with serving(create_app(rk, poll_interval_s=0.05)) as base, \
            httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        resp = c.post("/v1/rank", json={"job": jobs[0]})
        assert resp.status_code == 200
        body = resp.json()
        assert body["ranking"] == [] and body["reason"].startswith("no_model:")
        assert "29990101-01 failed to load" in body["reason"]
        assert c.get("/healthz").json()["status"] == "degraded"
        p = c.post("/v1/predict", json={"jobs": [jobs[0]], "candidates": ["L4"]})
        assert p.status_code == 200 and p.json()["predictions"] == []
        m = _metrics(c)
        assert m[("leap_fail_open_total", (("reason", "no_model"),))] == 2
        assert m[("leap_model_loaded", ())] == 0.0
        assert m[("leap_model_reload_failures_total", ())] == 1.0
        reg.rollback(to=good)  # a good model is published again: picked up without restart
        wait_for(lambda: c.get("/healthz").json()["status"] == "ok")
        assert c.post("/v1/rank", json={"job": jobs[0]}).json()["ranking"]


def test_a_bug_in_prediction_fails_open(http: httpx.Client, ranker: Ranker,  # noqa: F811
                                        jobs: list[dict[str, Any]],  # noqa: F811
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ranker.serving.artifact.model, "predict", boom)  # type: ignore[union-attr]
    resp = http.post("/v1/rank", json={"job": jobs[0]})
    assert resp.status_code == 200
    assert resp.json()["ranking"] == []
    assert resp.json()["reason"] == "prediction_failed: ZeroDivisionError: a bug"


# Hot reload -------------------------------------------------------------------------------
def test_hot_reload_without_dropping_requests(trained_workspace: Workspace, tmp_path: Path,
                                              jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    reg = copy_models(trained_workspace, tmp_path / "models")
    old = reg.latest_version()
    rk = Ranker(reg, check_interval_s=0.05)
    seen: list[list[tuple[int, str | None, str | None]]] = [[], []]
    stop = threading.Event()
    with serving(create_app(rk, poll_interval_s=0.05)) as base:
        def hammer(out: list[tuple[int, str | None, str | None]]) -> None:
            with httpx.Client(base_url=base, timeout=TIMEOUT) as c:
                while not stop.is_set() and len(out) < 2000:
                    r = c.post("/v1/rank", json={"job": jobs[0]})
                    body = r.json()
                    out.append((r.status_code, body.get("model_version"), body.get("reason")))

        threads = [threading.Thread(target=hammer, args=(s,)) for s in seen]
        for t in threads:
            t.start()
        wait_for(lambda: all(len(s) > 5 for s in seen))
        publish_copy(reg, "29990101-01")
        wait_for(lambda: all(s and s[-1][1] == "29990101-01" for s in seen))
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(20)
    for s in seen:
        assert all(code == 200 and reason is None for code, _, reason in s), "none dropped"
        versions = [v for _, v, _ in s]
        switch = versions.index("29990101-01")
        assert switch > 0 and set(versions[:switch]) == {old}
        assert set(versions[switch:]) == {"29990101-01"}, "never back to the old model"


def test_a_slow_metrics_collector_does_not_hold_up_rankings(
        ranker: Ranker, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    """The live figures' collector can take seconds (it reads the store and the decision
    log); a scrape must not stop the event loop meanwhile."""
    class Slow:
        def collect(self) -> Any:
            time.sleep(1.5)
            return iter(())

    with serving(create_app(ranker, extra_collectors=[Slow()])) as base, \
            httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        assert c.post("/v1/rank", json={"job": jobs[0]}).status_code == 200  # warm
        scrape = threading.Thread(target=lambda: httpx.get(f"{base}/metrics", timeout=TIMEOUT))
        scrape.start()
        time.sleep(0.2)  # the scrape is inside the slow collector now
        t0 = time.perf_counter()
        assert c.post("/v1/rank", json={"job": jobs[0]}).status_code == 200
        assert time.perf_counter() - t0 < 1.0
        scrape.join(10)


def test_gc_freezer_settles_once_per_serving_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    freezes: list[int] = []
    freeze = gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (freezes.append(1), freeze())[1])
    freezer, model, other = GcFreezer(), object(), object()
    try:
        freezer.settle(model)
        assert len(freezes) == 1 and gc.get_freeze_count() > 0
        freezer.settle(model)  # the same model: nothing to do
        assert len(freezes) == 1
        garbage = [[i] for i in range(1000)]  # lists: always tracked
        freezer.settle(other)  # a swap: what exists now, the new objects with it
        assert len(freezes) == 2 and gc.get_freeze_count() >= len(garbage)
        assert not any(o is garbage for o in gc.get_objects())  # frozen: no pass sees it
    finally:
        freezer.release()
    assert gc.get_freeze_count() == 0


def test_server_freezes_after_start_and_after_a_model_swap(
        trained_workspace: Workspace, tmp_path: Path,
        jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    import gc

    reg = copy_models(trained_workspace, tmp_path / "models")
    rk = Ranker(reg, check_interval_s=0.05)
    app = create_app(rk, poll_interval_s=0.05, freeze_gc=True)
    with serving(app) as base, httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        assert gc.get_freeze_count() > 0
        first = app.state.gc_freezer._frozen_for
        assert first is rk.watcher.current()
        publish_copy(reg, "29990101-01")
        wait_for(lambda: c.post("/v1/rank", json={"job": jobs[0]}).json()["model_version"]
                 == "29990101-01")
        wait_for(lambda: app.state.gc_freezer._frozen_for is rk.watcher.current())
        assert app.state.gc_freezer._frozen_for is not first
    assert gc.get_freeze_count() == 0  # handed back at shutdown


# Token ------------------------------------------------------------------------------------
def test_bearer_token(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    with serving(create_app(ranker, token="s3cret")) as base, \
            httpx.Client(base_url=base, timeout=TIMEOUT) as c:
        body = {"job": jobs[0]}
        no = c.post("/v1/rank", json=body)
        assert no.status_code == 401 and no.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in no.json()["detail"]
        assert c.post("/v1/rank", json=body, headers={"Authorization": "Bearer nope"}
                      ).status_code == 401
        assert c.get("/metrics").status_code == 401
        assert c.get("/healthz").status_code == 200, "probes need no token"
        ok = c.post("/v1/rank", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["ranking"]


@pytest.mark.parametrize("workers", [1, 2])
def test_leap_serve_command(fresh_copy: Workspace, jobs: list[dict[str, Any]],  # noqa: F811
                            workers: int) -> None:
    """The real command: a token, the model, rankings, and each worker's decision log written
    (from a child process) by the time the server has stopped."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LEAP_TOKEN": "tok"}
    proc = subprocess.Popen([sys.executable, "-m", "leap", "--home", str(fresh_copy.home),
                             # The shared fixture's model is not compiled (its cache would
                             # change how every later test scores).
                             "serve", "--port", str(port), "--workers", str(workers),
                             "--no-compiled"], env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base)
        assert httpx.get(f"{base}/v1/model").status_code == 401
        auth = {"Authorization": "Bearer tok"}
        info = httpx.get(f"{base}/v1/model", headers=auth).json()
        assert info["version"] == Registry(fresh_copy.models_dir).latest_version()
        for job in jobs[:4]:  # with 2 workers, the kernel spreads connections over both
            r = httpx.post(f"{base}/v1/rank", json={"job": job}, headers=auth).json()
            assert r["reason"] is None and r["ranking"]
        # Written while serving (the writer child runs at the lowest priority: on a loaded
        # host it may take a while), not only by the flush at shutdown.
        deadline = time.monotonic() + 120
        while len(read_decisions(decisions_path(fresh_copy.home))[0]) < 4 \
                and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(SERVER_STOP_S)
    dec, ent = read_decisions(decisions_path(fresh_copy.home))
    assert len(dec) == 4 and set(dec["source"]) == {"http"} and len(ent) >= 4


# Fuzz from the OpenAPI schema ---------------------------------------------------------------
#: Examples per (operation, mode): 2 POST x 2 modes x 30 + 3 GET x 10 = 150 cases; the longer
#: run is bench/fuzz_service.py.
FUZZ_EXAMPLES = {"POST": 30, "GET": 10}


def fuzz_service(url: str, examples: dict[str, int]) -> dict[str, Any]:
    """Drive every operation of the service's OpenAPI schema with schemathesis (positive and
    negative cases for POST) and check each response: no 5xx, a status the schema lists, the
    documented content type, headers and body schema. Returns counts; raises on a failure."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    calls: dict[str, int] = {}
    statuses: dict[int, int] = {}

    def fuzz(key: str, strategy: Any, n: int) -> None:
        @settings(max_examples=n, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def check(case: Any) -> None:
            resp = case.call(base_url=url, timeout=30)
            calls[key] = calls.get(key, 0) + 1
            statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
            assert resp.status_code < 500, (resp.status_code, resp.text[:300])
            case.validate_response(resp, checks=checks)
            if key.endswith("/v1/rank") and resp.status_code == 200:
                RankResponse.model_validate_json(resp.content)

        check()

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    for result in schema.get_all_operations():
        op = result.ok()
        method = op.method.upper()
        # Negative cases need a body to break; the GET endpoints take no input at all.
        modes = ("positive", "negative") if method == "POST" else ("positive",)
        for mode in modes:
            fuzz(f"{method} {op.path}", op.as_strategy(
                generation_mode=schemathesis.GenerationMode(mode)), examples[method])
    return {"cases": sum(calls.values()), "per_operation": calls,
            "statuses": dict(sorted(statuses.items()))}


def test_fuzz_from_openapi_schema_gives_no_5xx_and_no_schema_violation(url: str) -> None:
    t0 = time.monotonic()
    out = fuzz_service(url, FUZZ_EXAMPLES)
    assert out["per_operation"].get("POST /v1/rank", 0) >= 40
    assert out["per_operation"].get("POST /v1/predict", 0) >= 40
    assert out["cases"] >= 100, out
    assert time.monotonic() - t0 < 120, "the bounded fuzz stays fast"


def test_concurrent_rank_requests_are_ranked_together_with_the_answers_of_each_alone(
        ranker: Ranker, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    """Requests that arrive together are ranked in one pass (leap.serve.batching), each with
    its own options and room, and a bad one gets its 422 alone: the bodies equal those of a
    server that ranks each request by itself (but for latency_ms)."""
    import asyncio
    import json as json_

    plain = ranker.rank(jobs[0]).ranking
    bodies: list[dict[str, Any]] = [{"job": j} for j in jobs[:6]]
    bodies += [{"job": jobs[1], "candidates": ["L4", "H100-SXM", "T4"], "risk": "averse"},
               {"job": jobs[2], "objective": "throughput", "max_cost_per_hour": 60.0},
               {"job": jobs[0], "free_devices": {plain[0].hardware: 0}},
               {"job": {**jobs[3], "trainer_count": -1}},  # refused: 422, alone
               {"job": jobs[4], "candidates": ["T44"]}]   # refused: unknown type
    batched, alone = create_app(ranker), create_app(ranker, max_rank_batch=1)

    async def send(app: FastAPI, concurrent: bool) -> tuple[list[httpx.Response], str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            if concurrent:
                out = await asyncio.gather(*(client.post("/v1/rank", json=b) for b in bodies))
            else:
                out = [await client.post("/v1/rank", json=b) for b in bodies]
            return list(out), (await client.get("/metrics")).text

    got, metrics = asyncio.run(send(batched, True))
    want, _ = asyncio.run(send(alone, False))

    def without_latency(r: httpx.Response) -> tuple[int, Any]:
        body = json_.loads(r.content)
        body.pop("latency_ms", None)
        return r.status_code, body

    assert [without_latency(r) for r in got] == [without_latency(r) for r in want]
    assert [r.status_code for r in got].count(422) == 2
    assert got[8].json()["ranking"][-1]["hardware"] == plain[0].hardware  # no room: last
    sizes = {s.name: s for s in text_string_to_metric_families(metrics)}["leap_rank_batch_size"]
    count = next(x.value for x in sizes.samples if x.name.endswith("_count"))
    total = next(x.value for x in sizes.samples if x.name.endswith("_sum"))
    assert total == 9 and count < 9, "the 9 good requests were ranked in fewer passes"
