"""Benchmark: CPU per ``POST /v1/rank`` of the HTTP app's own layers, in process.

The app of ``leap serve`` (:func:`leap.serve.app.create_app`) is called as an ASGI app, with no
socket or HTTP parsing, and its ranker answers each job from a cache filled beforehand: what
is left is what the app does around a ranking (the edge middleware, parsing and validating the
body, building and writing the answer). Two ways in, in alternating rounds of one run:

- ``application/json``: the body is parsed, validated and answered at the edge
  (``_Edge`` calls the app's ``rank_direct``);
- ``application/vnd.leap+json``: the same body through FastAPI's routing, dependency solving
  and validation (what every ranking took before the edge answered JSON bodies).

The answers are checked equal (but ``latency_ms``). Issue 15 asks the server for 1,000
rankings/s on 2 cores; this is the part of each that is not the ranking. Prints the figures
and writes bench/results/bench_app.json.

    python bench/bench_app.py [--home DIR] [--requests 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rank import CANDIDATES, bench_workspace, recent_jobs, write_result

WAYS = {"edge": b"application/json", "fastapi": b"application/vnd.leap+json"}


async def post(app: Any, body: bytes, kind: bytes) -> bytes:
    """One ``POST /v1/rank`` to the ASGI ``app``; the answer's body (a 200 is required)."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    out: list[Any] = []

    async def receive() -> Any:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        out.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/rank", "raw_path": b"/v1/rank",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "headers": [
                 (b"content-type", kind), (b"content-length", str(len(body)).encode())]}
    await app(scope, receive, send)
    if out[0]["status"] != 200:
        raise SystemExit(f"/v1/rank answered {out[0]['status']}: {out[1]['body'][:200]!r}")
    return bytes(out[1]["body"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None, help="workspace with a published model")
    ap.add_argument("--requests", type=int, default=1000, help="distinct jobs, each a request")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of each way, alternating")
    args = ap.parse_args()

    from leap.model.artifact import Registry
    from leap.rank.ranker import Ranker
    from leap.serve.app import create_app

    home = bench_workspace(args.home)
    ranker = Ranker(Registry(home / "models"), background_reload=False)
    jobs = recent_jobs(home, args.requests)

    def key(job: Any) -> tuple[Any, ...]:
        return tuple(sorted((k, str(v)) for k, v in job.items() if v is not None))

    answers = {key(j): ranker.rank(j, CANDIDATES, strict=True) for j in jobs}
    ranker.rank = lambda job, candidates=None, **_: answers[key(job)]  # type: ignore[method-assign]
    # One request at a time (no batcher): the layers, not how requests are grouped.
    app = create_app(ranker, max_rank_batch=1, dashboard=False)
    bodies = [orjson.dumps({"job": j, "candidates": CANDIDATES}) for j in jobs]

    async def run() -> dict[str, list[float]]:
        for body in bodies[:200]:  # warm-up, and the two ways give the same answer
            a, b = [orjson.loads(await post(app, body, kind)) for kind in WAYS.values()]
            a.pop("latency_ms"), b.pop("latency_ms")
            if a != b:
                raise SystemExit("the edge and FastAPI's route answered differently")
        ms: dict[str, list[float]] = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, kind in WAYS.items():
                c0 = time.process_time()
                for body in bodies:
                    await post(app, body, kind)
                ms[name].append((time.process_time() - c0) * 1e3 / len(bodies))
        return ms

    ms = asyncio.run(run())
    out: dict[str, Any] = {"bench": "app", "at": datetime.now(UTC).isoformat(),
                           "machine": platform.machine(), "cpus": os.cpu_count(),
                           "requests": len(bodies), "rounds": args.rounds,
                           "load_avg_1m": os.getloadavg()[0]}
    for name, values in ms.items():
        out[f"{name}_cpu_ms"] = values
        out[f"{name}_cpu_ms_median"] = float(np.median(values))
        print(f"{name:>8}: app layers {np.median(values):.3f} ms CPU a request (median of "
              f"{args.rounds} rounds of {len(bodies):,}: "
              f"{', '.join(f'{v:.3f}' for v in values)})")
    out["ratio_fastapi_to_edge"] = out["fastapi_cpu_ms_median"] / out["edge_cpu_ms_median"]
    print(f"FastAPI's route / the edge: {out['ratio_fastapi_to_edge']:.2f}x; load average "
          f"{out['load_avg_1m']:.2f} on {os.cpu_count()} cores")
    write_result("bench_app", out)


if __name__ == "__main__":
    main()
