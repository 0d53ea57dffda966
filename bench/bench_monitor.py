"""Benchmark: the live loop on a full simulated day, through a real `leap serve`.

The last day of the bench workspace is taken out of the store (exported as a Hive-partitioned
Parquet file); `leap serve` (decision log on, its default) ranks every launch of that day over
HTTP with its attempt_id and launch time; the server is stopped (it flushes the log); the day
is ingested with `leap ingest`; `leap monitor --json` reports the day, and its figures are
compared with the same figures computed directly from the exported rows and the answers.
Prints the figures and writes bench/results/bench_monitor.json.

    python bench/bench_monitor.py [--home DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_http import free_port, start_server
from bench_rank import bench_workspace, write_result

from test_monitor import _direct


def _leap(home: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "leap", "--home", str(home), *args],
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"leap {' '.join(args)} failed: {res.stderr}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path)
    args = ap.parse_args()

    from leap.data.schema import JOB_COLUMNS
    from leap.data.store import Store

    src = bench_workspace(args.home, per_day=1500, days=8)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        shutil.copytree(src, home, ignore=shutil.ignore_patterns("decisions.duckdb"))
        with Store(home / "leap.duckdb") as store:
            rng = store.time_range()
            assert rng is not None
            day0 = rng[1].replace(hour=0, minute=0, second=0, microsecond=0)
            table = store.attempts(day0, day0 + timedelta(days=1))
            store.con.execute("DELETE FROM attempts WHERE submitted_at >= $d", {"d": day0})
        part = Path(tmp) / "export" / f"date={day0.date().isoformat()}"
        part.mkdir(parents=True)
        pq.write_table(table, part / "part-0.parquet")
        day = table.to_pandas()

        port = free_port()
        proc = start_server(home, port, 1)
        answers: dict[str, dict[str, Any]] = {}
        lat: list[float] = []
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                t0 = time.perf_counter()
                for row in day.to_dict("records"):
                    job = {k: row[k] for k in JOB_COLUMNS if row.get(k) is not None
                           and row[k] == row[k]}
                    job.update(attempt_id=row["attempt_id"],
                               submitted_at=row["submitted_at"].isoformat())
                    t1 = time.perf_counter()
                    r = client.post("/v1/rank", json={"job": job})
                    lat.append(time.perf_counter() - t1)
                    r.raise_for_status()
                    answers[row["attempt_id"]] = r.json()
                wall = time.perf_counter() - t0
                time.sleep(1.5)
                metrics = client.get("/metrics").text
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        written = next(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith("leap_decisions_written_total"))
        dropped = next(float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith("leap_decisions_dropped_total"))
        t0 = time.perf_counter()
        _leap(home, "ingest", str(part / "part-0.parquet"))
        ingest_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = json.loads(_leap(home, "monitor", "--json"))
        monitor_s = time.perf_counter() - t0
    (got,) = [d for d in report["days"] if d["date"] == day0.date().isoformat()]
    want = _direct(day, answers)
    agree = {k: abs(float(got[k]) - float(v)) <= 1e-9 * max(1.0, abs(float(v)))
             for k, v in want.items()}
    lat_ms = pd.Series(lat) * 1e3
    out = {"day": day0.date().isoformat(), "attempts": len(day), "rankings_served": len(answers),
           "decisions_written": written, "decisions_dropped": dropped,
           "rank_http_p50_ms": float(lat_ms.quantile(0.5)),
           "rank_http_p99_ms": float(lat_ms.quantile(0.99)), "rank_wall_s": wall,
           "ingest_s": ingest_s, "monitor_s": monitor_s, "monitor": got, "direct": want,
           "agree": agree, "all_agree": all(agree.values())}
    print(f"{len(answers):,} launches ranked over HTTP in {wall:.1f} s (p99 "
          f"{out['rank_http_p99_ms']:.1f} ms); decisions written {written:.0f}, dropped "
          f"{dropped:.0f}; ingest {ingest_s:.1f} s; monitor {monitor_s:.1f} s")
    print(f"coverage {got['coverage_attempts']:.3f}, first choice {got['first_choice_share']:.3f},"
          f" top 3 {got['top3_share']:.3f}, within ±20% {got['within_20']:.3f}, MdAPE "
          f"{got['mdape']:.3f}, interval coverage {got['interval_coverage']:.3f}; agrees with "
          f"the direct computation: {out['all_agree']}")
    write_result("bench_monitor", out)


if __name__ == "__main__":
    main()
