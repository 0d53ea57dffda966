"""Benchmark: what recording a ranking in the decision log adds, and that nothing is lost.

Target (issue 14): the added cost per ranking < 0.2 ms at p99, and under load records
written = rankings served, or the drops are counted.

1. Added cost: ``--calls`` rankings of recent jobs over 20 candidates in-process; for each, the
   time of the decision sink call alone (what the caller's thread pays: one ``put_nowait``),
   while the background writer runs. Also the rank latency with and without the log.
2. Load: ``--threads`` threads rank ``--load-calls`` jobs as fast as they can, with the default
   queue, then a small queue (1,000) and a writer flushing once a second; each run must end
   with ``written == served`` or ``written + dropped == served``.
3. Burst: 50,000 recorded answers offered as fast as one thread can into a 1,000-record
   queue (far faster than ranking can produce them), so records are dropped: written +
   dropped must equal offered.

Prints the figures and writes bench/results/bench_decision_log.json.

    python bench/bench_decision_log.py [--home DIR] [--calls 3000]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rank import CANDIDATES, bench_workspace, recent_jobs, write_result


def _pct(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max())}


def added_cost(ranker: Any, jobs: list[dict[str, Any]], calls: int, folder: Path
               ) -> dict[str, Any]:
    from leap.rank.decisions import DecisionLog

    log = DecisionLog(folder / "cost.duckdb")
    sink = log.sink("python")
    sink_s: list[float] = []

    def timed(job: Any, candidates: Any, result: Any) -> None:
        t0 = time.perf_counter()
        sink(job, candidates, result)
        sink_s.append(time.perf_counter() - t0)

    plain = ranker.with_options()
    logged = ranker.with_options()
    logged.decision_sink = timed
    for j in jobs[:50]:  # warm both
        plain.rank(j, CANDIDATES)
        logged.rank(j, CANDIDATES)
    sink_s.clear()
    rank_plain: list[float] = []
    rank_logged: list[float] = []
    for i in range(calls):
        job = {**jobs[i % len(jobs)], "attempt_id": f"a{i}"}
        t0 = time.perf_counter()
        plain.rank(job, CANDIDATES)
        t1 = time.perf_counter()
        logged.rank(job, CANDIDATES)
        t2 = time.perf_counter()
        rank_plain.append(t1 - t0)
        rank_logged.append(t2 - t1)
    log.flush(60)
    log.close()
    return {"calls": calls, "sink": _pct(sink_s), "rank_without_log": _pct(rank_plain),
            "rank_with_log": _pct(rank_logged), "written": log.written,
            "recorded": log.recorded, "dropped": log.dropped}


def load(ranker: Any, jobs: list[dict[str, Any]], n: int, threads: int, folder: Path, *,
         max_queue: int, flush_interval_s: float, name: str) -> dict[str, Any]:
    from leap.rank.decisions import DecisionLog, read_decisions

    log = DecisionLog(folder / f"{name}.duckdb", max_queue=max_queue,
                      flush_interval_s=flush_interval_s)
    mine = ranker.with_options()
    mine.decision_sink = log.sink("python")
    served = [0] * threads

    def work(k: int) -> None:
        for i in range(k, n, threads):
            mine.rank({**jobs[i % len(jobs)], "attempt_id": f"{name}-{i}"}, CANDIDATES)
            served[k] += 1

    t0 = time.perf_counter()
    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    log.flush(120)
    log.close()
    dec, _ = read_decisions(folder / f"{name}.duckdb")
    out = {"served": sum(served), "written": log.written, "rows_in_file": len(dec),
           "dropped": log.dropped, "max_queue": max_queue,
           "flush_interval_s": flush_interval_s, "rankings_per_s": sum(served) / wall}
    out["accounted"] = out["rows_in_file"] + out["dropped"] == out["served"]
    return out


def burst(ranker: Any, jobs: list[dict[str, Any]], n: int, folder: Path) -> dict[str, Any]:
    """Record ``n`` answers as fast as the caller can into a 1,000-record queue: far beyond
    what ranking produces, so the queue fills; every record is written or counted dropped."""
    from leap.rank.decisions import DecisionLog, read_decisions

    answers = [(j, ranker.rank(j, CANDIDATES)) for j in jobs[:100]]
    log = DecisionLog(folder / "burst.duckdb", max_queue=1_000)
    t0 = time.perf_counter()
    for i in range(n):
        job, res = answers[i % len(answers)]
        log.record({**job, "attempt_id": f"burst-{i}"}, CANDIDATES, res)
    wall = time.perf_counter() - t0
    log.flush(120)
    log.close()
    dec, _ = read_decisions(folder / "burst.duckdb")
    out = {"offered": n, "rows_in_file": len(dec), "dropped": log.dropped,
           "records_per_s": n / wall, "max_queue": 1_000}
    out["accounted"] = out["rows_in_file"] + out["dropped"] == n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--load-calls", type=int, default=6000)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()

    from leap.model.artifact import Registry
    from leap.rank.ranker import Ranker

    home = bench_workspace(args.home, per_day=1500, days=8)
    ranker = Ranker(Registry(home / "models"), background_reload=False)
    jobs = recent_jobs(home, 500)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cost = added_cost(ranker, jobs, args.calls, folder)
        print(f"sink call p50 {cost['sink']['p50_ms']:.4f} ms, p99 "
              f"{cost['sink']['p99_ms']:.4f} ms (target < 0.2 ms); rank p50 "
              f"{cost['rank_without_log']['p50_ms']:.2f} ms without the log, "
              f"{cost['rank_with_log']['p50_ms']:.2f} ms with it")
        runs = [load(ranker, jobs, args.load_calls, args.threads, folder, max_queue=50_000,
                     flush_interval_s=0.5, name="default"),
                load(ranker, jobs, args.load_calls, args.threads, folder, max_queue=1_000,
                     flush_interval_s=1.0, name="small_queue")]
        flood = burst(ranker, jobs, 50_000, folder)
    print(f"burst: {flood['offered']:,} records offered at {flood['records_per_s']:,.0f}/s to a "
          f"queue of 1,000: written {flood['rows_in_file']:,}, dropped {flood['dropped']:,} -> "
          f"accounted: {flood['accounted']}")
    for r in runs:
        print(f"load (queue {r['max_queue']:,}): served {r['served']:,}, written "
              f"{r['rows_in_file']:,}, dropped {r['dropped']:,} -> accounted: {r['accounted']} "
              f"({r['rankings_per_s']:.0f} rankings/s)")
    write_result("bench_decision_log", {
        "target_sink_p99_ms": 0.2, "added_cost": cost, "load": runs, "burst": flood,
        "ok": cost["sink"]["p99_ms"] < 0.2 and all(r["accounted"] for r in runs)
        and flood["accounted"],
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
    })


if __name__ == "__main__":
    main()
