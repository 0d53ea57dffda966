"""Nightly training on a 2-worker Dask LocalCluster beside the one-machine run, same window.

Usage::

    python bench/bench_dask_train.py [--home /tmp/leap-bench] [--workers 2] [--seeds 0 1]

1. Simulates the default fleet (31 days x 25,000 attempts, seed 1) into ``--home`` unless it
   is there.
2. Trains on days 1-30 and evaluates on day 31 (nothing is published), each run in a fresh
   process: on one machine for each of ``--seeds`` (their spread is the yardstick for "the
   same accuracy"), then on the Dask LocalCluster with the first seed.
3. For each run: wall time, stage times, held-out accuracy, training rows, and peak RSS of
   the whole process tree (the client and every Dask worker, sampled every 0.5 s) and of
   its largest process.

Prints a table and writes ``bench/results/bench_dask_train.json``. Run it alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

AS_OF = "2026-01-31"
OUT = Path(__file__).parent / "results" / "bench_dask_train.json"


def one(home: Path, seed: int, dask: str | None, workers: int) -> None:
    """Child mode: one training run, its result as a JSON line on stdout."""
    from contextlib import ExitStack
    from datetime import UTC, datetime

    from leap.catalog import Catalog
    from leap.config import Workspace
    from leap.data.store import Store
    from leap.model.artifact import Registry
    from leap.model.train import train_nightly
    from leap.model.window import TrainConfig

    ws = Workspace(home)
    as_of = datetime.fromisoformat(AS_OF).replace(tzinfo=UTC)
    with Store(ws.store_path, read_only=True) as store, ExitStack() as stack:
        client = None
        if dask:
            from leap.model.distributed import dask_client

            client = stack.enter_context(dask_client(dask, workers))
        res = train_nightly(store, Catalog.load(ws.catalog_path), Registry(ws.models_dir),
                            as_of=as_of, cfg=TrainConfig(seed=seed), publish=False,
                            dask_client=client)
    held = res.metrics.held_out
    print(json.dumps({"accuracy": held.accuracy if held is not None else None,
                      "train_rows": res.metrics.train_rows,
                      "timings_s": res.timings}))


def measured(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``; its JSON line plus wall time and the process tree's peak RSS."""
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak_tree = peak_one = 0
    while proc.poll() is None:
        procs = [proc, *proc.children(recursive=True)]
        rss = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss.append(p.memory_info().rss)
        peak_tree, peak_one = max(peak_tree, sum(rss)), max(peak_one, max(rss, default=0))
        time.sleep(0.5)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "wall_s": time.perf_counter() - t0,
            "peak_rss_tree_gib": peak_tree / 2**30, "peak_rss_largest_gib": peak_one / 2**30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", type=Path, default=Path("/tmp/leap-bench"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--one", choices=["local", "dask"], help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args.home, args.seed, "local" if args.one == "dask" else None, args.workers)
        return
    if not (args.home / "leap.duckdb").exists():
        subprocess.run([sys.executable, "-m", "leap", "--home", str(args.home), "simulate",
                        "--days", "31", "--seed", "1"], check=True)
    me = [sys.executable, __file__, "--home", str(args.home), "--workers", str(args.workers)]
    runs: dict[str, dict[str, Any]] = {}
    for seed in args.seeds:
        runs[f"local seed {seed}"] = measured([*me, "--one", "local", "--seed", str(seed)])
    runs[f"dask {args.workers} workers seed {args.seeds[0]}"] = measured(
        [*me, "--one", "dask", "--seed", str(args.seeds[0])])
    local = [r["accuracy"] for k, r in runs.items() if k.startswith("local")]
    dask_acc = runs[f"dask {args.workers} workers seed {args.seeds[0]}"]["accuracy"]
    summary = {"seed_spread_points": 100 * (max(local) - min(local)),
               "dask_minus_local_same_seed_points": 100 * (dask_acc - local[0])}
    print(f"{'run':<26} {'accuracy':>8} {'rows':>9} {'wall s':>7} {'fit s':>6} "
          f"{'tree GiB':>8} {'largest':>7}")
    for name, r in runs.items():
        print(f"{name:<26} {100 * r['accuracy']:>7.2f}% {r['train_rows']:>9,} "
              f"{r['wall_s']:>7.0f} {r['timings_s'].get('fit_s', float('nan')):>6.0f} "
              f"{r['peak_rss_tree_gib']:>8.2f} {r['peak_rss_largest_gib']:>7.2f}")
    print(f"seed-to-seed spread {summary['seed_spread_points']:.2f} points; "
          f"Dask - one machine (same seed) {summary['dask_minus_local_same_seed_points']:+.2f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"as_of": AS_OF, "home": str(args.home), "runs": runs,
                               **summary}, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
