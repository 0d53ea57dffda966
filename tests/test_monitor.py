"""`leap monitor` end to end on the simulator: serve, rank launches of a replayed day over HTTP
with ids, ingest that day's outcomes, and check the monitor's figures against the same figures
computed directly from the simulator's attempts and the answers the test received."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from conftest import SMALL_AS_OF
from leap.cli import _register, app
from leap.config import Workspace
from leap.data.schema import JOB_COLUMNS
from leap.data.store import Store
from leap.model.artifact import Registry
from leap.rank.decisions import DecisionLog, decisions_path, read_decisions
from leap.rank.ranker import Ranker
from leap.serve.app import create_app
from leap.serve.monitor import FIGURES, MonitorCollector, MonitorDay, join_outcomes, monitor

runner = CliRunner()
_register()
DAY = SMALL_AS_OF  # the trained model's held-out day: the "live" day of this test
N_RANKED = 150


def _day_out_of_store(ws: Workspace, folder: Path) -> pd.DataFrame:
    """Move the live day's attempts out of the store into a Parquet export (its outcomes)."""
    with Store(ws.store_path) as store:
        day = store.attempts(DAY, DAY + timedelta(days=1))
        store.con.execute("DELETE FROM attempts WHERE submitted_at >= $d", {"d": DAY})
    part = folder / f"date={DAY.date().isoformat()}"
    part.mkdir(parents=True)
    pq.write_table(day, part / "part-0.parquet")
    return day.to_pandas()


def _replay(ws: Workspace, day: pd.DataFrame) -> tuple[dict[str, dict[str, Any]], int]:
    """Rank launches of the day over HTTP: by attempt_id, by family and time, or with neither.

    Returns the answer the test got for each attempt the monitor should match, and the
    number of rankings served.
    """
    once = day["family_id"].map(day["family_id"].value_counts()) == 1
    picked = day.iloc[:: max(1, len(day) // N_RANKED)].head(N_RANKED)
    answers: dict[str, dict[str, Any]] = {}
    ranker = Ranker(Registry(ws.models_dir), background_reload=False)
    log = DecisionLog(decisions_path(ws.home), flush_interval_s=0.05)
    served = 0
    with TestClient(create_app(ranker, decisions=log)) as client:
        for i, row in enumerate(picked.to_dict("records")):
            job = {k: row[k] for k in JOB_COLUMNS if row.get(k) is not None
                   and row[k] == row[k]}
            mode = i % 3
            if mode < 2:  # the scheduler knows the launch time
                job["submitted_at"] = row["submitted_at"].isoformat()
            if mode == 0 or (mode == 1 and not once.loc[picked.index[i]]):
                job["attempt_id"] = row["attempt_id"]
            # mode 1 with a family seen once that day: no id, matched by family and time;
            # mode 2: neither id nor launch time -> decided "now", matches no attempt of the day
            r = client.post("/v1/rank", json={"job": job})
            assert r.status_code == 200, r.text
            served += 1
            if "attempt_id" in job or "submitted_at" in job:
                answers[row["attempt_id"]] = r.json()
        assert log.flush(30)
    return answers, served


def _direct(day: pd.DataFrame, answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The figures from the simulator's rows and the answers, without the monitor's code."""
    n = len(day)
    gh = (day["trainer_count"] * day["devices_per_trainer"].fillna(1)
          * day["duration_hours"]).fillna(0.0).to_numpy(float)
    covered = np.zeros(n, bool)
    pos = np.full(n, np.nan)
    rows = []
    for k, a in enumerate(day.to_dict("records")):
        ans = answers.get(a["attempt_id"])
        if not ans or not ans["ranking"]:
            continue
        covered[k] = True
        names = [e["hardware"] for e in ans["ranking"]]
        if a["hardware"] in names:
            pos[k] = names.index(a["hardware"]) + 1
            e = ans["ranking"][names.index(a["hardware"])]
            if a["status"] == "succeeded" and a["throughput"] > 0:
                rows.append((e["predicted_throughput"], a["throughput"], e["throughput_p10"],
                             e["throughput_p90"], a["throughput"] * 3600 / e["cost_per_hour"]
                             / ans["ranking"][0]["value"]))
    p, t, lo, hi, ratio = (np.array(c, float) for c in zip(*rows, strict=True))
    err = np.abs(p / t - 1)
    return {"attempts": n, "covered": int(covered.sum()),
            "coverage_attempts": covered.mean(),
            "coverage_gpu_hours": gh[covered].sum() / gh.sum(),
            "first_choice_share": float(np.mean(pos[covered] == 1)),
            "first_choice_share_gpu_hours":
                gh[covered][pos[covered] == 1].sum() / gh[covered].sum(),
            "top3_share": float(np.mean(pos[covered] <= 3)), "scored": len(rows),
            "within_20": float(np.mean(err <= 0.2)), "mdape": float(np.median(err)),
            "interval_coverage": float(np.mean((lo <= t) & (t <= hi))),
            "value_ratio_median": float(np.median(ratio))}


def test_monitor_agrees_with_the_simulator_end_to_end(fresh_copy: Workspace,
                                                      tmp_path: Path) -> None:
    ws = fresh_copy
    day = _day_out_of_store(ws, tmp_path / "export")
    answers, served = _replay(ws, day)
    res = runner.invoke(app, ["--home", str(ws.home), "ingest", str(tmp_path / "export" /
                              f"date={DAY.date().isoformat()}" / "part-0.parquet")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["--home", str(ws.home), "monitor", "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    (got,) = [d for d in report["days"] if d["date"] == DAY.date().isoformat()]
    want = _direct(day, answers)
    assert report["matched_by_id"] + report["matched_by_family_time"] == len(answers)
    assert report["matched_by_family_time"] > 0
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert got["decisions"] == len(answers) < served  # decisions launched that day
    assert got["fail_open"] == 0
    # The human table and the Prometheus export say the same.
    res = runner.invoke(app, ["--home", str(ws.home), "monitor"])
    assert res.exit_code == 0 and "coverage" in res.output
    res = runner.invoke(app, ["--home", str(ws.home), "monitor", "--prometheus"])
    fams = {f.name: f for f in text_string_to_metric_families(res.output)}
    assert fams["leap_monitor_coverage_attempts"].samples[0].value == \
        pytest.approx(want["coverage_attempts"])


def test_decisions_without_a_launch_time_never_match_the_past(tmp_path: Path) -> None:
    att = pd.DataFrame({"attempt_id": ["a"], "family_id": ["f"],
                        "submitted_at": [pd.Timestamp("2026-01-12T10:00:00Z")],
                        "hardware": ["L4"], "status": ["succeeded"], "throughput": [10.0],
                        "trainer_count": [1], "devices_per_trainer": [1],
                        "duration_hours": [1.0]})
    dec = pd.DataFrame({"decision_id": ["d1", "d2"], "attempt_id": [None, None],
                        "family_id": ["f", "f"],
                        "decided_at": [pd.Timestamp("2026-01-12T10:30:00Z"),
                                       pd.Timestamp("2026-01-12T08:00:00Z")],
                        "launch_at": [pd.Timestamp("2026-01-12T10:30:00Z"),
                                      pd.Timestamp("2026-01-12T08:00:00Z")],
                        "n_ranked": [2, 2], "fail_open": [False, False]})
    ent = pd.DataFrame({"decision_id": ["d1"], "position": [1], "hardware": ["L4"],
                        "predicted_throughput": [10.0], "throughput_p10": [8.0],
                        "throughput_p90": [12.0], "cost_per_hour": [1.0], "value": [36000.0]})
    # d1 comes after the launch, d2 more than the window before it: no match.
    j = join_outcomes(att, dec, ent, match_window=timedelta(hours=1))
    assert j["decision_id"].isna().all()
    j = join_outcomes(att, dec, ent, match_window=timedelta(hours=3))
    assert j["decision_id"].tolist() == ["d2"] and j["matched_by"].tolist() == ["family_time"]


def test_monitor_gauges_in_metrics(fresh_copy: Workspace, tmp_path: Path) -> None:
    ws = fresh_copy
    ranker = Ranker(Registry(ws.models_dir), background_reload=False)
    log = DecisionLog(decisions_path(ws.home), flush_interval_s=0.05)
    with Store(ws.store_path, read_only=True) as store:
        rows = store.attempts(DAY, DAY + timedelta(hours=2)).to_pylist()[:5]
    collector = MonitorCollector(ws.store_path, decisions_path(ws.home), ttl_s=0.0)
    with TestClient(create_app(ranker, decisions=log, extra_collectors=[collector])) as client:
        for a in rows:
            job = {k: a[k] for k in JOB_COLUMNS if a.get(k) is not None}
            client.post("/v1/rank", json={"job": {**job, "attempt_id": a["attempt_id"],
                                                  "submitted_at": a["submitted_at"].isoformat()}})
        assert log.flush(10)
        text = client.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["leap_monitor_matched"].samples[0].value == 5
    assert fams["leap_monitor_day_info"].samples[0].labels["date"] == DAY.date().isoformat()
    report = monitor(ws.store_path, decisions_path(ws.home))
    latest = report.latest
    assert latest is not None and latest.matched == 5 and latest.figure("matched") == 5
    data = report.to_dict()
    assert list(data["latest"]) == ["date", *FIGURES]
    assert MonitorDay.from_dict(data["latest"]) == latest
    with pytest.raises(KeyError, match="unknown monitor figure 'match'"):
        latest.figure("match")
    dec, _ = read_decisions(decisions_path(ws.home))
    assert len(dec) == 5


def test_live_figures_read_only_the_recent_days_of_the_log(fresh_copy: Workspace) -> None:
    """A server's live figures cover the log's last days and read only their decisions: the
    same figures for those days as from the whole log."""
    ws = fresh_copy
    ranker = Ranker(Registry(ws.models_dir), background_reload=False)
    log = DecisionLog(decisions_path(ws.home))
    with Store(ws.store_path, read_only=True) as store:
        rows = store.attempts(DAY, DAY + timedelta(hours=2)).to_pylist()[:5]
    for a in rows:
        job = {k: a[k] for k in JOB_COLUMNS if a.get(k) is not None}
        log.record({**job, "attempt_id": a["attempt_id"],
                    "submitted_at": a["submitted_at"].isoformat()}, None, ranker.rank(job))
    early = (DAY - timedelta(days=10)).isoformat()
    log.record({**job, "submitted_at": early}, None, ranker.rank(job))
    log.close()
    whole = monitor(ws.store_path, decisions_path(ws.home))
    recent = monitor(ws.store_path, decisions_path(ws.home), recent_days=1)
    assert len(whole.days) > 1 and whole.decisions == 6
    assert recent.days == [whole.days[-1]] and recent.latest is not None
    assert recent.latest.matched == 5 and recent.decisions == 5
    dec, ent = read_decisions(decisions_path(ws.home), since=DAY)
    assert len(dec) == 5 and set(ent["decision_id"]) == set(dec["decision_id"])
    assert MonitorCollector(ws.store_path, decisions_path(ws.home)).recent_days == 30


def test_monitor_without_decisions_says_so(fresh_copy: Workspace) -> None:
    res = runner.invoke(app, ["--home", str(fresh_copy.home), "monitor"])
    assert res.exit_code == 0 and "no decisions recorded yet" in res.output
    ranker = Ranker(Registry(fresh_copy.models_dir), background_reload=False)
    log = DecisionLog(decisions_path(fresh_copy.home))
    with Store(fresh_copy.store_path, read_only=True) as store:
        a = store.attempts(DAY, DAY + timedelta(hours=2)).to_pylist()[0]
    job = {k: a[k] for k in JOB_COLUMNS if a.get(k) is not None}
    # Ranked for a launch years after the store's last attempt: nothing to join it to.
    log.record({**job, "submitted_at": "2031-01-01T00:00:00Z"}, None, ranker.rank(job))
    log.close()
    res = runner.invoke(app, ["--home", str(fresh_copy.home), "monitor"])
    assert res.exit_code == 0, res.output
    assert "the decision log holds 1 rankings for these days, but no attempt" in res.output
    res = runner.invoke(app, ["--home", str(fresh_copy.home), "monitor", "--since", "yesterday"])
    assert res.exit_code == 1 and "--since must be a date" in res.output
