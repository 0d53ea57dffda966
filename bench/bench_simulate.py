"""Benchmark: simulate 31 days x 25,000 attempts/day of the reference fleet into a fresh store.

Runs `simulate` (generation + ingest validation + DuckDB writes) in a fresh subprocess so its
peak RSS is its own, then times the in-memory generation alone and `calibrate`. Target
(issue): the whole simulation under 60 s on the 2-core dev machine. Prints the figures and
writes bench/results/bench_simulate.json.

    python bench/bench_simulate.py [--days 31] [--attempts-per-day 25000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TARGET_S = 60.0

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from leap.catalog import Catalog
from leap.data.store import Store
from leap.sim.calibrate import calibrate
from leap.sim.run import simulate
from leap.sim.scenario import Scenario
t1 = time.perf_counter()
days, per_day, seed = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
scenario = Scenario.load().override(attempts_per_day=per_day)
with Store(Path(sys.argv[1])) as store:
    report = simulate(store, Catalog.default(), scenario, days=days, seed=seed)
    t2 = time.perf_counter()
    count = store.count()
    t3 = time.perf_counter()
    cal = calibrate(store)
    t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "simulate_s": t2 - t1, "calibrate_s": t4 - t3,
                  "count": count, "report": report.to_dict(), "calibration": cal,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def generation_only(days: int, per_day: int, seed: int) -> float:
    """Seconds to generate the attempt tables in memory (no validation, no store)."""
    from leap.catalog import Catalog
    from leap.sim.fleet import Fleet
    from leap.sim.run import DEFAULT_START, simulate_day
    from leap.sim.scenario import Scenario

    t0 = time.perf_counter()
    fleet = Fleet(Scenario.load().override(attempts_per_day=per_day), Catalog.default(), seed,
                  DEFAULT_START)
    rows = sum(simulate_day(fleet, d).table.num_rows for d in range(days))
    assert rows == days * per_day
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--days", type=int, default=31)
    ap.add_argument("--attempts-per-day", type=int, default=25_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="leap-bench-sim-"))
    store = work / "leap.duckdb"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, str(store), str(args.days),
                          str(args.attempts_per_day), str(args.seed)],
                         capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit(f"simulate child failed:\n{out.stderr}")
    child: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    shutil.rmtree(work, ignore_errors=True)
    gen_s = generation_only(args.days, args.attempts_per_day, args.seed)

    rows = args.days * args.attempts_per_day
    cal = child["calibration"]
    result = {
        "benchmark": "simulate",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "days": args.days, "attempts_per_day": args.attempts_per_day, "seed": args.seed,
        "rows": rows, "stored": child["count"],
        "simulate_s": round(child["simulate_s"], 2),
        "generation_only_s": round(gen_s, 2),
        "ingest_and_store_s": round(child["simulate_s"] - gen_s, 2),
        "calibrate_s": round(child["calibrate_s"], 2),
        "child_wall_s": round(wall, 2),
        "rows_per_s": round(rows / child["simulate_s"]),
        "peak_rss_gib": round(child["maxrss_kib"] / 2**20, 2),
        "target_s": TARGET_S,
        "meets_target": child["simulate_s"] < TARGET_S,
        "calibration": {k: cal[k] for k in ("throughput_span_orders", "oracle_ceiling",
                                            "observed_pair_share", "attempts_per_day",
                                            "new_families_per_day")},
    }
    print(f"simulate {args.days} days x {args.attempts_per_day:,}/day = {rows:,} attempts "
          f"into a fresh store: {result['simulate_s']:.1f} s (target < {TARGET_S:.0f} s: "
          f"{'OK' if result['meets_target'] else 'MISSED'})")
    print(f"  generation alone {gen_s:.1f} s, validation + store "
          f"{result['ingest_and_store_s']:.1f} s, {result['rows_per_s']:,} rows/s, "
          f"peak RSS {result['peak_rss_gib']:.2f} GiB")
    print(f"  calibrate {result['calibrate_s']:.1f} s: span "
          f"{cal['throughput_span_orders']:.2f} orders, oracle ceiling "
          f"{cal['oracle_ceiling']:.3f}, observed pair share {cal['observed_pair_share']:.3f}")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    path = results / "bench_simulate.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
