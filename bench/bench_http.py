"""Benchmark: `leap serve` over loopback HTTP under a fixed request rate, then at saturation.

Starts the real server (``python -m leap serve --workers N``, default one process per core)
in its own processes, then drives ``POST /v1/rank`` (one job x 20 candidate types) from an
asyncio loop in this process over keep-alive connections (a minimal HTTP/1.1 client: httpx
costs ~4 ms of CPU per request, which would take the server's core):

1. open loop at ``--rate`` requests/s for ``--duration`` s (default 500/s for 60 s, so 30,000
   requests): latency is measured from each request's *scheduled* send time, so a stalled
   server cannot hide queueing (no coordinated omission); target (issue 15) p99 <= 10 ms,
   zero errors;
2. closed loop with ``--workers`` concurrent callers for ``--saturate`` s: the most it serves;
   target >= 1,000 rankings/s with p99 <= 25 ms.

The server scores with compiled trees (``leap serve --compiled``, the default): the model is
compiled before the server starts (once per version, cached beside it), so ``--home`` must be
writable. ``--no-compiled`` measures LightGBM scoring instead.

Counts and time are bounded. Prints the figures and writes bench/results/bench_http.json.

    python bench/bench_http.py [--home DIR] [--rate 500] [--duration 60] [--server-workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rank import CANDIDATES, bench_workspace, recent_jobs, write_result

TARGET_P99_MS = 10.0  # open loop
TARGET_CLOSED_RPS = 1000.0
TARGET_CLOSED_P99_MS = 25.0
JSON = {"content-type": "application/json"}
# A ranked answer has "reason":null; checking the bytes spares the client a JSON parse.
OK_MARK = b'"reason":null'
#: A job that fits none of its candidates gets an empty list with this reason: an answer.
NO_FIT_MARK = b'"reason":"no_eligible_type'


def run(coro: Any) -> Any:
    """Run the load loop on uvloop when it is installed (the client's CPU is on the clock)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def server_cpu_s(pid: int) -> float:
    """User + system CPU seconds so far of process ``pid`` and its descendants (Linux /proc).

    ``leap serve --workers N`` runs N worker processes under one supervisor.
    """
    stats: dict[int, tuple[int, float]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(p.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12]))
                                  / os.sysconf("SC_CLK_TCK"))
    tree, total = {pid}, 0.0
    for _ in range(4):  # supervisor -> workers (-> their helpers)
        tree |= {q for q, (parent, _) in stats.items() if parent in tree}
    for q in tree:
        total += stats.get(q, (0, 0.0))[1]
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(home: Path, port: int, workers: int, compiled: bool = True,
                 decision_log: bool = True, max_rank_batch: int | None = None
                 ) -> subprocess.Popen[bytes]:
    extra = [] if max_rank_batch is None else ["--max-rank-batch", str(max_rank_batch)]
    proc = subprocess.Popen([sys.executable, "-m", "leap", "--home", str(home), "serve",
                             "--port", str(port), "--log-level", "warning",
                             "--workers", str(workers),
                             "--compiled" if compiled else "--no-compiled",
                             "--decision-log" if decision_log else "--no-decision-log",
                             *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own group: stop() ends every worker
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"server exited: {err}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).json()["status"] == "ok":
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("server did not become healthy within 120 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server: SIGTERM (it flushes its decision log), then SIGKILL to its group."""
    import signal

    proc.terminate()
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def summary(lat_ms: list[float], wall_s: float, errors: int, sent: int) -> dict[str, Any]:
    a = np.asarray(lat_ms) if lat_ms else np.asarray([np.nan])
    return {"requests": sent, "ok": len(lat_ms), "errors": errors, "wall_s": wall_s,
            "throughput_rps": len(lat_ms) / wall_s if wall_s else 0.0,
            "p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(np.max(a))}


class Connections:
    """Keep-alive HTTP/1.1 connections for the load loop: a minimal client, like wrk's.

    httpx spends ~4 ms of CPU per request, which on a 2-core machine steals the server's
    core; writing the request bytes and reading a Content-Length body costs a small
    fraction of that, so the figures are the server's.
    """

    def __init__(self, host: str, port: int, size: int) -> None:
        self.host, self.port, self.size = host, port, size
        self.free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = \
            asyncio.Queue()

    async def open(self) -> None:
        for _ in range(self.size):
            self.free.put_nowait(await asyncio.open_connection(self.host, self.port))

    async def close(self) -> None:
        while not self.free.empty():
            _, writer = self.free.get_nowait()
            writer.close()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; (status, response body). Raises OSError on a broken connection."""
        reader, writer = await self.free.get()
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                         .encode() + body)
            head = await reader.readuntil(b"\r\n\r\n")
            at = head.lower().index(b"content-length:") + 15
            data = await reader.readexactly(int(head[at:head.index(b"\r\n", at)]))
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            writer.close()  # replace the broken connection, then report the failure
            self.free.put_nowait(await asyncio.open_connection(self.host, self.port))
            raise OSError(f"request failed: {exc!r}") from None
        self.free.put_nowait((reader, writer))
        return int(head[9:12]), data


def answered(status: int, content: bytes) -> bool:
    """A ranking (fail-open answers other than "fits no candidate" are errors)."""
    return status == 200 and (OK_MARK in content or NO_FIT_MARK in content)


async def open_loop(host: str, port: int, bodies: list[bytes], rate: float,
                    duration_s: float, max_in_flight: int) -> dict[str, Any]:
    total = int(rate * duration_s)
    lat: list[float] = []
    service: list[float] = []
    errors = 0
    conns = Connections(host, port, max_in_flight)
    await conns.open()

    async def one(i: int, scheduled: float) -> None:
        nonlocal errors
        sent = time.perf_counter()
        try:
            status, content = await conns.post("/v1/rank", bodies[i % len(bodies)])
        except OSError:
            errors += 1
            return
        done = time.perf_counter()
        if not answered(status, content):
            errors += 1
            return
        lat.append((done - scheduled) * 1e3)
        service.append((done - sent) * 1e3)

    t0 = time.perf_counter()
    tasks = []
    for i in range(total):
        scheduled = t0 + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, scheduled)))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    await conns.close()
    out = summary(lat, wall, errors, total)
    out["target_rate_rps"] = rate
    s = np.asarray(service) if service else np.asarray([np.nan])
    # "service": from the moment a connection was free to the answer (excludes waiting for
    # a free connection, includes the server's queue).
    out["service_p50_ms"] = float(np.percentile(s, 50))
    out["service_p99_ms"] = float(np.percentile(s, 99))
    return out


async def closed_loop(host: str, port: int, bodies: list[bytes], workers: int,
                      duration_s: float, max_requests: int) -> dict[str, Any]:
    lat: list[float] = []
    errors = 0
    sent = 0
    conns = Connections(host, port, workers)
    await conns.open()
    stop_at = time.perf_counter() + duration_s

    async def worker(w: int) -> None:
        nonlocal errors, sent
        i = w
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            t = time.perf_counter()
            try:
                status, content = await conns.post("/v1/rank", bodies[i % len(bodies)])
                if not answered(status, content):
                    errors += 1
                else:
                    lat.append((time.perf_counter() - t) * 1e3)
            except OSError:
                errors += 1
            i += workers

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    wall = time.perf_counter() - t0
    await conns.close()
    out = summary(lat, wall, errors, sent)
    out["workers"] = workers
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None, help="workspace with a published model")
    ap.add_argument("--rate", type=float, default=500.0, help="requests per second")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of open-loop load")
    ap.add_argument("--max-in-flight", type=int, default=32)
    ap.add_argument("--saturate", type=float, default=10.0, help="seconds of closed-loop load")
    ap.add_argument("--workers", type=int, default=8, help="closed-loop callers")
    ap.add_argument("--server-workers", type=int, default=2, help="leap serve --workers")
    ap.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=True,
                    help="serve with compiled trees (compiled here first, once per version)")
    ap.add_argument("--decision-log", action=argparse.BooleanOptionalAction, default=True,
                    help="record every ranking served, as `leap serve` does by default")
    ap.add_argument("--max-rank-batch", type=int, default=None,
                    help="leap serve --max-rank-batch (default: the server's; 1 = each alone)")
    args = ap.parse_args()
    if args.rate * args.duration > 100_000:
        raise SystemExit("refusing more than 100,000 requests; lower --rate or --duration")

    home = bench_workspace(args.home)
    scoring = "lightgbm"
    if args.compiled:
        from leap.model.artifact import Registry
        from leap.model.compiled import compile_artifact

        scoring = compile_artifact(Registry(home / "models").load(), build=True)
        print(f"model scoring: {scoring}")
    bodies = [json.dumps({"job": j, "candidates": CANDIDATES}).encode()
              for j in recent_jobs(home, 2000)]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(home, port, args.server_workers, args.compiled, args.decision_log,
                        args.max_rank_batch)
    try:
        run(open_loop("127.0.0.1", port, bodies, args.rate, 3.0, args.max_in_flight))  # warm
        server0, client0 = server_cpu_s(proc.pid), time.process_time()
        steady = run(open_loop("127.0.0.1", port, bodies, args.rate, args.duration,
                               args.max_in_flight))
        # CPU per request does not depend on what else the machine runs: one free core
        # serves about 1000 / server_cpu_ms requests per second.
        steady["server_cpu_ms_per_request"] = (server_cpu_s(proc.pid) - server0) * 1e3 / max(
            steady["requests"], 1)
        steady["client_cpu_ms_per_request"] = (time.process_time() - client0) * 1e3 / max(
            steady["requests"], 1)
        sat = run(closed_loop("127.0.0.1", port, bodies, args.workers, args.saturate,
                              max_requests=int(args.saturate * 2000)))
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
    finally:
        stop(proc)
    fail_open = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                    if line.startswith("leap_fail_open_total{"))
    # One process's view (the one that answered /metrics): rankings per pass, over the run.
    totals = {line.split(" ")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith(("leap_rank_batch_size_sum", "leap_rank_batch_size_count"))}
    mean_batch = totals.get("leap_rank_batch_size_sum", 0.0) / max(
        totals.get("leap_rank_batch_size_count", 0.0), 1.0)
    print(f"open loop {args.rate:.0f} req/s x {args.duration:.0f} s ({steady['requests']:,} "
          f"requests, 1 job x {len(CANDIDATES)} types each):")
    print(f"  served {steady['throughput_rps']:.1f} req/s, errors {steady['errors']}, latency "
          f"p50 {steady['p50_ms']:.1f} ms  p90 {steady['p90_ms']:.1f}  p99 "
          f"{steady['p99_ms']:.1f}  max {steady['max_ms']:.0f}")
    print(f"  (time on the wire only: p50 {steady['service_p50_ms']:.1f} ms, p99 "
          f"{steady['service_p99_ms']:.1f} ms)")
    print(f"  CPU per request: server {steady['server_cpu_ms_per_request']:.2f} ms (one free "
          f"core: ~{1000 / steady['server_cpu_ms_per_request']:.0f} req/s), load generator "
          f"{steady['client_cpu_ms_per_request']:.2f} ms")
    print(f"closed loop, {args.workers} callers x {args.saturate:.0f} s: "
          f"{sat['throughput_rps']:.0f} req/s, p50 {sat['p50_ms']:.1f} ms, p99 "
          f"{sat['p99_ms']:.1f} ms, errors {sat['errors']}; one process ranked "
          f"{mean_batch:.2f} requests a pass on average over the run")
    ok = steady["p99_ms"] <= TARGET_P99_MS and steady["errors"] == 0
    closed_ok = (sat["throughput_rps"] >= TARGET_CLOSED_RPS
                 and sat["p99_ms"] <= TARGET_CLOSED_P99_MS and sat["errors"] == 0)
    print(f"target open loop p99 <= {TARGET_P99_MS:.0f} ms at {args.rate:.0f} req/s with zero "
          f"errors: {'met' if ok else 'MISSED'}; closed loop >= {TARGET_CLOSED_RPS:,.0f}/s with "
          f"p99 <= {TARGET_CLOSED_P99_MS:.0f} ms: {'met' if closed_ok else 'MISSED'} (server "
          f"fail-open count {fail_open:.0f}; scoring {scoring}; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    out = {"bench": "http", "at": datetime.now(UTC).isoformat(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "server_workers": args.server_workers,
           "decision_log": args.decision_log, "max_rank_batch": args.max_rank_batch,
           "mean_rank_batch": mean_batch,
           "load_avg_1m": os.getloadavg()[0],
           "open_loop": steady, "closed_loop": sat, "server_fail_open": fail_open,
           "scoring": scoring, "target_p99_ms": TARGET_P99_MS, "target_met": ok,
           "target_closed_rps": TARGET_CLOSED_RPS, "target_closed_p99_ms": TARGET_CLOSED_P99_MS,
           "closed_target_met": closed_ok}
    write_result("bench_http", out)


if __name__ == "__main__":
    main()
