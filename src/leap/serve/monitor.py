"""Live figures: ingested attempts joined to the decisions made for their launch, per day.

The paper's operational figures, from the user's own fleet (:func:`monitor`):

Join
    An attempt takes the latest decision recorded with its ``attempt_id``; otherwise the latest
    decision *without* an attempt id for its ``family_id`` whose ``launch_at`` (the job's
    ``submitted_at`` when the caller sent it, else the time of the decision) is at most
    ``match_window`` before the attempt's ``submitted_at``.
Per day (of ``submitted_at``, UTC)
    ``attempts``, ``gpu_hours`` (``trainer_count x devices_per_trainer x duration_hours``,
    rows with a duration), ``matched`` (with a decision), ``covered`` (with a non-empty
    ranking) and ``coverage_attempts`` / ``coverage_gpu_hours``; over covered attempts,
    ``first_choice_share`` and ``top3_share`` (the type used was the first / among the first
    three of the list), attempt- and GPU-hour-weighted; live accuracy over covered, succeeded
    attempts whose type was ranked (``scored``): ``within_20`` (share with prediction within
    ±20% of the measured samples/s), ``mdape`` and ``interval_coverage`` (measured within the
    80% interval, over entries with one); ``value_ratio_median``: the measured value of the
    type used (measured samples/s x 3600 / its cost per hour) over the first choice's
    predicted value; ``decisions`` and ``fail_open`` (decisions made that day).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap.data.store import Store
from leap.data.usage import device_hours, usable_mask
from leap.metrics import TOLERANCE
from leap.rank.decisions import read_decisions
from leap.rank.results import value
from leap.records import Record

DEFAULT_MATCH_WINDOW = timedelta(hours=1)
#: Days of the decision log a server's live figures cover (the web page plots 30).
LIVE_DAYS = 30
#: The figures of each day, in report order (also the Prometheus gauges, ``leap_monitor_*``).
FIGURES: tuple[str, ...] = (
    "attempts", "gpu_hours", "matched", "covered", "coverage_attempts", "coverage_gpu_hours",
    "first_choice_share", "first_choice_share_gpu_hours", "top3_share", "top3_share_gpu_hours",
    "scored", "within_20", "mdape", "interval_coverage", "value_ratio_median", "decisions",
    "fail_open")

_ATTEMPT_COLS = ["attempt_id", "family_id", "submitted_at", "hardware", "status", "throughput",
                 "trainer_count", "devices_per_trainer", "duration_hours"]


@dataclass(frozen=True)
class MonitorDay(Record):
    """The figures of one day (see the module docstring; None where nothing was scored)."""

    date: str
    attempts: int
    gpu_hours: float
    matched: int
    covered: int
    coverage_attempts: float | None
    coverage_gpu_hours: float | None
    first_choice_share: float | None
    first_choice_share_gpu_hours: float | None
    top3_share: float | None
    top3_share_gpu_hours: float | None
    scored: int
    within_20: float | None
    mdape: float | None
    interval_coverage: float | None
    value_ratio_median: float | None
    decisions: int
    fail_open: int

    def figure(self, name: str) -> float | None:
        """The figure called ``name`` (one of :data:`FIGURES`)."""
        if name not in FIGURES:
            raise KeyError(f"unknown monitor figure {name!r}; one of {', '.join(FIGURES)}")
        found: float | None = getattr(self, name)
        return found


@dataclass(frozen=True)
class MonitorReport:
    """Per-day figures (oldest first) and how attempts were matched."""

    days: list[MonitorDay]
    match_window_minutes: float
    matched_by_id: int = 0
    matched_by_family_time: int = 0
    joined: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    decisions: int = 0  # launched on the report's days

    @property
    def latest(self) -> MonitorDay | None:
        return self.days[-1] if self.days else None

    def to_dict(self) -> dict[str, Any]:
        latest = self.latest
        return {"days": [d.to_dict() for d in self.days],
                "latest": None if latest is None else latest.to_dict(),
                "match_window_minutes": self.match_window_minutes,
                "matched_by_id": self.matched_by_id,
                "matched_by_family_time": self.matched_by_family_time}


def _utc_series(s: pd.Series) -> pd.Series:
    s = pd.to_datetime(s)
    return s.dt.tz_localize("UTC") if s.dt.tz is None else s.dt.tz_convert("UTC")


def join_outcomes(attempts: pd.DataFrame, decisions: pd.DataFrame, entries: pd.DataFrame, *,
                  match_window: timedelta = DEFAULT_MATCH_WINDOW) -> pd.DataFrame:
    """One row per attempt with its decision (if any) and the ranked entry of its type.

    Added columns: ``decision_id``, ``matched_by`` (``id``, ``family_time`` or None),
    ``n_ranked``, ``fail_open``, ``position`` (of the type used; NaN when not ranked),
    ``predicted_throughput``, ``throughput_p10``, ``throughput_p90``, ``cost_per_hour`` (of the
    type used) and ``first_value`` (the first choice's predicted value).
    """
    a = attempts.copy()
    a["submitted_at"] = _utc_series(a["submitted_at"])
    a["_row"] = np.arange(len(a))
    d = decisions.copy()
    if len(d):
        d["decided_at"] = _utc_series(d["decided_at"])
        d["launch_at"] = _utc_series(d["launch_at"])
    keep = ["decision_id", "n_ranked", "fail_open"]
    by_id = pd.DataFrame(columns=["_row", *keep])
    if len(d) and d["attempt_id"].notna().any():
        latest = d[d["attempt_id"].notna()].sort_values("decided_at").drop_duplicates(
            "attempt_id", keep="last")
        by_id = a[["_row", "attempt_id"]].merge(latest[["attempt_id", *keep]], on="attempt_id")
        by_id = by_id[["_row", *keep]]
    rest = a[~a["_row"].isin(by_id["_row"])]
    anon = d[d["attempt_id"].isna() & d["family_id"].notna()] if len(d) else d
    by_time = pd.DataFrame(columns=["_row", *keep])
    if len(anon) and len(rest):
        left = rest[["_row", "family_id", "submitted_at"]].sort_values("submitted_at")
        left = left.assign(family_id=left["family_id"].astype(str))
        right = anon[["family_id", "launch_at", *keep]].sort_values("launch_at")
        right = right.assign(family_id=right["family_id"].astype(str))
        m = pd.merge_asof(left, right, left_on="submitted_at", right_on="launch_at",
                          by="family_id", direction="backward",
                          tolerance=pd.Timedelta(match_window))
        by_time = m[m["decision_id"].notna()][["_row", *keep]]
    matched = pd.concat([by_id.assign(matched_by="id"),
                         by_time.assign(matched_by="family_time")], ignore_index=True)
    out = a.merge(matched, on="_row", how="left")
    e = entries.copy()
    used = out[["_row", "decision_id", "hardware"]].merge(
        e[["decision_id", "hardware", "position", "predicted_throughput", "throughput_p10",
           "throughput_p90", "cost_per_hour"]], on=["decision_id", "hardware"], how="inner")
    out = out.merge(used.drop(columns=["decision_id", "hardware"]), on="_row", how="left")
    first = e[e["position"] == 1][["decision_id", "value"]].rename(
        columns={"value": "first_value"})
    out = out.merge(first, on="decision_id", how="left")
    return out.sort_values("_row").drop(columns="_row").reset_index(drop=True)


def _share(mask: np.ndarray, weights: np.ndarray | None = None) -> float | None:
    if weights is None:
        return float(mask.mean()) if len(mask) else None
    total = float(weights.sum())
    return float((weights * mask).sum() / total) if total > 0 else None


def day_figures(date: str, j: pd.DataFrame, decisions_today: pd.DataFrame) -> MonitorDay:
    """The figures of day ``date`` from :func:`join_outcomes` rows (see the module docstring)."""
    gh = device_hours(j)
    matched = j["decision_id"].notna().to_numpy()
    covered = matched & (j["n_ranked"].fillna(0).to_numpy() > 0)
    pos = j["position"].to_numpy(dtype=float)
    c = covered
    tp = j["throughput"].to_numpy(dtype=float)
    scored = c & np.isfinite(pos) & usable_mask(j)
    pred = j["predicted_throughput"].to_numpy(dtype=float)[scored]
    actual = tp[scored]
    err = np.abs(pred / actual - 1.0)
    lo = j["throughput_p10"].to_numpy(dtype=float)[scored]
    hi = j["throughput_p90"].to_numpy(dtype=float)[scored]
    has = np.isfinite(lo) & np.isfinite(hi)
    value_used = value(actual, j["cost_per_hour"].to_numpy(dtype=float)[scored])
    ratio = value_used / j["first_value"].to_numpy(dtype=float)[scored]
    return MonitorDay(
        date=date, attempts=len(j), gpu_hours=float(gh.sum()), matched=int(matched.sum()),
        covered=int(covered.sum()), coverage_attempts=_share(covered),
        coverage_gpu_hours=_share(covered, gh),
        first_choice_share=_share(pos[c] == 1) if c.any() else None,
        first_choice_share_gpu_hours=_share(pos[c] == 1, gh[c]) if c.any() else None,
        top3_share=_share(pos[c] <= 3) if c.any() else None,
        top3_share_gpu_hours=_share(pos[c] <= 3, gh[c]) if c.any() else None,
        scored=int(scored.sum()),
        within_20=float((err <= TOLERANCE).mean()) if len(err) else None,
        mdape=float(np.median(err)) if len(err) else None,
        interval_coverage=float(((lo[has] <= actual[has]) & (actual[has] <= hi[has])).mean())
        if has.any() else None,
        value_ratio_median=float(np.median(ratio)) if len(ratio) else None,
        decisions=len(decisions_today),
        fail_open=int(decisions_today["fail_open"].astype(bool).sum())
        if len(decisions_today) else 0,
    )


def monitor(store_path: Path, decisions_file: Path, *, start: datetime | None = None,
            end: datetime | None = None,
            match_window: timedelta = DEFAULT_MATCH_WINDOW,
            recent_days: int | None = None) -> MonitorReport:
    """Join the store's attempts to the decision log and compute the figures per day.

    Parameters
    ----------
    store_path : Path
        The attempt store (opened read-only).
    decisions_file : Path
        The decision log (:func:`leap.rank.decisions.decisions_path`).
    start, end : datetime, optional
        Days of ``submitted_at`` to report, ``[start, end)``; default the days from the first
        to the last decision's ``launch_at``.
    match_window : timedelta
        How long after a decision without an attempt id an attempt of its family may start
        and still be matched to it.
    recent_days : int, optional
        Without ``start``: report only the last this many days of the log (from its latest
        ``launch_at``), reading only their decisions (a server's live figures: a log keeps 90
        days by default, millions of rankings on a large fleet).

    Returns
    -------
    MonitorReport
    """
    # Decisions up to a day (or the match window) before the first day can still match
    # its attempts: by id when the caller sent no launch time, or by family and time.
    margin = max(match_window, timedelta(days=1))
    if start is not None:
        dec, ent = read_decisions(decisions_file, since=start - margin)
    else:
        dec, ent = read_decisions(decisions_file, days=None if recent_days is None else
                                  recent_days + margin / timedelta(days=1))
    window_min = match_window.total_seconds() / 60.0
    if len(dec) == 0 and (start is None or end is None):
        return MonitorReport([], window_min)
    launch_day = _utc_series(dec["launch_at"]).dt.floor("D") if len(dec) else pd.Series([])
    if len(dec):
        if start is None and recent_days is not None:
            start = (launch_day.max() - pd.Timedelta(days=recent_days - 1)).to_pydatetime()
        start = start or launch_day.min().to_pydatetime()
        end = end or (launch_day.max() + pd.Timedelta(days=1)).to_pydatetime()
    assert start is not None and end is not None
    with Store(store_path, read_only=True) as store:
        attempts = store.attempts(start, end, columns=_ATTEMPT_COLS).to_pandas()
    j = join_outcomes(attempts, dec, ent, match_window=match_window)
    days: list[MonitorDay] = []
    if len(j):
        day = j["submitted_at"].dt.floor("D")
        for d in sorted(day.unique()):
            today = dec[(launch_day == d).to_numpy()] if len(dec) else dec
            days.append(day_figures(pd.Timestamp(d).date().isoformat(),
                                    j[(day == d).to_numpy()], today))
    by = j["matched_by"] if len(j) else pd.Series([], dtype=object)
    on_days = ((launch_day >= pd.Timestamp(start)) & (launch_day < pd.Timestamp(end))).sum() \
        if len(dec) else 0
    return MonitorReport(days, window_min, int((by == "id").sum()),
                         int((by == "family_time").sum()), joined=j, decisions=int(on_days))


def _clean(v: Any) -> float:
    return float("nan") if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def gauges(latest: MonitorDay | None) -> Iterable[Any]:
    """Prometheus gauges ``leap_monitor_<figure>`` of one day's figures (NaN when unknown)."""
    from prometheus_client.core import GaugeMetricFamily

    day = GaugeMetricFamily("leap_monitor_day_info", "The day the leap_monitor_* gauges "
                            "describe (value 1)", labels=["date"])
    if latest is not None:
        day.add_metric([str(latest.date)], 1.0)
    yield day
    for name in FIGURES:
        yield GaugeMetricFamily(f"leap_monitor_{name}", f"leap monitor: {name} on the latest "
                                "day with attempts",
                                value=_clean(None if latest is None else latest.figure(name)))


class MonitorCollector:
    """Serves :func:`gauges` of the latest day, recomputed at most every ``ttl_s`` seconds.

    A failure (e.g. ``leap ingest`` holds the store) keeps the previous figures.
    """

    def __init__(self, store_path: Path, decisions_file: Path, *, ttl_s: float = 60.0,
                 match_window: timedelta = DEFAULT_MATCH_WINDOW,
                 recent_days: int | None = LIVE_DAYS) -> None:
        self.store_path = store_path
        self.decisions_file = decisions_file
        self.ttl_s = ttl_s
        self.match_window = match_window
        self.recent_days = recent_days
        self._at = -math.inf
        self.report: MonitorReport | None = None
        self.error: str | None = None

    def current(self) -> MonitorReport | None:
        import time

        from leap.errors import LeapError

        now = time.monotonic()
        if now - self._at >= self.ttl_s:
            self._at = now
            if not Path(self.store_path).exists():
                return self.report
            try:
                self.report = monitor(self.store_path, self.decisions_file,
                                      match_window=self.match_window,
                                      recent_days=self.recent_days)
                self.error = None
            except (LeapError, OSError) as exc:
                self.error = str(exc)
        return self.report

    def collect(self) -> Iterable[Any]:
        report = self.current()
        yield from gauges(report.latest if report else None)



