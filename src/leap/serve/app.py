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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from leap import __version__
from leap.errors import CatalogError, LeapError
from leap.rank.ranker import Ranker
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
         "/openapi.json", "/docs/oauth2-redirect", "/redoc")
OPEN_PATHS = frozenset({"/healthz"})
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0)
_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorResponse, "description": "A field is missing, malformed, or names "
          "unknown hardware; `detail` says which and how to fix it."},
    401: {"model": ErrorResponse, "description": "Missing or wrong bearer token."},
}


class _RankerCollector(Collector):
    """Model and fail-open figures read from the Ranker at scrape time."""

    def __init__(self, ranker: Ranker) -> None:
        self.ranker = ranker

    def collect(self) -> Iterable[Metric]:
        fail = CounterMetricFamily("leap_fail_open", "Answers that failed open (empty ranking "
                                   "or predictions with a reason), by reason code",
                                   labels=["reason"])
        for code, n in sorted(self.ranker.fail_open_counts.items()):
            fail.add_metric([code], n)
        yield fail
        version = self.ranker.model_version
        info = GaugeMetricFamily("leap_model_info", "The serving model version (value 1)",
                                 labels=["version"])
        if version is not None:
            info.add_metric([version], 1.0)
        yield info
        yield GaugeMetricFamily("leap_model_loaded", "1 when a model is loaded, else 0",
                                value=float(version is not None))
        w = self.ranker.watcher
        yield CounterMetricFamily("leap_model_reloads", "Models loaded (the first included)",
                                  value=w.reloads)
        yield CounterMetricFamily("leap_model_reload_failures", "Published versions that "
                                  "failed to load (the previous model kept serving)",
                                  value=w.reload_failures)


class _Edge:
    """Pure ASGI middleware: bearer-token check, request counts and latency per path."""

    def __init__(self, app: ASGIApp, *, token: str | None, requests: Counter,
                 latency: Histogram) -> None:
        self.app = app
        self.token = f"Bearer {token}".encode() if token else None
        self.requests = requests
        self.latency = latency

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

        try:
            if self.token is not None and scope["path"] not in OPEN_PATHS and \
                    not self._authorized(scope):
                body = json.dumps({"detail": "missing or wrong bearer token: send the header "
                                   "'Authorization: Bearer <token>' (leap serve --token / "
                                   "LEAP_TOKEN)", "errors": []}).encode()
                await send_status({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await self.app(scope, receive, send_status)
        finally:
            self.requests.labels(path, scope.get("method", ""), str(status[0])).inc()
            self.latency.labels(path).observe(time.perf_counter() - t0)

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        for key, value in scope.get("headers", ()):
            if key == b"authorization":
                return hmac.compare_digest(value, self.token)
        return False


def _field_errors(exc: RequestValidationError) -> list[dict[str, str]]:
    out = []
    for e in exc.errors():
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        out.append({"field": ".".join(loc) or "body", "message": str(e.get("msg", "invalid")),
                    "type": str(e.get("type", "value_error"))})
    return out


def create_app(ranker: Ranker, *, token: str | None = None, max_predict_rows: int = 200_000,
               poll_interval_s: float = 1.0) -> FastAPI:
    """The FastAPI app serving ``ranker`` (build the Ranker at the edge and pass it in).

    Parameters
    ----------
    ranker : Ranker
        Holds the model and its hot reload.
    token : str, optional
        Require ``Authorization: Bearer <token>`` on every endpoint but ``/healthz``.
    max_predict_rows : int
        Largest (job, hardware) row count one ``/v1/predict`` call may ask for.
    poll_interval_s : float
        How often a background task lets the watcher look for a new model.

    Examples
    --------
    >>> # app = create_app(Ranker(Registry(ws.models_dir)), token=None)
    >>> # uvicorn.run(app, host="127.0.0.1", port=8787)
    """
    metrics = CollectorRegistry()
    requests = Counter("leap_http_requests", "HTTP requests by path, method and status",
                       ["path", "method", "status"], registry=metrics)
    latency = Histogram("leap_http_request_duration_seconds", "HTTP request latency by path",
                        ["path"], buckets=LATENCY_BUCKETS_S, registry=metrics)
    metrics.register(_RankerCollector(ranker))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def poll() -> None:
            while True:
                await asyncio.sleep(poll_interval_s)
                ranker.watcher.current()  # cheap stat; a new model loads in a thread

        task = asyncio.create_task(poll())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(title="leap", version=__version__, lifespan=lifespan,
                  description="Predicted training throughput per accelerator type, and the "
                  "types ranked by value (samples per unit cost). Answers fail open: an "
                  "empty ranking with a reason means no advice, never an error.")
    app.state.ranker = ranker
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = _field_errors(exc)
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return JSONResponse({"detail": detail or "invalid request", "errors": errors},
                            status_code=422)

    @app.exception_handler(LeapError)
    async def _leap_error(_: Request, exc: LeapError) -> JSONResponse:
        # Raised only for bad requests (strict mode): model failures fail open instead.
        field = "candidates" if isinstance(exc, CatalogError) else "job"
        return JSONResponse({"detail": str(exc), "errors": [
            {"field": field, "message": str(exc), "type": type(exc).__name__}]},
            status_code=422)

    @app.post("/v1/rank", response_model=RankResponse, responses=_ERRORS, tags=["rank"],
              summary="Rank the candidate types of one job by value")
    async def rank(req: RankRequest) -> Any:
        job = req.job.launch_fields()
        try:
            result = ranker.rank(job, req.candidates, objective=req.objective,
                                 max_cost_per_hour=req.max_cost_per_hour, strict=True,
                                 free_devices=req.free_devices)
        except LeapError:
            raise
        except Exception as exc:  # fail-open: Ranker.rank never raises, but a bug around it
            # must not turn into a 500 that blocks a launch; counted and reported as a reason.
            return RankResponse.failed(ranker.record_fail_open(
                "prediction_failed", f"{type(exc).__name__}: {exc}"), req.objective)
        return result.to_dict()

    @app.post("/v1/predict", response_model=PredictResponse, responses=_ERRORS,
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
                    "hardware", "predicted_throughput"]
            body = result.frame[cols].to_json(orient="records", double_precision=15)
        else:
            body = "[]"
        return Response(head[:-1] + ', "predictions": ' + body + "}",
                        media_type="application/json")

    @app.get("/healthz", response_model=Health, tags=["ops"],
             summary="Liveness; 'degraded' when no model is loaded (answers fail open)")
    async def healthz() -> Any:
        version = ranker.model_version
        if version is None:
            return {"status": "degraded", "model_version": None,
                    "reason": f"no_model: {ranker.watcher.error or 'no model loaded'}"}
        return {"status": "ok", "model_version": version, "reason": None}

    @app.get("/v1/model", response_model=ModelInfo, tags=["ops"],
             summary="The serving model: version, training window, metrics")
    async def model_info() -> Any:
        return ranker.model_info()

    @app.get("/metrics", tags=["ops"], summary="Prometheus metrics",
             response_class=Response)
    async def prometheus() -> Response:
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_Edge, token=token, requests=requests, latency=latency)
    return app
