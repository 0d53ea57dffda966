"""Fuzz: schemathesis against a real `leap serve` on 127.0.0.1, far longer than the test suite.

Starts ``python -m leap serve`` on a workspace with a published model, then runs the same
checks as ``tests/test_serve.py`` (every operation of the OpenAPI schema, positive and negative
cases for POST: no 5xx, only documented statuses, content types, headers and body schemas)
with ``--examples`` cases per operation and mode. Writes bench/results/fuzz_service.json.

    python bench/fuzz_service.py [--home DIR] [--examples 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_http import free_port, start_server
from bench_rank import bench_workspace, write_result

from test_serve import fuzz_service


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--examples", type=int, default=1000, help="cases per operation and mode")
    args = ap.parse_args()
    home = bench_workspace(args.home, per_day=1500, days=12)
    port = free_port()
    proc = start_server(home, port, workers=1)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        out = fuzz_service(url, {"POST": args.examples, "GET": max(args.examples // 10, 10)})
        out["seconds"] = time.perf_counter() - t0
        assert proc.poll() is None, "the server survived the fuzz"
    finally:
        proc.terminate()
        proc.wait(20)
    out.update({"bench": "fuzz_service", "at": datetime.now(UTC).isoformat(), "failures": 0})
    print(f"{out['cases']:,} cases in {out['seconds']:.0f} s, no failure; statuses "
          f"{out['statuses']}")
    write_result("fuzz_service", out)


if __name__ == "__main__":
    main()
