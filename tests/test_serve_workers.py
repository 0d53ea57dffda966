"""`leap serve --workers N` on per-worker sockets (leap.serve.workers): connections spread
over the workers, a dead worker is replaced, a taken port is a one-line error."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import psutil
import pytest

from conftest import SERVER_STOP_S
from leap.config import Workspace
from leap.errors import ConfigError
from leap.serve.workers import check_address, listener, reuse_port_supported, run_workers
from test_rank import jobs, ranker  # noqa: F401
from test_serve import wait_for, wait_until_serving

linux_only = pytest.mark.skipif(not reuse_port_supported(), reason="needs SO_REUSEPORT (Linux)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_accepted_connections_get_tcp_nodelay() -> None:
    """The listener is made with IPPROTO_TCP, so asyncio turns Nagle off on what it accepts
    (on a socket made with protocol 0 it does not, and a small response can wait on the
    client's delayed ACK)."""
    sock = listener("127.0.0.1", 0, reuse_port=False)
    seen: list[int] = []

    async def main() -> None:
        def on_client(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP,
                                                                   socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_client, sock=sock)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_a_taken_address_is_a_config_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            check_address("127.0.0.1", port)
    check_address("127.0.0.1", port)  # free again


@linux_only
def test_a_second_server_cannot_share_the_port() -> None:
    """A worker's socket sets SO_REUSEPORT; the check binds without it, so another
    `leap serve` already on the port is refused rather than sharing its traffic."""
    first = listener("127.0.0.1", 0)
    first.listen()
    try:
        with pytest.raises(ConfigError, match="cannot listen"):
            check_address("127.0.0.1", first.getsockname()[1])
    finally:
        first.close()


def _workers(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The server's worker processes (not multiprocessing's resource tracker, not one that
    died and is not yet reaped)."""
    out = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _holders(workers: list[psutil.Process], port: int) -> dict[int, int]:
    """Established connections to ``port`` held by each worker."""
    return {w.pid: sum(1 for c in w.net_connections(kind="tcp")
                       if c.laddr and c.laddr.port == port and c.status == "ESTABLISHED")
            for w in workers}


@linux_only
def test_workers_share_connections_and_a_dead_worker_is_replaced(
        fresh_copy: Workspace, jobs: list[dict[str, Any]]) -> None:  # noqa: F811
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "leap", "--home",
                             str(fresh_copy.home), "serve", "--port", str(port),
                             "--workers", "2", "--no-compiled"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(proc, base)
        # One worker may answer before the other listens: wait for both.
        wait_for(lambda: len(_workers(proc)) == 2 and all(
            any(c.status == "LISTEN" and c.laddr.port == port
                for c in w.net_connections(kind="tcp")) for w in _workers(proc)), 60)
        # 16 keep-alive connections opened at once: the kernel deals them over both
        # workers (all 16 on one worker: a 2 in 65,536 chance with two fair sockets).
        conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
        try:
            for c in conns:
                c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            for c in conns:
                assert c.recv(4096).startswith(b"HTTP/1.1 200")
            held = _holders(_workers(proc), port)
            assert sum(held.values()) == 16 and all(n > 0 for n in held.values()), held
        finally:
            for c in conns:
                c.close()
        # A worker killed outright is replaced; the service keeps answering meanwhile.
        victim = _workers(proc)[0].pid
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(_workers(proc)) == 2 and victim not in
                 {w.pid for w in _workers(proc)}, 60)
        r = httpx.post(f"{base}/v1/rank", json={"job": jobs[0]}, timeout=30).json()
        assert r["reason"] is None and r["ranking"]
        workers = _workers(proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(SERVER_STOP_S)
    assert proc.returncode == 0
    time.sleep(0.2)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


@linux_only
def test_serve_workers_on_a_taken_port_says_so(trained_workspace: Workspace) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "leap", "--home",
                              str(trained_workspace.home), "serve", "--port", str(port),
                              "--workers", "2", "--no-compiled"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


@linux_only
def test_a_worker_that_keeps_failing_at_start_stops_the_server() -> None:
    """Not restarted forever: a worker that cannot even import its app exits at once, and
    after a few such exits in a row the parent gives up with a one-line error."""
    with pytest.raises(ConfigError, match="could not start"):
        run_workers("leap.no_such_module:app", host="127.0.0.1", port=free_port(), workers=1,
                    log_level="critical")


@linux_only
def test_a_hung_worker_is_replaced() -> None:
    """A worker whose event loop stops turning (here: a request that blocks it) is killed and
    replaced after ``hang_s``; the new one answers."""
    port = free_port()
    tests = os.path.dirname(os.path.abspath(__file__))
    script = ("from leap.serve.workers import run_workers\n"
              f"run_workers('blocking_app:app', host='127.0.0.1', port={port}, workers=1, "
              "log_level='critical', hang_s=2.0)\n")
    proc = subprocess.Popen([sys.executable, "-c", script],
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [tests, os.environ.get("PYTHONPATH", "")])},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def pid() -> int | None:
        try:
            return int(httpx.get(f"{base}/pid", timeout=1).json()["pid"])
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return None

    try:
        wait_for(lambda: pid() is not None, 60)
        first = pid()
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{base}/block", timeout=1)
        wait_for(lambda: pid() not in (None, first), 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(SERVER_STOP_S)
    assert proc.returncode == 0
