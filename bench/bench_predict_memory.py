"""Measurement: does `leap serve` hand memory back after a burst of maximum-size batches?

Starts the real server (``python -m leap serve``, one process) on 127.0.0.1, warms it up,
reads its resident set size (RSS, /proc: "cold"), sends one maximum-size call and reads it
again ("before": what a first batch allocates once), sends ``--requests`` (default 20) maximum-size
``POST /v1/predict`` calls (``--jobs`` jobs x ``--candidates`` types = the server's row cap;
two at a time, the default concurrency limit, retrying a 429 after its Retry-After), samples
RSS every 20 ms meanwhile, waits ``--settle`` s and reads it again. The issue's bar: after
within 20% of before. Prints the figures and writes bench/results/bench_predict_memory.json.

    python bench/bench_predict_memory.py [--home DIR] [--requests 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http import free_port, start_server
from bench_rank import bench_workspace, recent_jobs, write_result

CANDIDATES = ["H100-SXM", "L4"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None, help="workspace with a published model "
                    "(default: a cached small simulated one)")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs per request (the schema's "
                    "maximum)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds to wait before 'after'")
    ap.add_argument("--concurrency", type=int, default=2, help="callers at once (the server "
                    "takes 2 batch predictions at once by default)")
    args = ap.parse_args()
    home = bench_workspace(args.home, per_day=1500, days=12)
    jobs = recent_jobs(home, 2000)
    body = json.dumps({"jobs": [jobs[i % len(jobs)] for i in range(args.jobs)],
                       "candidates": CANDIDATES}).encode()
    port = free_port()
    proc = start_server(home, port, workers=1)
    base = f"http://127.0.0.1:{port}"
    headers = {"content-type": "application/json"}
    try:
        with httpx.Client(base_url=base, timeout=120) as c:  # warm-up: small calls only
            for job in jobs[:50]:
                c.post("/v1/rank", json={"job": job})
                c.post("/v1/predict", json={"jobs": [job], "candidates": CANDIDATES})
        time.sleep(args.settle)
        cold = rss_mb(proc.pid)
        # One maximum-size call first: what it allocates once (thread arenas, buffers sized
        # to a batch) is the level a burst must return to; growth beyond it is the leak.
        with httpx.Client(base_url=base, timeout=300) as c:
            assert c.post("/v1/predict", content=body, headers=headers).status_code == 200
        time.sleep(args.settle)
        before = rss_mb(proc.pid)
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_mb(proc.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        retries = [0]
        lock = threading.Lock()
        todo = list(range(args.requests))

        def caller() -> None:
            with httpx.Client(base_url=base, timeout=300) as c:
                while True:
                    with lock:
                        if not todo:
                            return
                        todo.pop()
                    while True:
                        t0 = time.perf_counter()
                        r = c.post("/v1/predict", content=body, headers=headers)
                        if r.status_code != 429:
                            break
                        retries[0] += 1
                        time.sleep(float(r.headers.get("retry-after", "1")))
                    with lock:
                        latencies.append(time.perf_counter() - t0)
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        t0 = time.perf_counter()
        callers = [threading.Thread(target=caller) for _ in range(args.concurrency)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        burst_s = time.perf_counter() - t0
        time.sleep(args.settle)
        stop.set()
        sampler.join()
        after = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(20)
    out: dict[str, Any] = {
        "bench": "predict_memory", "at": datetime.now(UTC).isoformat(),
        "machine": platform.platform(),
        "command": f"leap --home {home} serve --port {port} --workers 1",
        "requests": args.requests, "concurrency": args.concurrency,
        "jobs_per_request": args.jobs,
        "rows_per_request": args.jobs * len(CANDIDATES), "body_bytes": len(body),
        "statuses": statuses, "retries_after_429": retries[0], "burst_s": burst_s,
        "latency_s_max": max(latencies), "latency_s_mean": sum(latencies) / len(latencies),
        "rss_mb_cold": cold, "rss_mb_before": before, "rss_mb_peak": peak[0], "rss_mb_after": after,
        "after_over_before": after / before, "within_20_percent": after <= 1.2 * before,
    }
    print(f"{args.requests} x {args.jobs * len(CANDIDATES):,}-row /v1/predict "
          f"({len(body) / 1e6:.1f} MB bodies) in {burst_s:.1f} s, statuses {statuses}, "
          f"{retries[0]} retries after 429")
    print(f"RSS cold {cold:.0f} MB, before (after one max-size call) {before:.0f} MB, peak "
          f"{peak[0]:.0f} MB, after {after:.0f} MB ({after / before:.2f}x before, "
          f"{after / cold:.2f}x cold)")
    write_result("bench_predict_memory", out)


if __name__ == "__main__":
    main()
