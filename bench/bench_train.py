"""Nightly training on the default simulated fleet: time split, peak memory, accuracy, ablations.

Usage::

    python bench/bench_train.py [--home /tmp/leap-bench] [--no-ablations] [--no-next-night]

1. Simulates the default fleet (31 days x 25,000 attempts, seed 1) into ``--home`` unless it
   is already there.
2. Runs ``leap train --as-of 2026-01-31 --window-days 30 --json`` in a subprocess (train on
   days 1-30, evaluate on day 31) with nothing kept from an earlier night (a first night),
   and reports its wall time split, peak RSS, the held-out accuracy table and the
   simulator's oracle ceiling. Then the same night as a nightly run meets it: after the
   night before (2026-01-30, a dry run) has kept its encoded days and pair models in
   ``<home>/cache``; its held-out figures must be the ones of the first night
   (``--no-next-night`` skips this).
3. Loads the published artifact and times scoring one job on 20 candidate types.
4. Ablations on the same day, sharing one encoded training set: single global model vs the
   cascade, no history features, mean (L2) vs median objective.

Prints every figure and writes ``bench/results/bench_train.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from leap import metrics
from leap.catalog import Catalog
from leap.data.store import Store
from leap.eval.alternatives import without_history
from leap.features.columns import Columns
from leap.features.encode import base_margin
from leap.model.artifact import Registry
from leap.model.train import evaluate, family_seen, fit_model
from leap.model.window import (
    TrainConfig,
    TrainingSet,
    build_training_set,
    load_attempts,
)

AS_OF = datetime(2026, 1, 31, tzinfo=UTC)
OUT = Path(__file__).parent / "results" / "bench_train.json"


def leap(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "leap", "--home", str(home), *args],
                          capture_output=True, text=True, check=True)


def ensure_fleet(home: Path) -> None:
    if (home / "leap.duckdb").exists():
        with Store(home / "leap.duckdb", read_only=True) as store:
            if store.count() >= 700_000:
                return
    t0 = time.perf_counter()
    leap(home, "simulate", "--days", "31", "--seed", "1")
    print(f"simulated the default fleet in {time.perf_counter() - t0:.1f}s")


def timed_train(home: Path, as_of: str, *flags: str) -> tuple[float, dict[str, Any]]:
    """Wall seconds and JSON of ``leap train --as-of AS_OF --window-days 30 --json``."""
    t0 = time.perf_counter()
    proc = leap(home, "train", "--as-of", as_of, "--window-days", "30", "--json", *flags)
    return time.perf_counter() - t0, json.loads(proc.stdout)


def next_night(home: Path, first: dict[str, Any]) -> dict[str, Any]:
    """The 2026-01-31 night (a dry run) after the night before kept its days and models."""
    shutil.rmtree(home / "cache", ignore_errors=True)
    before_s, _ = timed_train(home, "2026-01-30", "--dry-run")
    wall, out = timed_train(home, AS_OF.date().isoformat(), "--dry-run")
    same = out["metrics"]["held_out"] == first["metrics"]["held_out"]
    print(f"the next night (after 2026-01-30's run, {before_s:.0f}s, kept its work): "
          f"{wall:.0f}s wall; held-out figures {'the same' if same else 'DIFFERENT'}")
    print("  split: " + ", ".join(f"{k} {v:.1f}" for k, v in out["timings_s"].items()))
    if not same:
        raise SystemExit("what the night read from the cache changed its model")
    return {"night_before_wall_s": before_s, "wall_s": wall, "timings_s": out["timings_s"],
            "same_held_out": same}


def scoring_latency(home: Path) -> dict[str, float]:
    art = Registry(home / "models").load()
    with Store(home / "leap.duckdb", read_only=True) as store:
        day = load_attempts(store, AS_OF, AS_OF + timedelta(days=1)).head(200)
    hardware = art.catalog.names[:20]
    jobs = [{k: (None if v != v else v) for k, v in row.items()}
            for row in day.drop(columns=["hardware"]).to_dict("records")]
    art.predict(Columns.from_request(jobs[0], hardware))  # warm caches
    times = []
    for job in jobs:
        t0 = time.perf_counter()
        art.predict(Columns.from_request(job, hardware))
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    return {"jobs": len(ms), "candidates": len(hardware), "p50_ms": float(np.median(ms)),
            "p99_ms": float(np.percentile(ms, 99))}


def without_masked(ts: TrainingSet) -> TrainingSet:
    """The training set as before transfer learning: no rows with masked pair history."""
    keep = ~ts.masked
    return replace(ts, X=ts.X[keep], y=ts.y[keep], day=ts.day[keep], group=ts.group[keep],
                   masked=ts.masked[keep])


def ablations(home: Path) -> dict[str, dict[str, float]]:
    catalog = Catalog.default()
    base_cfg = TrainConfig()
    with Store(home / "leap.duckdb", read_only=True) as store:
        attempts = load_attempts(store, AS_OF - timedelta(days=60), AS_OF + timedelta(days=1))
    ts = build_training_set(attempts, catalog, AS_OF, base_cfg)
    seen = family_seen(ts.serving_snapshot, ts.eval_jobs)
    variants = {
        "cascade + transfer model (default)": (ts, base_cfg),
        "cascade alone, no masked rows": (without_masked(ts), base_cfg),
        "global model (median)": (ts, replace(base_cfg, model_kind="global")),
        "cascade, mean (L2) objective": (ts, replace(base_cfg, objective="l2")),
        "cascade, no history features": (without_history(ts), base_cfg),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (t, cfg) in variants.items():
        t0 = time.perf_counter()
        model = fit_model(t, cfg)
        fit_s = time.perf_counter() - t0
        pred = model.predict(t.eval_X, base=base_margin(t.eval_X, t.spec, t.fallback_log_tp))
        res = evaluate(pred, t.eval_jobs, seen, AS_OF.date().isoformat())
        masked = float("nan")
        if "fam_hw_n" in t.spec.names and len(t.eval_masked_rows):
            # The held-out day's attempts with their own pair history masked.
            xm = ts.eval_masked_X[:, [list(ts.spec.names).index(n) for n in t.spec.names]]
            pm = model.predict(xm, base=base_margin(xm, t.spec, t.fallback_log_tp))
            masked = metrics.accuracy(np.exp(pm), ts.eval_jobs["throughput"].to_numpy()[
                ts.eval_masked_rows])
        gpu_h = float("nan") if res.accuracy_gpu_hours is None else res.accuracy_gpu_hours
        out[name] = {"accuracy": res.accuracy, "accuracy_gpu_hours": gpu_h,
                     "median_ape": res.median_ape,
                     "unseen_families_accuracy": res.unseen_families.accuracy,
                     "masked_pairs_accuracy": masked, "fit_s": fit_s}
        print(f"  {name:<36} acc {res.accuracy:.3f}  GPU-h {gpu_h:.3f}"
              f"  MdAPE {res.median_ape:.3f}  unseen {res.unseen_families.accuracy:.3f}"
              f"  masked pairs {masked:.3f}  fit {fit_s:.0f}s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=Path("/tmp/leap-bench"))
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--no-next-night", action="store_true")
    args = ap.parse_args()
    home: Path = args.home
    ensure_fleet(home)

    shutil.rmtree(home / "cache", ignore_errors=True)  # a first night
    wall, trained = timed_train(home, AS_OF.date().isoformat(), "--force")
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    held = trained["metrics"]["held_out"]
    print(f"nightly training: {wall:.0f}s wall (process), peak RSS {peak_gib:.2f} GiB")
    print("  split: " + ", ".join(f"{k} {v:.1f}" for k, v in trained["timings_s"].items()))
    print(f"  held-out day {held['day']}: accuracy {held['accuracy']:.3f} "
          f"(oracle ceiling {held.get('oracle_ceiling', float('nan')):.3f}), GPU-hour "
          f"weighted {held['accuracy_gpu_hours']:.3f}, MdAPE {held['median_ape']:.3f}")
    print(f"  seen families {held['seen_families']['accuracy']:.3f} "
          f"(n={held['seen_families']['n']:.0f}), unseen families "
          f"{held['unseen_families']['accuracy']:.3f} (n={held['unseen_families']['n']:.0f})")
    for kind, key in (("as they came", "novelty"), ("own pair history masked", "masked_pairs")):
        print(f"  by novelty, {kind}: " + ", ".join(
            f"{g} {v['accuracy']:.3f} (n={v['n']:.0f}, 80% interval covers "
            f"{v.get('interval_coverage', float('nan')):.2f})"
            for g, v in held.get(key, {}).items()))
    latency = scoring_latency(home)
    print(f"scoring one job on {latency['candidates']} types: p50 {latency['p50_ms']:.2f} ms, "
          f"p99 {latency['p99_ms']:.2f} ms")
    result = {"train_wall_s": wall, "train_peak_rss_gib": peak_gib, "train": trained,
              "scoring": latency}
    if not args.no_next_night:
        result["next_night"] = next_night(home, trained)
    if not args.no_ablations:
        print("ablations (same held-out day, one shared training set):")
        result["ablations"] = ablations(home)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
