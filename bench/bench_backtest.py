"""Benchmark: the 30-night backtest on a default simulated fleet, and serial vs Dask speed-up.

``full`` (default): simulates the default fleet (25,000 attempts/day, seed 1) for
``--days`` days into ``--home`` if it has no store, then runs ``leap backtest`` there in a
child process (so its peak RSS is its own) from scratch (the run's night files are removed
first unless ``--resume``). Target (issue 5): under 60 minutes on the 2-core dev machine.

``compare``: a small backtest (``--nights`` on a ``--window-days`` window) run serially and on
a Dask LocalCluster of ``--workers`` processes, each from scratch; reports the speed-up and
checks the night results are identical.

Prints the figures and writes bench/results/bench_backtest[_compare].json.

    python bench/bench_backtest.py --home /tmp/leap-bt --days 90 --nights 30
    python bench/bench_backtest.py compare --home /tmp/leap-bt --nights 4 --window-days 7 \\
        --model global --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TARGET_S = 3600.0
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "load_average": os.getloadavg()}


def ensure_store(home: Path, days: int, seed: int) -> None:
    if (home / "leap.duckdb").exists():
        return
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "leap", "--home", str(home), "simulate", "--days",
                    str(days), "--seed", str(seed)], check=True)
    print(f"simulated {days} days into {home} in {time.perf_counter() - t0:.0f} s")


def run_dir(home: Path, args: argparse.Namespace, window_days: int) -> Path:
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.backtest import run_key
    from leap.model.window import TrainConfig

    cfg = TrainConfig(window_days=window_days, model_kind=args.model,
                      n_specialists=args.specialists)
    with Store(home / "leap.duckdb", read_only=True) as store:
        key, _ = run_key(store, Catalog.default(), cfg)
    return home / "work" / f"backtest-{key}"


def backtest(home: Path, args: argparse.Namespace, *, nights: int, window_days: int,
             extra: list[str], fresh: bool) -> dict[str, Any]:
    """Run `leap backtest --json` in a child; wall time, the child's peak RSS, its result."""
    directory = run_dir(home, args, window_days)
    oversubscribed = "--workers" in extra and int(extra[extra.index("--workers") + 1]) > 1
    if fresh and directory.exists():
        shutil.rmtree(directory)
    cmd = [sys.executable, "-m", "leap", "--home", str(home), "backtest", "--nights",
           str(nights), "--window-days", str(window_days), "--model", args.model,
           "--specialists", str(args.specialists), "--json", *extra]
    # Passive OpenMP waits when processes share the cores (compare mode): LightGBM's spinning
    # threads otherwise burn the CPU another process needs (measured: ~4x less CPU for the
    # same small fits). Alone on a quiet machine, passive waits slow a fit (~2x measured), so
    # the full run keeps the environment's policy.
    env = dict(os.environ)
    if oversubscribed:
        env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"backtest failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout)
    return {"command": " ".join(cmd[1:]), "omp_wait_policy": env.get("OMP_WAIT_POLICY"),
            "wall_s": wall,
            "child_cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime
                                                                   - before.ru_stime),
            # ru_maxrss of children is the largest child's peak (KiB on Linux).
            "peak_rss_gib": after.ru_maxrss / 2**20, "result": result}


def night_stats(result: dict[str, Any]) -> dict[str, Any]:
    nights = result["nights"]
    timing = [n.get("timings_s", {}) for n in nights]

    def med(key: str) -> float | None:
        vals = sorted(t[key] for t in timing if key in t)
        return vals[len(vals) // 2] if vals else None

    return {"nights": len(nights), "computed": len(result["computed"]),
            "median_night_s": med("night_s"), "median_fit_s": med("fit_s"),
            "median_features_s": med("features_s"), "median_load_s": med("load_s"),
            "sum_night_s": sum(t.get("night_s", 0.0) for t in timing),
            "train_rows_median": sorted(n["train_rows"] for n in nights)[len(nights) // 2]}


def full(args: argparse.Namespace) -> None:
    home = Path(args.home)
    ensure_store(home, args.days, args.seed)
    extra = ["--workers", str(args.workers)] if args.workers else []
    run = backtest(home, args, nights=args.nights, window_days=args.window_days, extra=extra,
                   fresh=not args.resume)
    s = run["result"]["summary"]
    report = {
        "benchmark": "backtest", "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(), "home": str(home), "days_simulated": args.days,
        "nights": args.nights, "window_days": args.window_days, "model": args.model,
        "specialists": args.specialists, "command": run["command"],
        "omp_wait_policy": run["omp_wait_policy"], "load_average_after": os.getloadavg(),
        "wall_s": run["wall_s"], "child_cpu_s": run["child_cpu_s"],
        "peak_rss_gib": run["peak_rss_gib"], "target_s": TARGET_S,
        "meets_target": run["wall_s"] < TARGET_S, **night_stats(run["result"]),
        "accuracy": s["accuracy"], "accuracy_gpu_hours": s["accuracy_gpu_hours"],
        "oracle_ceiling": s["oracle_ceiling"], "run_dir": run["result"]["run_dir"],
        "note": "wall time covers only the nights computed in this run (see 'computed')",
    }
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_backtest.json").write_text(json.dumps(report, indent=2) + "\n")


def compare(args: argparse.Namespace) -> None:
    from leap.eval.backtest import comparable

    home = Path(args.home)
    ensure_store(home, args.days, args.seed)
    serial = backtest(home, args, nights=args.nights, window_days=args.window_days,
                      extra=["--workers", "1"], fresh=True)
    dask = backtest(home, args, nights=args.nights, window_days=args.window_days,
                    extra=["--workers", str(args.workers), "--dask", "local"], fresh=True)
    procs = backtest(home, args, nights=args.nights, window_days=args.window_days,
                     extra=["--workers", str(args.workers)], fresh=True)
    same = all([comparable(a) == comparable(b) == comparable(c) for a, b, c in zip(
        serial["result"]["nights"], dask["result"]["nights"], procs["result"]["nights"],
        strict=True)])
    report = {
        "benchmark": "backtest-compare", "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(), "nights": args.nights, "window_days": args.window_days,
        "model": args.model, "workers": args.workers,
        "serial": {k: serial[k] for k in ("command", "wall_s", "child_cpu_s", "peak_rss_gib")}
        | night_stats(serial["result"]),
        "dask_local": {k: dask[k] for k in ("command", "wall_s", "child_cpu_s",
                                            "peak_rss_gib")} | night_stats(dask["result"]),
        "processes": {k: procs[k] for k in ("command", "wall_s", "child_cpu_s",
                                            "peak_rss_gib")} | night_stats(procs["result"]),
        "speedup_dask_over_serial": serial["wall_s"] / dask["wall_s"],
        "speedup_processes_over_serial": serial["wall_s"] / procs["wall_s"],
        "identical_results": same,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_backtest_compare.json").write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("mode", nargs="?", default="full", choices=["full", "compare"])
    ap.add_argument("--home", default="/tmp/leap-bench-backtest")
    ap.add_argument("--days", type=int, default=90, help="Days to simulate if no store.")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--window-days", type=int, default=30)
    ap.add_argument("--model", default="cascade")
    ap.add_argument("--specialists", type=int, default=13)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--resume", action="store_true", help="Keep finished nights (full mode).")
    args = ap.parse_args()
    if args.mode == "compare" and not args.workers:
        args.workers = 2
    (compare if args.mode == "compare" else full)(args)


if __name__ == "__main__":
    main()
