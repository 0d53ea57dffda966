"""The fail-open clients: a hard deadline, and an empty answer on any failure, never a raise."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from leap.errors import ConfigError
from leap.rank.ranker import Ranker
from leap.serve.app import create_app
from leap.serve.client import AsyncLeapClient, LeapClient

# The ranker fixtures are shared with test_rank (candidates for tests/conftest.py).
from test_rank import jobs, ranker  # noqa: F401
from test_serve import serving

DEADLINE_S = 0.3
SLACK_S = 0.25  # thread hand-off and a loaded 2-core machine


@contextlib.contextmanager
def stub_server(reply: bytes | None, delay_s: float = 0.0) -> Iterator[str]:
    """A loopback TCP server that answers every request with ``reply`` after ``delay_s``
    (``reply=None``: never)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    lsock.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
            if reply is not None:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += conn.recv(65536)
                    time.sleep(delay_s)
                    conn.sendall(reply)
                    conn.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        lsock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def url(ranker: Ranker) -> Iterator[str]:  # noqa: F811
    with serving(create_app(ranker, token="tok")) as base:
        yield base


def test_connection_refused_fails_open_fast(jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    with LeapClient(f"http://127.0.0.1:{free_port()}", deadline_s=DEADLINE_S) as client:
        t0 = time.perf_counter()
        r = client.rank(jobs[0])
        assert time.perf_counter() - t0 < DEADLINE_S + SLACK_S
    assert r.ranking == [] and r.reason is not None
    assert r.reason.startswith("client_connection_error:")
    assert client.fail_open_counts == {"client_connection_error": 1}


def test_a_server_that_never_answers_hits_the_deadline(jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    with stub_server(None) as base, LeapClient(base, deadline_s=DEADLINE_S) as client:
        for _ in range(3):
            t0 = time.perf_counter()
            r = client.rank(jobs[0])
            took = time.perf_counter() - t0
            assert DEADLINE_S * 0.8 < took < DEADLINE_S + SLACK_S
            assert r.ranking == [] and r.reason is not None
            assert r.reason.startswith("client_timeout:")
        # A per-call deadline overrides the client's.
        t0 = time.perf_counter()
        assert client.rank(jobs[0], deadline_s=0.1).reason.startswith("client_timeout")  # type: ignore[union-attr]
        assert time.perf_counter() - t0 < 0.1 + SLACK_S
        assert client.health(deadline_s=0.1).status == "degraded"


def test_a_garbled_answer_fails_open(jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    garbage = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n"
               b"Connection: close\r\n\r\nnotjson")
    with stub_server(garbage) as base, LeapClient(base, deadline_s=2.0) as client:
        r = client.rank(jobs[0])
        assert r.ranking == [] and r.reason is not None
        assert r.reason.startswith("client_invalid_response:")
        assert client.predict([jobs[0]]).reason.startswith("client_invalid_response")  # type: ignore[union-attr]
        assert client.model_info().reason == "client_invalid_response"
    err = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\n"
           b"busy")
    with stub_server(err) as base, LeapClient(base, deadline_s=2.0) as client:
        assert client.rank(jobs[0]).reason == "client_http_503: busy"


def test_against_the_real_server(url: str, ranker: Ranker,  # noqa: F811
                                 jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    with LeapClient(url, token="tok", deadline_s=5.0) as client:
        r = client.rank(jobs[0], ["H100-SXM", "L4", "T4"])
        assert r.reason is None and r.model_version == ranker.model_version
        local = ranker.rank(jobs[0], ["H100-SXM", "L4", "T4"])
        assert [e.hardware for e in r.ranking] == [e.hardware for e in local.ranking]
        bad = client.rank(jobs[0], ["H10O"])
        assert bad.ranking == [] and bad.reason is not None
        assert bad.reason.startswith("client_http_422: candidates: unknown hardware 'H10O'")
        p = client.predict([jobs[0]], ["L4"])
        assert p.reason is None and [x.hardware for x in p.predictions] == ["L4"]
        assert client.health().status == "ok"
        assert client.model_info().version == ranker.model_version
        assert client.fail_open_counts == {"client_http_422": 1}
    with LeapClient(url, deadline_s=5.0) as anonymous:
        r = anonymous.rank(jobs[0])
        assert r.ranking == [] and r.reason is not None and r.reason.startswith(
            "client_http_401")


def test_a_server_without_a_model_answers_with_its_reason(tmp_path: Any,
                                                          jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    empty = Ranker(tmp_path / "models", background_reload=False)
    with serving(create_app(empty)) as base, LeapClient(base, deadline_s=5.0) as client:
        r = client.rank(jobs[0])
        assert r.ranking == [] and r.reason is not None and r.reason.startswith("no_model:")
        assert client.fail_open_counts == {"server_no_model": 1}


def test_async_client(url: str, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    async def main() -> None:
        async with AsyncLeapClient(url, token="tok", deadline_s=5.0) as client:
            r = await client.rank(jobs[0], ["L4", "T4"])
            assert r.reason is None and {e.hardware for e in r.ranking} == {"L4", "T4"}
        with stub_server(None) as base:
            async with AsyncLeapClient(base, deadline_s=DEADLINE_S) as slow:
                t0 = time.perf_counter()
                r = await slow.rank(jobs[0])
                assert time.perf_counter() - t0 < DEADLINE_S + SLACK_S
                assert r.reason is not None and r.reason.startswith("client_timeout")
        async with AsyncLeapClient(f"http://127.0.0.1:{free_port()}") as gone:
            r = await gone.rank(jobs[0])
            assert r.reason is not None and r.reason.startswith("client_connection_error")

    asyncio.run(main())


def test_a_per_call_deadline_can_be_longer(jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    body = b'{"ranking": [], "model_version": "v1", "reason": null}'
    reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    with stub_server(reply, delay_s=0.5) as base, LeapClient(base, deadline_s=0.2) as client:
        assert client.rank(jobs[0]).reason.startswith("client_timeout")  # type: ignore[union-attr]
        slow_ok = client.rank(jobs[0], deadline_s=3.0)
        assert slow_ok.reason is None and slow_ok.model_version == "v1"


def test_bad_client_settings() -> None:
    with pytest.raises(ConfigError, match="base_url must start with http:// or https://"):
        LeapClient("127.0.0.1:8787")
    with pytest.raises(ConfigError, match="deadline_s must be a positive number"):
        LeapClient(deadline_s=0)
