"""Python clients of ``leap serve`` with a hard deadline that fail open (never raise).

A scheduler calls :meth:`LeapClient.rank` at launch time. Whatever happens (timeout,
connection refused, 401/422/5xx, a malformed body) it gets a :class:`RankResponse` back
within ``deadline_s``: either the ranking, or an empty one whose ``reason`` starts with
``client_timeout``, ``client_connection_error``, ``client_http_<status>`` or
``client_invalid_response``. The launch goes on without advice in that case.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx
from pydantic import ValidationError

from leap.errors import ConfigError
from leap.serve.payloads import Health, ModelInfo, PredictResponse, RankResponse

log = logging.getLogger("leap.client")

DEFAULT_DEADLINE_S = 0.25


def _check(base_url: str, deadline_s: float) -> None:
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"base_url must start with http:// or https://, got {base_url!r}")
    if not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ConfigError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")


def _rank_body(job: Mapping[str, Any], candidates: Sequence[str] | None, objective: str,
               max_cost_per_hour: float | None) -> dict[str, Any]:
    body: dict[str, Any] = {"job": dict(job), "objective": objective}
    if candidates is not None:
        body["candidates"] = list(candidates)
    if max_cost_per_hour is not None:
        body["max_cost_per_hour"] = max_cost_per_hour
    return body


def _http_reason(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", "")
    except (ValueError, AttributeError):
        detail = resp.text[:200]
    return f"client_http_{resp.status_code}: {detail}"


class _Counts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fail_open: dict[str, int] = {}

    def fail(self, reason: str) -> str:
        code = reason.split(":", 1)[0]
        with self._lock:
            self.fail_open[code] = self.fail_open.get(code, 0) + 1
        log.warning("leap client failed open: %s", reason)
        return reason


class LeapClient:
    """A thread-safe, fail-open client with a hard per-call deadline.

    Parameters
    ----------
    base_url : str
        e.g. ``"http://127.0.0.1:8787"``.
    token : str, optional
        Bearer token of a server started with ``--token``.
    deadline_s : float
        The longest a call may take, connection included. On expiry the call returns an
        empty answer; the request is abandoned in the background.
    max_in_flight : int
        Worker threads (abandoned slow calls occupy one until httpx gives up on them).

    Examples
    --------
    >>> with LeapClient("http://127.0.0.1:1", deadline_s=0.2) as client:
    ...     r = client.rank({"family_id": "f", "model_type": "m", "trainer_count": 1,
    ...                      "batch_size": 8})
    >>> r.ranking, r.reason.split(":")[0]
    ([], 'client_connection_error')
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8787", *, token: str | None = None,
                 deadline_s: float = DEFAULT_DEADLINE_S, max_in_flight: int = 8) -> None:
        _check(base_url, deadline_s)
        self.base_url = base_url.rstrip("/")
        self.deadline_s = float(deadline_s)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # httpx's own timeouts end an abandoned request soon after the deadline.
        self._http = httpx.Client(base_url=self.base_url, headers=headers,
                                  timeout=httpx.Timeout(self.deadline_s))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_in_flight,
                                                           thread_name_prefix="leap-client")
        self._counts = _Counts()

    @property
    def fail_open_counts(self) -> dict[str, int]:
        """Calls that failed open, by reason code."""
        return dict(self._counts.fail_open)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    def __enter__(self) -> LeapClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None,
              deadline_s: float | None) -> httpx.Response | str:
        """The response, or a fail-open reason string (never raises)."""
        limit = self.deadline_s if deadline_s is None else deadline_s
        t0 = time.perf_counter()
        try:
            fut = self._pool.submit(self._http.request, method, path, json=body,
                                    timeout=httpx.Timeout(limit))
            return fut.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            return f"client_timeout: no answer from {self.base_url} within {limit:g} s"
        except httpx.TimeoutException as exc:
            return f"client_timeout: {type(exc).__name__} after {time.perf_counter() - t0:.3f} s"
        except (httpx.HTTPError, OSError) as exc:
            return f"client_connection_error: {type(exc).__name__}: {exc}"
        except RuntimeError as exc:  # the pool was shut down (client closed)
            return f"client_connection_error: {exc}"

    def rank(self, job: Mapping[str, Any], candidates: Sequence[str] | None = None, *,
             objective: str = "value", max_cost_per_hour: float | None = None,
             deadline_s: float | None = None) -> RankResponse:
        """Rank ``candidates`` for ``job`` (see ``POST /v1/rank``); never raises.

        Examples
        --------
        Not run here (it needs a running server)::

            r = client.rank(job, ["H100-SXM", "L4"]); r.ranking[0].hardware if r.ranking
        """
        try:
            body = _rank_body(job, candidates, objective, max_cost_per_hour)
        except (TypeError, ValueError) as exc:
            return RankResponse.failed(self._counts.fail(f"client_invalid_request: {exc}"))
        got = self._call("POST", "/v1/rank", body, deadline_s)
        if isinstance(got, str):
            return RankResponse.failed(self._counts.fail(got), objective)
        if got.status_code != 200:
            return RankResponse.failed(self._counts.fail(_http_reason(got)), objective)
        try:
            out = RankResponse.model_validate_json(got.content)
        except ValidationError as exc:
            return RankResponse.failed(self._counts.fail(
                f"client_invalid_response: {exc.error_count()} problem(s) in the body"),
                objective)
        if out.reason is not None and not out.reason.startswith("no_eligible_type"):
            # (an answer that left every candidate out is an answer, not a failure)
            self._counts.fail(f"server_{out.reason}")
        return out

    def predict(self, jobs: Sequence[Mapping[str, Any]], candidates: Sequence[str] | None = None,
                *, deadline_s: float | None = None) -> PredictResponse:
        """Batch predictions (see ``POST /v1/predict``); never raises.

        Examples
        --------
        Not run here (it needs a running server)::

            client.predict([job], ["H100-SXM"], deadline_s=5.0).predictions
        """
        body: dict[str, Any] = {"jobs": [dict(j) for j in jobs]}
        if candidates is not None:
            body["candidates"] = list(candidates)
        got = self._call("POST", "/v1/predict", body, deadline_s)
        if isinstance(got, str):
            return PredictResponse(reason=self._counts.fail(got))
        if got.status_code != 200:
            return PredictResponse(reason=self._counts.fail(_http_reason(got)))
        try:
            return PredictResponse.model_validate_json(got.content)
        except ValidationError as exc:
            return PredictResponse(reason=self._counts.fail(
                f"client_invalid_response: {exc.error_count()} problem(s) in the body"))

    def health(self, *, deadline_s: float | None = None) -> Health:
        """``GET /healthz``; ``degraded`` with a reason when unreachable."""
        got = self._call("GET", "/healthz", None, deadline_s)
        if isinstance(got, str) or got.status_code != 200:
            reason = got if isinstance(got, str) else _http_reason(got)
            return Health(status="degraded", reason=reason)
        try:
            return Health.model_validate_json(got.content)
        except ValidationError:
            return Health(status="degraded", reason="client_invalid_response")

    def model_info(self, *, deadline_s: float | None = None) -> ModelInfo:
        """``GET /v1/model``; ``version`` is ``None`` with a reason when unavailable."""
        got = self._call("GET", "/v1/model", None, deadline_s)
        if isinstance(got, str) or got.status_code != 200:
            return ModelInfo(reason=got if isinstance(got, str) else _http_reason(got))
        try:
            return ModelInfo.model_validate_json(got.content)
        except ValidationError:
            return ModelInfo(reason="client_invalid_response")


class AsyncLeapClient:
    """The asyncio twin of :class:`LeapClient` (same deadline and fail-open rules).

    Examples
    --------
    Not run here (it needs a running server)::

        async with AsyncLeapClient("http://127.0.0.1:8787") as c:
            r = await c.rank(job)
    """

    def __init__(self, base_url: str = "http://127.0.0.1:8787", *, token: str | None = None,
                 deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        _check(base_url, deadline_s)
        self.base_url = base_url.rstrip("/")
        self.deadline_s = float(deadline_s)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                       timeout=httpx.Timeout(self.deadline_s))
        self._counts = _Counts()

    @property
    def fail_open_counts(self) -> dict[str, int]:
        return dict(self._counts.fail_open)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLeapClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def rank(self, job: Mapping[str, Any], candidates: Sequence[str] | None = None, *,
                   objective: str = "value", max_cost_per_hour: float | None = None,
                   deadline_s: float | None = None) -> RankResponse:
        """Rank ``candidates`` for ``job``; never raises (see :meth:`LeapClient.rank`)."""
        limit = self.deadline_s if deadline_s is None else deadline_s
        try:
            body = _rank_body(job, candidates, objective, max_cost_per_hour)
            got = await asyncio.wait_for(
                self._http.post("/v1/rank", json=body, timeout=httpx.Timeout(limit)), limit)
        except (TimeoutError, httpx.TimeoutException):
            return RankResponse.failed(self._counts.fail(
                f"client_timeout: no answer from {self.base_url} within {limit:g} s"), objective)
        except (httpx.HTTPError, OSError) as exc:
            return RankResponse.failed(self._counts.fail(
                f"client_connection_error: {type(exc).__name__}: {exc}"), objective)
        except (TypeError, ValueError) as exc:
            return RankResponse.failed(self._counts.fail(f"client_invalid_request: {exc}"))
        if got.status_code != 200:
            return RankResponse.failed(self._counts.fail(_http_reason(got)), objective)
        try:
            return RankResponse.model_validate_json(got.content)
        except ValidationError as exc:
            return RankResponse.failed(self._counts.fail(
                f"client_invalid_response: {exc.error_count()} problem(s) in the body"),
                objective)
