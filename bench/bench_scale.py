"""Nightly training and serving as the fleet grows: time and memory per stage at 1x, 2x, 4x.

Usage::

    python bench/bench_scale.py [--base /tmp/leap-scale] [--sizes 1 2 4] [--big]

For each size k (``--big`` adds 10) it:

1. simulates 31 days of the default fleet at k x 25,000 attempts a day (seed 1) into
   ``<base>/<k>x`` unless that store is already there;
2. runs ``leap train --as-of 2026-01-31`` in a fresh process and reads back its stage
   timings, training rows and peak RSS (the process's own ``ru_maxrss``);
3. in another fresh process, loads the published model (load time, RSS after load) and ranks
   300 of the held-out day's jobs on 20 types (p50 / p99 latency, warm).

Then it prints a table and the growth exponent of each figure against the training rows
between the smallest and the largest size (``log(t_k / t_1) / log(rows_k / rows_1)``: 1.0 is
linear). Writes ``bench/results/bench_scale.json``. Run it alone: the sizes are timed one
after the other, and anything else on the machine moves the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DAY_ATTEMPTS = 25_000
AS_OF = "2026-01-31"
OUT = Path(__file__).parent / "results" / "bench_scale.json"

# Runs `leap` in this process; reports its peak RSS and an RSS sample every 0.5 s (seconds
# since start, MiB) on stderr's last line.
_TRAIN = """
import json, os, resource, runpy, sys, threading, time
sys.argv = ["leap", *sys.argv[1:]]
samples, t0, page = [], time.perf_counter(), os.sysconf("SC_PAGE_SIZE")
def sample():
    while True:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page / 2**20
        samples.append((round(time.perf_counter() - t0, 2), round(rss)))
        time.sleep(0.5)
threading.Thread(target=sample, daemon=True).start()
code = 0
try:
    runpy.run_module("leap", run_name="__main__")
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps({"peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "samples": samples}), file=sys.stderr)
sys.exit(code)
"""

# Loads the published model and ranks held-out jobs on 20 types; prints one JSON line.
_SERVE = """
import json, resource, sys, time
from datetime import UTC, datetime, timedelta
from pathlib import Path
import numpy as np

home = Path(sys.argv[1])
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from leap.data.store import Store
from leap.model.artifact import Registry
from leap.model.window import load_attempts
from leap.rank.ranker import Ranker

as_of = datetime.fromisoformat(sys.argv[2]).replace(tzinfo=UTC)
with Store(home / "leap.duckdb", read_only=True) as store:
    day = load_attempts(store, as_of, as_of + timedelta(days=1)).head(400)
rss_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
ranker = Ranker(Registry(home / "models"), background_reload=False, compiled=False)
serving = ranker.serving
load_s = time.perf_counter() - t0
rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
names = serving.artifact.catalog.names[:20]
jobs = [{k: (None if v != v else v) for k, v in row.items()}
        for row in day.drop(columns=["hardware"]).to_dict("records")]
for job in jobs[:100]:
    ranker.rank(job, names)
times = []
for job in jobs[100:]:
    t = time.perf_counter()
    ranker.rank(job, names)
    times.append(time.perf_counter() - t)
ms = np.array(times) * 1e3
size = sum(p.stat().st_size for p in Path(serving.artifact.path).rglob("*") if p.is_file())
print(json.dumps({"load_s": load_s, "rss_after_load_mb": rss_loaded / 1024,
                  "model_rss_mb": (rss_loaded - rss_imports) / 1024,
                  "artifact_mb": size / 2**20, "rank_jobs": len(ms),
                  "rank_p50_ms": float(np.median(ms)), "rank_p99_ms": float(np.percentile(ms, 99)),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    return proc


def ensure_fleet(home: Path, per_day: int) -> float | None:
    """Simulate the fleet into ``home`` unless it is there; the seconds it took, or None."""
    if (home / "leap.duckdb").exists():
        return None
    t0 = time.perf_counter()
    run([sys.executable, "-m", "leap", "--home", str(home), "simulate", "--days", "31",
         "--seed", "1", "--attempts-per-day", str(per_day)])
    return time.perf_counter() - t0


def train(home: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = run([sys.executable, "-c", _TRAIN, "--home", str(home), "train", "--as-of", AS_OF,
                "--force", "--json"])
    wall = time.perf_counter() - t0
    # The result is the JSON object `--json` prints; anything a native library writes to
    # stdout around it (seen once at 4x) is skipped, and kept beside the results to read.
    start = proc.stdout.find("{\n")
    if start < 0:
        raise SystemExit(f"no JSON result from the training of {home}:\n{proc.stdout[-2000:]}")
    if proc.stdout[:start].strip() or proc.stdout[start:].count("\n}\n") != 1:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        (OUT.parent / f"bench_scale_{home.name}_stdout.txt").write_text(proc.stdout)
    result, _ = json.JSONDecoder().raw_decode(proc.stdout, start)
    mem = json.loads(proc.stderr.strip().splitlines()[-1])
    t = result["timings_s"]
    # Stages run in this order; the fit starts after loading, history and features.
    fit_at = t["load_s"] + t["history_prepare_s"] + t["snapshot_s"] + t["features_s"]
    before = [rss for at, rss in mem["samples"] if at < fit_at] or [0]
    held = result["metrics"].get("held_out", {})
    return {"wall_s": wall, "peak_rss_gib": mem["peak_rss_kb"] / 2**20,
            "peak_rss_features_gib": max(before) / 1024,
            "train_rows": result["metrics"]["train_rows"],
            "masked_train_rows": result["metrics"]["masked_train_rows"],
            "accuracy": held.get("accuracy"), **result["timings_s"]}


def serve(home: Path) -> dict[str, Any]:
    proc = run([sys.executable, "-c", _SERVE, str(home), AS_OF])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exponent(a: float, b: float, rows_a: float, rows_b: float) -> float:
    if a <= 0 or b <= 0 or rows_b <= rows_a:
        return float("nan")
    return math.log(b / a) / math.log(rows_b / rows_a)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, default=Path("/tmp/leap-scale"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--big", action="store_true", help="add the 10x fleet (250,000 a day)")
    args = ap.parse_args()
    sizes = sorted(set(args.sizes) | ({10} if args.big else set()))

    rows: dict[str, dict[str, Any]] = {}
    for k in sizes:
        home = args.base / f"{k}x"
        sim_s = ensure_fleet(home, k * DAY_ATTEMPTS)
        if sim_s is not None:
            print(f"{k}x: simulated {k * DAY_ATTEMPTS:,} attempts a day in {sim_s:.0f} s",
                  flush=True)
        fig = train(home)
        fig.update({f"serve_{name}": v for name, v in serve(home).items()})
        rows[f"{k}x"] = fig
        print(f"{k}x: {fig['train_rows']:,} training rows ({fig['masked_train_rows']:,} "
              f"masked): wall {fig['wall_s']:.0f} s (snapshots {fig['snapshot_s']:.0f}, "
              f"features {fig['features_s']:.0f}, fit {fig['fit_s']:.0f}), peak RSS "
              f"{fig['peak_rss_gib']:.2f} GiB ({fig['peak_rss_features_gib']:.2f} before the "
              f"fit), accuracy {fig['accuracy']:.3f}; serving: load "
              f"{fig['serve_load_s']:.1f} s, +{fig['serve_model_rss_mb']:.0f} MB, rank p50 "
              f"{fig['serve_rank_p50_ms']:.2f} ms p99 {fig['serve_rank_p99_ms']:.2f} ms",
              flush=True)

    first, last = rows[f"{sizes[0]}x"], rows[f"{sizes[-1]}x"]
    keys = ("wall_s", "snapshot_s", "features_s", "fit_s", "peak_rss_gib", "serve_load_s",
            "serve_model_rss_mb", "serve_rank_p99_ms")
    growth = {key: exponent(first[key], last[key], first["train_rows"], last["train_rows"])
              for key in keys}
    per_million = {k: v["peak_rss_gib"] / (v["train_rows"] / 1e6) for k, v in rows.items()}
    print(f"growth exponent {sizes[0]}x -> {sizes[-1]}x against training rows (1.0 = linear): "
          + ", ".join(f"{key} {v:.2f}" for key, v in growth.items()))
    print("peak RSS per million training rows: "
          + ", ".join(f"{k} {v:.2f} GiB" for k, v in per_million.items()))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"as_of": AS_OF, "machine": platform.platform(),
                               "sizes": rows, "growth_exponent": growth,
                               "peak_rss_gib_per_million_rows": per_million}, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
