"""``leap serve --workers N``: N server processes, each listening on its own socket.

uvicorn's own multi-process mode binds one socket in the parent and hands it to every worker:
all of them accept from one queue, and a burst of new connections goes to whichever worker
wakes first, which accepts them all. Keep-alive connections then stay where they landed, so a
client's connection pool can leave a core idle for as long as it keeps its connections
(measured with two workers: of 8 connections opened at once, all 8 went to one worker in 1
try of 6, 5 to one in 2 more; closed-loop throughput over 8 such connections then moved
between 209 and 447 rankings/s from one run to the next, see ``bench/bench_http.py``).

Here each worker binds its own socket to the address with ``SO_REUSEPORT`` and the kernel
deals each new connection to one of them by a hash of its addresses, whichever worker is
busy (Linux; the design nginx's ``reuseport`` and several Python servers use). Where the
option is missing, or for ``--port 0`` (each worker would get a port of its own), the CLI
keeps uvicorn's mode.

The parent only supervises: it checks the address is free, starts the workers, restarts one
that dies (not one whose app failed to start, nor one that keeps exiting within seconds of its
start: those would fail again), replaces one whose event loop stops turning (hung), and on
SIGINT / SIGTERM stops them all with SIGTERM, so each finishes its requests and flushes its
decision log.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from leap.errors import ConfigError

log = logging.getLogger("leap.serve")

#: The exit code of a uvicorn worker whose app failed to start (``uvicorn.config``).
STARTUP_FAILURE = 3
#: Seconds between the parent's looks at its workers, and the most it waits for one to stop.
POLL_S = 0.5
STOP_TIMEOUT_S = 30.0
#: A worker that exits within this many seconds of its start exited at start; after
#: :data:`MAX_QUICK_EXITS` such exits in a row the parent stops instead of restarting it
#: forever (e.g. a worker that cannot import the app).
QUICK_EXIT_S = 10.0
MAX_QUICK_EXITS = 3
#: A worker whose event loop has not turned for this many seconds (uvicorn's tick, every
#: 0.1 s, stamps a shared clock) is hung: killed and replaced. A ranking takes milliseconds and
#: the largest batch prediction about a second; a new model loads in a thread.
HANG_S = 60.0


def reuse_port_supported() -> bool:
    """Whether this platform deals connections over ``SO_REUSEPORT`` sockets (Linux does;
    other systems accept the option but may hand every connection to one socket)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def listener(host: str, port: int, *, reuse_port: bool = True) -> socket.socket:
    """A TCP socket bound to ``(host, port)``, not yet listening (the server calls
    ``listen`` once its app has started, so no connection waits on a worker still loading).

    Made with ``IPPROTO_TCP`` so that asyncio sets ``TCP_NODELAY`` on the connections it
    accepts (it checks the listening socket's protocol).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def check_address(host: str, port: int) -> None:
    """Raise :class:`~leap.errors.ConfigError` when ``host:port`` cannot be bound: in use by
    anything, including another ``leap serve`` (bound here without ``SO_REUSEPORT``, so a
    second server cannot silently share the port and split the traffic with the first)."""
    try:
        listener(host, port, reuse_port=False).close()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def _worker(app: str, host: str, port: int, log_level: str, beat: Any) -> None:
    """One worker process: ``app`` (a factory's import path) on its own socket; ``beat`` (a
    shared double) gets the monotonic clock each time its event loop turns."""
    import uvicorn

    class Server(uvicorn.Server):
        async def on_tick(self, counter: int) -> bool:
            beat.value = time.monotonic()
            return await super().on_tick(counter)

    config = uvicorn.Config(app, factory=True, host=host, port=port, log_level=log_level,
                            access_log=False)
    Server(config).run(sockets=[listener(host, port)])


def run_workers(app: str, *, host: str, port: int, workers: int, log_level: str,
                hang_s: float = HANG_S) -> None:
    """Serve the app that the factory ``app`` ("module:function") builds from ``workers``
    processes until SIGINT or SIGTERM; raises ConfigError when the address is taken or a
    worker cannot start. A worker whose event loop stops turning for ``hang_s`` seconds is
    replaced."""
    check_address(host, port)
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing loaded twice

    def start() -> tuple[BaseProcess, float, Any]:
        """A new worker, when it started, and its loop's last turn (0 before the first)."""
        beat = ctx.Value("d", 0.0, lock=False)
        proc = ctx.Process(target=_worker, args=(app, host, port, log_level, beat),
                           daemon=False)
        proc.start()
        return proc, time.monotonic(), beat

    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    slots = [start() for _ in range(workers)]
    failed: str | None = None
    quick_exits = 0
    try:
        while not stop.wait(POLL_S):
            for i, (proc, since, beat) in enumerate(slots):
                if proc.is_alive():
                    if not beat.value or time.monotonic() - beat.value <= hang_s:
                        continue  # starting (no turn yet), or turning
                    log.warning("server process %s has not turned its event loop for %.0f s; "
                                "replacing it", proc.pid, time.monotonic() - beat.value)
                    proc.kill()
                    proc.join()
                quick = time.monotonic() - since < QUICK_EXIT_S
                quick_exits = quick_exits + 1 if quick else 0
                if proc.exitcode == STARTUP_FAILURE or quick_exits >= MAX_QUICK_EXITS:
                    failed = (f"a server process could not start (exit code {proc.exitcode}"
                              + (f", {quick_exits} times in a row" if quick_exits > 1 else "")
                              + ")")
                    stop.set()
                    break
                log.warning("server process %s exited with code %s; starting another",
                            proc.pid, proc.exitcode)
                slots[i] = start()
    finally:
        for proc, _, _ in slots:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn's graceful shutdown
        for proc, _, _ in slots:
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if failed is not None:
        raise ConfigError(failed + "; its error is printed above")
