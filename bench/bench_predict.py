"""Benchmark: batch prediction of 100,000 (job, hardware) rows, in rows per second.

5,000 recent jobs of the bench store, each on the 20 candidate types of bench_rank.py, scored
through :meth:`leap.rank.ranker.Ranker.predict` (what ``POST /v1/predict`` and
``leap predict`` run: expand jobs x candidates, encode, predict). Also times the model alone
on the same rows, already in a frame, to show where the time goes. Prints the figures and
writes bench/results/bench_predict.json.

    python bench/bench_predict.py [--home DIR] [--jobs 5000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rank import CANDIDATES, bench_workspace, recent_jobs, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None, help="workspace with a published model")
    ap.add_argument("--jobs", type=int, default=5000, help="jobs (x 20 types = rows)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from leap.features.encode import jobs_frame
    from leap.model.artifact import Registry
    from leap.model.predict import expand_candidates
    from leap.rank.ranker import Ranker

    home = bench_workspace(args.home)
    ranker = Ranker(Registry(home / "models"), background_reload=False)
    serving = ranker.serving
    if serving is None:
        raise SystemExit(f"no model: {ranker.watcher.error}")
    pool = recent_jobs(home, args.jobs)
    jobs = [pool[i % len(pool)] for i in range(args.jobs)]
    rows = len(jobs) * len(CANDIDATES)

    full_s: list[float] = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = ranker.predict(jobs, CANDIDATES, strict=True)
        full_s.append(time.perf_counter() - t0)
        if result.reason is not None or len(result.frame) != rows:
            raise SystemExit(f"prediction failed: {result.reason}")
    frame = expand_candidates(jobs_frame(jobs), CANDIDATES)
    model_s: list[float] = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        pred = serving.artifact.predict(frame)
        model_s.append(time.perf_counter() - t0)
    assert np.all(np.isfinite(pred))
    best, best_model = min(full_s), min(model_s)
    print(f"batch prediction, {rows:,} rows ({len(jobs):,} jobs x {len(CANDIDATES)} types), "
          f"model {serving.version} ({serving.artifact.model.kind}), best of {args.repeat}:")
    print(f"  Ranker.predict (records -> rows -> encode -> model): {best:.2f} s = "
          f"{rows / best:,.0f} rows/s")
    print(f"  encode + model on a ready frame                      : {best_model:.2f} s = "
          f"{rows / best_model:,.0f} rows/s")
    out = {"bench": "predict", "at": datetime.now(UTC).isoformat(),
           "machine": platform.machine(), "cpus": os.cpu_count(),
           "load_avg_1m": os.getloadavg()[0], "rows": rows, "jobs": len(jobs),
           "candidates": len(CANDIDATES), "model_version": serving.version,
           "ranker_predict_s": full_s, "ranker_rows_per_s": rows / best,
           "artifact_predict_s": model_s, "artifact_rows_per_s": rows / best_model}
    write_result("bench_predict", out)


if __name__ == "__main__":
    main()
