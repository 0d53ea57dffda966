"""Benchmark: the impact study over several seeds and days, with its spread and runtime.

Per seed: a simulated store (cached under bench/results/ws-impact-<per_day>x<days>-s<seed>),
a model trained on the window before the held-out day and published there (once), then
``leap experiment impact --days N --json``. Reports, per seed and across seeds (min, median,
max): the LP optimum's saving against no advice, each arm's saving and its share of the
optimum's, the first-choice shares and coverage beside the paper's, and the cost change split
by placement kind; and the study's runtime. Writes bench/results/bench_impact.json.

    python bench/bench_impact.py [--seeds 2 3 4] [--per-day 5000] [--days 3] [--history 33]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from bench_rank import RESULTS, write_result

START = datetime(2026, 1, 1, tzinfo=UTC)
ARMS = ("leap", "leap_aware", "greedy_oracle")


def leap(home: Path, *args: str) -> str:
    """Run ``python -m leap --home HOME ARGS`` and return its stdout (raise on failure)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    out = subprocess.run([sys.executable, "-m", "leap", "--home", str(home), *args],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"leap {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def one_seed(seed: int, per_day: int, days: int, history: int) -> dict[str, Any]:
    home = RESULTS / f"ws-impact-{per_day}x{history + days}-s{seed}"
    as_of = (START + timedelta(days=history)).date().isoformat()
    leap(home, "simulate", "--days", str(history + days), "--seed", str(seed),
         "--attempts-per-day", str(per_day))
    if not (home / "models" / "LATEST").is_file():
        t0 = time.perf_counter()
        leap(home, "train", "--as-of", as_of, "--force")
        print(f"seed {seed}: trained in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    study = json.loads(leap(home, "experiment", "impact", "--as-of", as_of, "--days",
                            str(days), "--json"))
    wall = time.perf_counter() - t0
    hl = study["headline"]
    out: dict[str, Any] = {
        "seed": seed, "days": study["days"], "n_attempts": study["n_attempts"],
        "model": study["model"], "study_wall_s": study["wall_s"], "command_wall_s": wall,
        "optimum_saving": hl["optimum_saving"],
        "optimum_within_budget_saving": hl["optimum_within_budget_saving"],
        "coverage": hl["coverage"], "coverage_gpu_hours": hl["coverage_gpu_hours"],
        "arms": {name: {"cost_change": a["cost_change"],
                        "fleet_cost_change": a["fleet_cost_change"],
                        "trimmed_cost_change": a["trimmed"]["cost_change"],
                        "parts": a["parts"], "placement": a["placement"],
                        "first_choice_attempts": a["first_choice_attempts"],
                        "first_choice_gpu_hours": a["first_choice_gpu_hours"],
                        "per_day": a["per_day"]}
                 for name, a in study["arms"].items()},
    }
    for name in ARMS:
        out["arms"][name]["share_of_optimum"] = hl[name]["share_of_optimum"]
    return out


def spread(values: list[float]) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    return {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--per-day", type=int, default=5000, help="attempts per simulated day")
    ap.add_argument("--days", type=int, default=3, help="days replayed per seed")
    ap.add_argument("--name", default="bench_impact", help="result file name (without .json)")
    ap.add_argument("--history", type=int, default=33, help="days simulated before the first "
                    "replayed day (the model trains on the last 30)")
    args = ap.parse_args()
    runs = [one_seed(s, args.per_day, args.days, args.history) for s in args.seeds]
    for r in runs:
        arms = r["arms"]
        print(f"seed {r['seed']}: {r['n_attempts']:,} attempts over {len(r['days'])} days in "
              f"{r['study_wall_s']:.0f} s; optimum saves {100 * r['optimum_saving']:.1f}%; "
              + "; ".join(f"{n} saves {-100 * arms[n]['cost_change']:.1f}% "
                          f"({100 * arms[n]['share_of_optimum']:.0f}% of it)" for n in ARMS))
    per_day = {n: [d["cost_change"] for r in runs for d in r["arms"][n]["per_day"]]
               for n in [*ARMS, "optimum"]}
    summary = {
        "optimum_saving": spread([r["optimum_saving"] for r in runs]),
        "optimum_within_budget_saving": spread([r["optimum_within_budget_saving"]
                                                for r in runs]),
        "coverage": spread([r["coverage"] for r in runs]),
        **{f"{n}_saving": spread([-r["arms"][n]["cost_change"] for r in runs]) for n in ARMS},
        **{f"{n}_share_of_optimum": spread([r["arms"][n]["share_of_optimum"] for r in runs])
           for n in ARMS},
        **{f"{n}_first_choice_attempts": spread([r["arms"][n]["first_choice_attempts"]
                                                 for r in runs]) for n in ARMS},
        **{f"{n}_first_choice_gpu_hours": spread([r["arms"][n]["first_choice_gpu_hours"]
                                                  for r in runs]) for n in ARMS},
        "per_day_cost_change": {n: spread(v) for n, v in per_day.items()},
        "study_wall_s": spread([r["study_wall_s"] for r in runs]),
    }
    out = {"what": "impact study across seeds", "per_day": args.per_day,
           "days_replayed": args.days, "history_days": args.history, "seeds": args.seeds,
           "paper": {"coverage": 0.95, "first_choice_attempts": 0.199,
                     "first_choice_gpu_hours": 0.300, "cost_saving": 0.03},
           "summary": summary, "runs": runs,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "load_avg_1m": os.getloadavg()[0]}}
    s = summary
    print(f"savings across seeds (min/median/max): optimum "
          f"{s['optimum_saving']['min']:.1%}/{s['optimum_saving']['median']:.1%}/"
          f"{s['optimum_saving']['max']:.1%}; leap "
          f"{s['leap_saving']['min']:+.1%}/{s['leap_saving']['median']:+.1%}/"
          f"{s['leap_saving']['max']:+.1%}; leap told free devices "
          f"{s['leap_aware_saving']['min']:+.1%}/{s['leap_aware_saving']['median']:+.1%}/"
          f"{s['leap_aware_saving']['max']:+.1%}")
    write_result(args.name, out)


if __name__ == "__main__":
    main()
