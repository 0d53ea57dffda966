"""Benchmark: batch prediction of 100,000 (job, hardware) rows, in rows per second.

5,000 recent jobs of the bench store, each on the 20 candidate types of bench_rank.py, scored
through :meth:`leap.rank.ranker.Ranker.predict` (what ``POST /v1/predict`` and
``leap predict`` run: check the jobs, lay out jobs x candidates, encode, predict). Also times
the encode and the model alone on the same rows, to show where the time goes. Prints the
figures and writes bench/results/bench_predict.json.

In one run it scores the rows with LightGBM and with compiled trees (:mod:`leap.model.compiled`,
compiled once and cached beside the artifact, so ``--home`` must be writable), checks the two
agree within 1e-9 relative, and times the encode (on ``BATCH_THREADS``, as predict runs it) and
the model apart. Target (issue 15): 200,000 rows/s.

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
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rank import CANDIDATES, bench_workspace, recent_jobs, write_result

TARGET_ROWS_PER_S = 200_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=None, help="workspace with a published model")
    ap.add_argument("--jobs", type=int, default=5000, help="jobs (x 20 types = rows)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from leap.features.encode import jobs_frame
    from leap.model.artifact import Registry
    from leap.model.predict import BATCH_THREADS, batch_columns, candidate_rows
    from leap.rank.ranker import Ranker

    home = bench_workspace(args.home)
    pool = recent_jobs(home, args.jobs)
    jobs = [pool[i % len(pool)] for i in range(args.jobs)]
    rows = len(jobs) * len(CANDIDATES)
    jobs_df = jobs_frame(jobs)
    job, hardware = candidate_rows(jobs_df, CANDIDATES)
    out: dict[str, Any] = {"bench": "predict", "at": datetime.now(UTC).isoformat(),
                           "machine": platform.machine(), "cpus": os.cpu_count(), "rows": rows,
                           "jobs": len(jobs), "candidates": len(CANDIDATES),
                           "encode_threads": BATCH_THREADS}
    preds: dict[str, np.ndarray] = {}
    for name, mode in (("lightgbm", False), ("compiled", True)):
        ranker = Ranker(Registry(home / "models"), background_reload=False, compiled=False)
        serving = ranker.serving
        if serving is None:
            raise SystemExit(f"no model: {ranker.watcher.error}")
        if mode:
            from leap.model.compiled import compile_artifact

            if compile_artifact(serving.artifact, build=True) != "compiled":
                raise SystemExit(f"not compiled: {serving.artifact.extra['scoring']}")
        full_s: list[float] = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = ranker.predict(jobs, CANDIDATES, strict=True)
            full_s.append(time.perf_counter() - t0)
            if result.reason is not None or len(result.frame) != rows:
                raise SystemExit(f"prediction failed: {result.reason}")
        preds[name] = result.frame["predicted_throughput"].to_numpy()
        enc_s, model_s = [], []
        art = serving.artifact
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            # As predict encodes: fresh columns (their per-job values are kept in them).
            X = art.encode_full(batch_columns(jobs_df, job, hardware), BATCH_THREADS)
            t1 = time.perf_counter()
            art.predict_encoded(X)
            enc_s.append(t1 - t0)
            model_s.append(time.perf_counter() - t1)
        best = min(full_s)
        out[name] = {"ranker_predict_s": full_s, "ranker_rows_per_s": rows / best,
                     "encode_s": min(enc_s), "model_s": min(model_s),
                     "model_rows_per_s": rows / min(model_s)}
        print(f"{name:>9}: Ranker.predict of {rows:,} rows ({len(jobs):,} jobs x "
              f"{len(CANDIDATES)} types), best of {args.repeat}: {best:.2f} s = "
              f"{rows / best:,.0f} rows/s (encode {min(enc_s):.2f} s, model "
              f"{min(model_s):.2f} s = {rows / min(model_s):,.0f} rows/s)")
        out["model_version"] = serving.version
    diff = float(np.max(np.abs(preds["compiled"] - preds["lightgbm"]) / preds["lightgbm"]))
    out["max_rel_diff"] = diff
    out["target_rows_per_s"] = TARGET_ROWS_PER_S
    out["target_met"] = out["compiled"]["ranker_rows_per_s"] >= TARGET_ROWS_PER_S
    out["load_avg_1m"] = os.getloadavg()[0]
    print(f"compiled vs LightGBM: max relative difference {diff:.2e}; target "
          f"{TARGET_ROWS_PER_S:,} rows/s: {'met' if out['target_met'] else 'MISSED'} (load "
          f"average {out['load_avg_1m']:.2f} on {os.cpu_count()} cores)")
    write_result("bench_predict", out)


if __name__ == "__main__":
    main()
