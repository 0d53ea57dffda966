"""The HTTP service: a FastAPI app around one :class:`~leap.rank.ranker.Ranker`.

Endpoints: ``POST /v1/rank``, ``POST /v1/predict`` (batch), ``GET /healthz``,
``GET /v1/model``, ``GET /metrics`` (Prometheus) and the OpenAPI page at ``/docs``.

* Bad requests are 422 with ``{"detail": "<field>: <problem>", "errors": [...]}``; an unknown
  candidate name is a 422 with a did-you-mean (the caller's mistake). A broken model is never a
  4xx/5xx: rank answers 200 with an empty ranking and a ``reason`` (fail-open).
* Hot reload: the Ranker's watcher looks at the registry's ``LATEST`` at most every
  ``check_interval_s`` (on requests and from a background poll), loads a new version in a
  thread and swaps it in; requests in flight finish on the old model.
* With a ``token`` every endpoint but ``/healthz`` needs ``Authorization: Bearer <token>``.
* Bounded work: a body over ``max_body_bytes`` is a 413 (before it is parsed), a batch that
  expands to more than ``max_predict_rows`` rows a 422, and ``/v1/predict`` calls beyond
  ``max_concurrent_predicts`` at once a 429 with ``Retry-After``. A body that is not JSON text
  at all is a 400 (FastAPI's), invalid JSON a 422. After each batch the process hands freed
  memory back to the OS, so its size returns to its level after a burst.
* A new model version that fails verification is refused: the old one keeps serving, and
  ``/healthz`` (``refused_version``, ``refused_reason``) and ``/metrics`` say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from leap import __version__
from leap.catalog import Catalog
from leap.errors import CatalogError, LeapError
from leap.rank.decisions import DecisionLog
from leap.rank.ranker import Ranker
from leap.serve.batching import MAX_BATCH, RankBatcher
from leap.serve.metrics import DecisionCollector, RankerCollector
from leap.serve.monitor import MonitorCollector
from leap.serve.payloads import (
    ErrorResponse,
    Health,
    ModelInfo,
    PredictRequest,
    PredictResponse,
    RankRequest,
    RankResponse,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATHS = ("/v1/rank", "/v1/predict", "/healthz", "/v1/model", "/metrics", "/docs",
         "/openapi.json", "/docs/oauth2-redirect", "/redoc", "/", "/dashboard/nightly.png",
         "/dashboard/live.png")
OPEN_PATHS = frozenset({"/healthz"})
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0)
DEFAULT_MAX_PREDICT_ROWS = 20_000
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # 10,000 jobs (the schema's most) with every field
DEFAULT_MAX_CONCURRENT_PREDICTS = 2
_AUTH: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or wrong bearer token."},
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    **_AUTH,
    400: {"model": ErrorResponse, "description": "The body cannot be read as text (e.g. not "
          "UTF-8)."},
    413: {"model": ErrorResponse, "description": "The body is larger than the server's limit "
          "(max_body_bytes)."},
    422: {"model": ErrorResponse, "description": "A field is missing, malformed, or names "
          "unknown hardware; `detail` says which and how to fix it."},
}
_PREDICT_ERRORS: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    429: {"model": ErrorResponse, "description": "Too many batch predictions at once (the "
          "server's max_concurrent_predicts); retry after the `Retry-After` seconds.",
          "headers": {"Retry-After": {"description": "Seconds to wait before retrying.",
                                      "schema": {"type": "integer"}}}},
}


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


#: Batches of at least this many (job, hardware) rows, or bodies of at least this many bytes,
#: hand their memory back when answered (:func:`release_memory`). A full collection costs
#: tens to hundreds of milliseconds in a busy process, and a small batch leaves nothing worth
#: it: run after every call, it made a one-job predict take 0.3-0.6 s under test.
RELEASE_ROWS = 2_000
RELEASE_BYTES = 1 << 20


def release_memory() -> None:
    """Hand freed memory back to the OS after a big batch: Python's garbage (cycles from the
    request models), Arrow's pool (it keeps freed blocks for reuse) and glibc's heap pages
    (kept by default)."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


class GcFreezer:
    """Keeps a server's long-lived objects out of the garbage collector's full collections.

    A full collection walks every tracked object: with a model loaded, about 180,000 of them
    and 75-145 ms of a `leap serve` worker, in which no request is answered. Ranking
    allocates fast enough to promote a little garbage at a time, so one came every few
    seconds under load: the open loop's p99 of ``bench/bench_http.py`` was 75-135 ms
    (``gc.callbacks`` timings in each worker). :func:`gc.freeze` moves the objects that
    exist into a generation no collection walks; :meth:`settle` does it once the serving
    model is in place, and again when it is swapped (after a full collection, so that the
    old model's reference cycles are freed, not frozen).
    """

    def __init__(self) -> None:
        self._frozen_for: object = None

    def settle(self, serving: object) -> None:
        """Freeze what exists now, unless already done for this ``serving`` model."""
        import gc

        if serving is self._frozen_for:
            return
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._frozen_for = serving

    def release(self) -> None:
        """Hand the frozen objects back to the collector (at shutdown)."""
        import gc

        gc.unfreeze()
        self._frozen_for = None


class _Edge:
    """Pure ASGI middleware: bearer-token check, body size limit, the concurrency limit of
    ``/v1/predict``, request counts and latency per path, and ``POST /v1/rank`` answered
    directly by ``rank`` (the app's :func:`create_app.<locals>.rank_direct`) where it takes
    the body: through FastAPI's routing, dependency solving and validation the app's own
    layers took about twice the CPU (0.35 against 0.17 ms a request, bench/bench_app.py)."""

    def __init__(self, app: ASGIApp, *, token: str | None, requests: Counter,
                 latency: Histogram, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_concurrent_predicts: int = DEFAULT_MAX_CONCURRENT_PREDICTS,
                 retry_after_s: int = 1,
                 rank: Callable[[bytes], Awaitable[tuple[int, bytes] | None]] | None = None
                 ) -> None:
        self.app = app
        self.rank = rank
        self.token = f"Bearer {token}".encode() if token else None
        self.requests = requests
        self.latency = latency
        self.max_body_bytes = max_body_bytes
        self.max_concurrent_predicts = max_concurrent_predicts
        self.retry_after_s = retry_after_s
        self.predicts_in_flight = 0  # touched on the event loop only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"] if scope["path"] in PATHS else "other"
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        predict = scope["path"] == "/v1/predict"
        counted = big = False
        try:
            if self.token is not None and scope["path"] not in OPEN_PATHS and \
                    not self._authorized(scope):
                await _error(send_status, 401, "missing or wrong bearer token: send the header "
                             "'Authorization: Bearer <token>' with the server's token",
                             [(b"www-authenticate", b"Bearer")])
                return
            if predict and self.predicts_in_flight >= self.max_concurrent_predicts:
                await _error(send_status, 429, f"{self.predicts_in_flight} batch predictions "
                             "are running, the most this server takes at once; retry after "
                             f"{self.retry_after_s} s or send smaller batches",
                             [(b"retry-after", str(self.retry_after_s).encode())])
                return
            if predict:
                self.predicts_in_flight += 1
                counted = True
            read = await self._read_body(scope, receive)
            if read is None:
                await _error(send_status, 413, f"the request body is larger than "
                             f"{self.max_body_bytes:,} bytes; send smaller batches")
                return
            body, size = read
            big = predict and size >= RELEASE_BYTES
            if self.rank is not None and scope["path"] == "/v1/rank" and \
                    scope.get("method") == "POST" and _json_body(scope):
                answer = await self.rank(b"".join(m.get("body", b"") for m in body))
                if answer is not None:
                    await _respond(send_status, *answer)
                    return
            await self.app(scope, _replay(body, receive), send_status)
        finally:
            if counted:
                self.predicts_in_flight -= 1
            if big:
                release_memory()
            self.requests.labels(path, scope.get("method", ""), str(status[0])).inc()
            self.latency.labels(path).observe(time.perf_counter() - t0)

    async def _read_body(self, scope: Scope, receive: Receive
                         ) -> tuple[list[Message], int] | None:
        """The request's body messages and their bytes, or None as soon as it is over the
        limit."""
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    if int(value) > self.max_body_bytes:
                        return None
                except ValueError:
                    return None
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, size
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                return None
            if not message.get("more_body", False):
                return messages, size

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                return hmac.compare_digest(value, self.token)
        return False


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()  # after the body: e.g. the client disconnecting

    return replay


def _json_body(scope: Scope) -> bool:
    """Whether the request says its body is ``application/json`` (FastAPI reads a body as
    JSON for that type, and for none or another ``+json`` type: those stay with FastAPI)."""
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


async def _respond(send: Send, status: int, body: bytes,
                   headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _bad_request(exc: LeapError) -> dict[str, Any]:
    """The 422 body for a LeapError a request raised (raised only for bad requests, in
    strict mode: model failures fail open instead)."""
    field = "candidates" if isinstance(exc, CatalogError) else "job"
    return {"detail": str(exc), "errors": [
        {"field": field, "message": str(exc), "type": type(exc).__name__}]}


async def _error(send: Send, status: int, detail: str,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await _respond(send, status, json.dumps({"detail": detail, "errors": []}).encode(), headers)


def _field_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    out = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        out.append({"field": ".".join(loc) or "body", "message": str(e.get("msg", "invalid")),
                    "type": str(e.get("type", "value_error"))})
    return out


def create_app(ranker: Ranker, *, token: str | None = None,
               max_predict_rows: int = DEFAULT_MAX_PREDICT_ROWS, poll_interval_s: float = 1.0,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_concurrent_predicts: int = DEFAULT_MAX_CONCURRENT_PREDICTS,
               decisions: DecisionLog | None = None,
               extra_collectors: Iterable[Collector] = (),
               monitor: MonitorCollector | None = None, dashboard: bool = True,
               catalog: Catalog | None = None, max_rank_batch: int = MAX_BATCH,
               freeze_gc: bool = False) -> FastAPI:
    """The FastAPI app serving ``ranker`` (build the Ranker at the edge and pass it in).

    Parameters
    ----------
    ranker : Ranker
        Holds the model and its hot reload.
    token : str, optional
        Require ``Authorization: Bearer <token>`` on every endpoint but ``/healthz``.
    max_predict_rows : int
        Largest (job, hardware) row count one ``/v1/predict`` call may ask for (422 beyond);
        the default answers within about a second on one core.
    poll_interval_s : float
        How often a background task lets the watcher look for a new model.
    max_body_bytes : int
        Largest request body (413 beyond, before any parsing).
    max_concurrent_predicts : int
        ``/v1/predict`` calls served at once; more get a 429 with ``Retry-After``.
    decisions : DecisionLog, optional
        Record every ranking served (it becomes ``ranker``'s decision sink, source ``http``;
        detached and flushed at shutdown). Its counters appear in ``/metrics``.
    extra_collectors : iterable of Collector
        More Prometheus collectors (e.g. the monitor's gauges).
    monitor : MonitorCollector, optional
        Where the web page reads the live figures (``leap monitor``'s, cached).
    dashboard : bool
        Serve the web page at ``/`` (:mod:`leap.serve.dashboard`).
    catalog : Catalog, optional
        Scheduler names for ``format`` (:mod:`leap.rank.formats`); default the Ranker's cost
        catalog, else the shipped one.
    max_rank_batch : int
        Most ``/v1/rank`` requests that arrived together are ranked in one pass
        (:mod:`leap.serve.batching`); 1 ranks each alone.
    freeze_gc : bool
        Exempt what exists at startup (the model, the libraries) from the garbage
        collector's full collections, and again after each model swap (:class:`GcFreezer`);
        for a process that serves this app alone (`leap serve`).

    Examples
    --------
    Not run here (it needs a workspace)::

        app = create_app(Ranker(Registry(ws.models_dir)), token=None)
        uvicorn.run(app, host="127.0.0.1", port=8787)
    """
    names = catalog if catalog is not None else (
        ranker.costs if ranker.costs is not None else Catalog.default())
    metrics = CollectorRegistry()
    requests = Counter("leap_http_requests", "HTTP requests by path, method and status",
                       ["path", "method", "status"], registry=metrics)
    latency = Histogram("leap_http_request_duration_seconds", "HTTP request latency by path",
                        ["path"], buckets=LATENCY_BUCKETS_S, registry=metrics)
    metrics.register(RankerCollector(ranker))
    batch_sizes = Histogram("leap_rank_batch_size", "Rankings served together in one pass",
                            buckets=(1, 2, 4, 8, 16, 32), registry=metrics)
    batcher = RankBatcher(ranker, max_batch=max_rank_batch, on_batch=batch_sizes.observe) \
        if max_rank_batch > 1 else None
    if decisions is not None:
        metrics.register(DecisionCollector(decisions))
        ranker.decision_sink = decisions.sink("http")
    for collector in extra_collectors:
        metrics.register(collector)

    freezer = GcFreezer() if freeze_gc else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def poll() -> None:
            while True:
                await asyncio.sleep(poll_interval_s)
                serving = ranker.watcher.current()  # cheap stat; a new model loads in a thread
                if freezer is not None:
                    freezer.settle(serving)

        if freezer is not None:
            freezer.settle(ranker.watcher.current())
        task = asyncio.create_task(poll())
        try:
            yield
        finally:
            if freezer is not None:
                freezer.release()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if decisions is not None:
                ranker.decision_sink = None
                decisions.close()

    app = FastAPI(title="leap", version=__version__, lifespan=lifespan,
                  description="Predicted training throughput per accelerator type, and the "
                  "types ranked by value (samples per unit cost). Answers fail open: an "
                  "empty ranking with a reason means no advice, never an error.")
    app.state.ranker = ranker
    app.state.metrics = metrics
    app.state.decisions = decisions
    app.state.gc_freezer = freezer

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _field_errors(exc)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return JSONResponse({"detail": detail or "invalid request", "errors": errors},
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # e.g. FastAPI's 400 for a body it cannot decode: the same ErrorResponse shape.
        return JSONResponse({"detail": str(exc.detail), "errors": []},
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(LeapError)
    async def _leap_error(_: Request, exc: LeapError) -> JSONResponse:
        return JSONResponse(_bad_request(exc), status_code=422)

    async def answer_rank(req: RankRequest) -> bytes:
        """The body of the answer to a valid ``POST /v1/rank`` (a LeapError for a bad one,
        e.g. an unknown candidate)."""
        job = req.job.launch_fields()
        options: dict[str, Any] = {"objective": req.objective, "risk": req.risk,
                                   "max_cost_per_hour": req.max_cost_per_hour,
                                   "free_devices": req.free_devices}
        try:
            if batcher is None:
                result = ranker.rank(job, req.candidates, strict=True, **options)
            else:
                ranker.check_request(job, req.candidates, **options)  # a bad one: 422 alone
                result = await batcher.rank(job, req.candidates, **options)
        except LeapError:
            raise
        except Exception as exc:  # fail-open: Ranker.rank never raises, but a bug around it
            # must not turn into a 500 that blocks a launch; counted and reported as a reason.
            return orjson.dumps(RankResponse.failed(ranker.record_fail_open(
                "prediction_failed", f"{type(exc).__name__}: {exc}"),
                req.objective).model_dump(mode="json"))
        out = result.to_dict()
        out["format"] = req.format
        out["formatted"] = None
        if req.format != "json":
            from leap.rank.formats import render

            out["formatted"] = render(req.format, out, job, names)
        # The body is RankResponse's fields (a test holds them equal), written by orjson
        # directly: validating and encoding the answer through pydantic again cost more
        # than ranking it.
        return orjson.dumps(out)

    @app.post("/v1/rank", response_model=RankResponse, responses=_ERRORS, tags=["rank"],
              summary="Rank the candidate types of one job by value")
    async def rank(req: RankRequest) -> Any:
        return Response(await answer_rank(req), media_type="application/json")

    async def rank_direct(body: bytes) -> tuple[int, bytes] | None:
        """``POST /v1/rank`` without FastAPI's routing, dependency and validation layers
        (:class:`_Edge` calls it): the same validation of the same parsed body, the same
        answer. ``None`` for a body that does not parse or validate, which FastAPI then
        answers with its 400 / 422."""
        try:
            req = RankRequest.model_validate(orjson.loads(body))
        except (orjson.JSONDecodeError, ValidationError):
            return None
        try:
            return 200, await answer_rank(req)
        except LeapError as exc:
            return 422, orjson.dumps(_bad_request(exc))

    @app.post("/v1/predict", response_model=PredictResponse, responses=_PREDICT_ERRORS,
              tags=["predict"], summary="Predict samples/s for (job, hardware) rows")
    def predict(req: PredictRequest) -> Any:
        # A plain `def`: FastAPI runs it in a worker thread, so a large batch does not stall
        # rank requests on the event loop.
        serving = ranker.serving
        n_types = len(req.candidates) if req.candidates else (
            len(serving.artifact.catalog) if serving else 1)
        rows = sum(1 if j.hardware else n_types for j in req.jobs)
        if rows > max_predict_rows:
            return JSONResponse({"detail": f"jobs: the request expands to {rows:,} (job, "
                                 f"hardware) rows, more than {max_predict_rows:,}; send "
                                 "smaller batches", "errors": []}, status_code=422)
        result = ranker.predict([j.launch_fields() for j in req.jobs], req.candidates,
                                strict=True)
        head = json.dumps({"model_version": result.model_version, "reason": result.reason,
                           "latency_ms": result.latency_ms})
        if len(result.frame):
            cols = ["job", "family_id", "model_type", "trainer_count", "batch_size",
                    "hardware", "predicted_throughput", "throughput_p10", "throughput_p90",
                    "novelty"]
            body = result.frame[cols].to_json(orient="records", double_precision=15)
        else:
            body = "[]"
        del result
        if rows >= RELEASE_ROWS:
            # Trim from this worker thread too: its own malloc arena holds the batch's pages.
            release_memory()
        return Response(head[:-1] + ', "predictions": ' + body + "}",
                        media_type="application/json")

    @app.get("/healthz", response_model=Health, tags=["ops"],
             summary="Liveness; 'degraded' when no model is loaded (answers fail open)")
    async def healthz() -> Any:
        version = ranker.model_version
        w = ranker.watcher
        refused = {"refused_version": w.refused_version, "refused_reason": w.refused_reason}
        if version is None:
            return {"status": "degraded", "model_version": None,
                    "reason": f"no_model: {w.error or 'no model loaded'}", **refused}
        return {"status": "ok", "model_version": version, "reason": None, **refused}

    @app.get("/v1/model", response_model=ModelInfo, responses=_AUTH, tags=["ops"],
             summary="The serving model: version, training window, metrics")
    async def model_info() -> Any:
        return ranker.model_info()

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics", responses={
        **_AUTH, 200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {
            "schema": {"type": "string"}}}, "description": "Prometheus text format"}},
             response_class=Response)
    def prometheus() -> Response:
        # A plain `def` (FastAPI runs it in a worker thread): a collector may be slow (the
        # live figures read the store and the decision log, seconds on a long log), and the
        # event loop must go on ranking meanwhile.
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    if dashboard:
        from leap.serve.dashboard import Dashboard

        page = Dashboard(ranker, monitor=monitor, decisions=decisions)

        # Plain `def`s: FastAPI runs them in worker threads (the live figures may read the
        # store, the plots take matplotlib a moment), never on the event loop.
        @app.get("/", response_class=HTMLResponse, include_in_schema=False)
        def dashboard_page(request: Request) -> HTMLResponse:
            body, status = page.page(dict(request.query_params))
            return HTMLResponse(body, status_code=status)

        @app.get("/dashboard/nightly.png", include_in_schema=False)
        def nightly_png() -> Response:
            return Response(page.nightly_png(), media_type="image/png")

        @app.get("/dashboard/live.png", include_in_schema=False)
        def live_png() -> Response:
            return Response(page.live_png(), media_type="image/png")

    app.add_middleware(_Edge, token=token, requests=requests, latency=latency,
                       max_body_bytes=max_body_bytes,
                       max_concurrent_predicts=max_concurrent_predicts, rank=rank_direct)
    return app
