"""CLI: `leap monitor`, the live figures of the decisions leap made joined to what happened."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from leap.cli import app, console, guarded, parse_day, print_json, workspace

_HELP = (
    "Join ingested attempts to the rankings leap served for their launch (by attempt_id, else "
    "family and time) and report per day: coverage (attempts and GPU-hours with a non-empty "
    "ranking), share placed on the first choice and in the top 3, live accuracy of the "
    "prediction for the type used (within ±20%, MdAPE, interval coverage), and the value of "
    "the type used relative to the first choice's prediction.")


def _pct(x: Any) -> str:
    return "—" if x is None or x != x else f"{100 * float(x):.1f}%"


@app.command(help=_HELP, epilog="Example:  leap monitor --since 2026-01-01 --json")
@guarded
def monitor(
    ctx: typer.Context,
    since: str = typer.Option(None, "--since", help="First day (YYYY-MM-DD, UTC); default the "
                              "day of the first recorded decision."),
    until: str = typer.Option(None, "--until", help="Last day, inclusive (YYYY-MM-DD)."),
    match_window_minutes: float = typer.Option(60.0, "--match-window-minutes", min=0.0,
                                               help="An attempt without an id matches its "
                                               "family's latest decision at most this long "
                                               "before it started."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    prometheus: bool = typer.Option(False, "--prometheus", help="Print the latest day as "
                                    "Prometheus gauges (text format, e.g. for node_exporter's "
                                    "textfile collector)."),
) -> None:
    """Live coverage, first-choice share and accuracy of the advice, per day."""
    from datetime import timedelta

    from leap.rank.decisions import decisions_path
    from leap.serve.monitor import monitor as run_monitor

    ws = workspace(ctx)
    start = parse_day(since, "--since")
    end = parse_day(until, "--until")
    if end is not None:
        end += timedelta(days=1)
    report = run_monitor(ws.store_path, decisions_path(ws.home), start=start, end=end,
                         match_window=timedelta(minutes=match_window_minutes))
    if prometheus:
        from prometheus_client import CollectorRegistry, generate_latest

        from leap.serve.monitor import gauges

        class _Once:
            def collect(self) -> Any:
                return gauges(report.latest)

        reg = CollectorRegistry()
        reg.register(_Once())
        typer.echo(generate_latest(reg).decode(), nl=False)
        return
    if as_json:
        print_json(report.to_dict())
        return
    if not report.days:
        console.print(f"the decision log holds {report.decisions:,} rankings for these days, "
                      "but no attempt in the store falls on them: ingest what ran (leap ingest "
                      "--incremental) or choose the days (--since, --until)"
                      if report.decisions else
                      "no decisions recorded yet (leap serve records them; leap rank --record)")
        return
    days = report.days[-7:]
    t = Table(title=f"leap monitor ({report.matched_by_id:,} attempts matched by id, "
              f"{report.matched_by_family_time:,} by family and time; last {len(days)} day(s))",
              title_justify="left")
    t.add_column("figure")
    for d in days:
        t.add_column(d.date, justify="right")

    def ratio(x: Any) -> str:
        return "—" if x is None else f"{x:.2f}x"

    def count(x: Any) -> str:
        return f"{x:,.0f}"

    rows = [("attempts", "attempts", count), ("GPU-hours", "gpu_hours", count),
            ("coverage (attempts)", "coverage_attempts", _pct),
            ("coverage (GPU-hours)", "coverage_gpu_hours", _pct),
            ("on first choice", "first_choice_share", _pct),
            ("on first choice (GPU-h)", "first_choice_share_gpu_hours", _pct),
            ("in top 3", "top3_share", _pct), ("scored (succeeded, type ranked)", "scored", count),
            ("within ±20%", "within_20", _pct), ("MdAPE", "mdape", _pct),
            ("in 80% interval", "interval_coverage", _pct),
            ("value used / 1st predicted", "value_ratio_median", ratio),
            ("decisions", "decisions", count), ("fail-open", "fail_open", count)]
    for label, key, fmt in rows:
        t.add_row(label, *(fmt(d.figure(key)) for d in days))
    console.print(t)
