"""`leap ingest`, `leap stats`, `leap quarantine`, `leap export`: put attempts in the store,
look at them, take them out."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from leap.catalog import Catalog
from leap.cli import app, console, err_console, guarded, parse_day, print_json, workspace
from leap.data.ingest import (
    IngestLimits,
    IngestReport,
    check_files,
    expand_inputs,
    new_files,
    store_checked,
)
from leap.data.schema import ALL_COLUMNS
from leap.data.store import Store
from leap.errors import did_you_mean


def _totals(reports: list[IngestReport]) -> dict[str, Any]:
    reasons: Counter[str] = Counter()
    for r in reports:
        reasons.update(r.reasons)
    return {
        "rows_read": sum(r.rows_read for r in reports),
        "added": sum(r.added for r in reports),
        "already_stored": sum(r.already_stored for r in reports),
        "quarantined": sum(r.quarantined for r in reports),
        "reasons": dict(reasons.most_common()),
    }


_INGEST_HELP = (
    "Validate attempt files and add them to the store, all files as one atomic batch.\n\n"
    "Invalid and implausible rows (a time in the future or before --earliest, a throughput "
    "beyond physics, counts beyond their maxima) go to the quarantine table with their "
    "reason (see `leap quarantine`); "
    "attempts already stored are skipped, so ingesting a file twice adds nothing. An "
    "unreadable file or a missing required column stops everything and writes nothing.")


@app.command(help=_INGEST_HELP,
             epilog="Example:  leap --home ./fleet ingest attempts-2024-05-*.csv day.parquet   "
             "or, nightly:  leap ingest --incremental exports/attempts/")
@guarded
def ingest(
    ctx: typer.Context,
    files: list[Path] = typer.Argument(
        ..., help="CSV (.csv, .csv.gz), Parquet (.parquet, .pq) or JSON Lines (.jsonl, "
        ".ndjson) files of attempts, in the schema of the spec; a directory (searched "
        "recursively, e.g. a Hive-partitioned export date=YYYY-MM-DD/*.parquet) or a quoted "
        "glob pattern ('exports/**/*.parquet').", show_default=False),
    incremental: bool = typer.Option(False, "--incremental", help="Read only files not "
                                     "ingested before (a file is read again when its size or "
                                     "modification time changed)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    earliest: str = typer.Option("2000-01-01", "--earliest", help="Quarantine attempts "
                                 "submitted before this date (YYYY-MM-DD)."),
    max_future_hours: float = typer.Option(24.0, "--max-future-hours", min=0.0, help="Quarantine "
                                           "attempts submitted more than this many hours "
                                           "after now."),
    max_throughput: float = typer.Option(1e11, "--max-throughput", min=0.0, help="Quarantine "
                                         "throughputs above this many samples/s."),
    max_utilization: float = typer.Option(10.0, "--max-utilization", min=0.0, help="Quarantine "
                                          "throughputs implying more than this share of the "
                                          "type's peak FLOP/s (rows with flops_per_sample)."),
    max_count: int = typer.Option(1_000_000, "--max-count", min=1, help="Quarantine "
                                  "trainer_count, devices_per_trainer or parallel degrees "
                                  "above this."),
    max_batch_size: int = typer.Option(10**12, "--max-batch-size", min=1, help="Quarantine "
                                       "batch sizes above this."),
) -> None:
    """Validate attempt files and add them to the store as one atomic batch."""
    from datetime import UTC, datetime, timedelta

    ws = workspace(ctx)
    catalog = Catalog.load(ws.catalog_path)
    earliest_day = parse_day(earliest, "--earliest")
    assert earliest_day is not None
    limits = IngestLimits(earliest=earliest_day,
                          now=datetime.now(UTC), max_future=timedelta(hours=max_future_hours),
                          max_throughput=max_throughput, max_utilization=max_utilization,
                          max_count=max_count, max_batch_size=max_batch_size)
    with err_console.status("reading", spinner="dots") as status:

        def progress(msg: str) -> None:
            status.update(msg)

        paths = expand_inputs(files)
        skipped = 0
        if incremental and ws.store_path.exists():
            with Store(ws.store_path, read_only=True) as seen:
                fresh = new_files(seen, paths)
            skipped = len(paths) - len(fresh)
            paths = fresh
        if not paths:
            if as_json:
                print_json({"store": str(ws.store_path), "files": [], "skipped_files": skipped,
                            "total": _totals([])})
            else:
                console.print(f"nothing new to ingest ({skipped:,} file(s) already ingested)")
            return
        # Read and validate first: a bad file must not even create the store.
        checked = check_files(paths, catalog, progress, limits)
        with Store(ws.ensure().store_path) as store:
            reports = store_checked(store, checked, progress)
            stored = store.count()
    totals = _totals(reports)
    if as_json:
        print_json({"store": str(ws.store_path), "files": [r.to_dict() for r in reports],
                    "skipped_files": skipped, "total": totals, "attempts_in_store": stored})
        return

    table = Table(title="leap ingest", title_justify="left")
    table.add_column("file")
    for name in ("rows read", "added", "already stored", "quarantined"):
        table.add_column(name, justify="right")
    for r in reports:
        table.add_row(Path(r.source).name, f"{r.rows_read:,}", f"{r.added:,}",
                      f"{r.already_stored:,}",
                      f"[red]{r.quarantined:,}[/]" if r.quarantined else "0")
    if len(reports) > 1:
        table.add_row("[bold]total[/]", *(f"[bold]{totals[k]:,}[/]" for k in
                      ("rows_read", "added", "already_stored", "quarantined")))
    console.print(table)
    if totals["reasons"]:
        why = Table(title="quarantine reasons (top 10)", title_justify="left")
        why.add_column("rows", justify="right")
        why.add_column("reason")
        for reason, n in list(totals["reasons"].items())[:10]:
            why.add_row(f"{n:,}", reason)
        console.print(why)
        console.print("[dim]see the rows with: leap quarantine[/]")
    for r in reports:
        if r.unknown_columns:
            named = ", ".join(_unknown(c) for c in r.unknown_columns)
            console.print(f"[yellow]ignored unknown column(s) in {Path(r.source).name}:[/] "
                          f"{named}", highlight=False)
    if skipped:
        console.print(f"skipped {skipped:,} file(s) already ingested (--incremental)")
    console.print(f"store {ws.store_path} now holds {stored:,} attempts", highlight=False)


@app.command(epilog="Example:  leap --home ./fleet stats --json | jq .per_status")
@guarded
def stats(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    days: int = typer.Option(14, "--days", min=0, help="Show this many most recent days."),
) -> None:
    """Summarise the store: dates, attempts per day, hardware, status, families, quarantine."""
    ws = workspace(ctx)
    with Store(ws.store_path, read_only=True) as store:
        s = store.stats()
    if as_json:
        print_json(s)
        return
    overview = Table(title=f"attempt store {s['path']}", title_justify="left",
                     show_header=False)
    overview.add_column("what")
    overview.add_column("value", justify="right")
    per_day = [d["attempts"] for d in s["per_day"]]
    rows: list[tuple[str, str]] = [
        ("attempts", f"{s['attempts']:,}"),
        ("first submitted", str(s["first_submitted_at"] or "-")),
        ("last submitted", str(s["last_submitted_at"] or "-")),
        ("days with attempts", f"{s['days']:,}"),
        ("attempts per day (min / median / max)",
         " / ".join(f"{v:,.0f}" for v in _min_med_max(per_day)) if per_day else "-"),
        ("job families", f"{s['families']:,}"),
        ("model types", f"{s['model_types']:,}"),
        ("quarantined rows", f"{s['quarantined']:,}"),
        ("ingest batches", f"{s['batches']:,}"),
    ]
    for k, v in rows:
        overview.add_row(k, v)
    console.print(overview)
    console.print(_counts("status", s["per_status"], s["attempts"]))
    console.print(_counts("hardware", s["per_hardware"], s["attempts"]))
    if per_day and days:
        recent = Table(title=f"last {min(days, len(per_day))} days", title_justify="left")
        recent.add_column("date (UTC)")
        recent.add_column("attempts", justify="right")
        for d in s["per_day"][-days:]:
            recent.add_row(d["date"], f"{d['attempts']:,}")
        console.print(recent)
    if s["quarantine_reasons"]:
        console.print(_counts("quarantine reason", s["quarantine_reasons"], s["quarantined"]))


@app.command("export", epilog="Example:  leap export /shared/leap-export --start 2026-01-01 "
             "--end 2026-02-01  (then: leap train --dask tcp://HOST:8786 --export-dir ...)")
@guarded
def export_cmd(
    ctx: typer.Context,
    directory: Path = typer.Argument(..., help="Target directory: absent, empty, or an "
                                     "earlier export (replaced)."),
    start: str = typer.Option(None, "--start", help="First day (YYYY-MM-DD), inclusive."),
    end: str = typer.Option(None, "--end", help="Last day (YYYY-MM-DD), exclusive."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Export the store's attempts to Parquet, a directory per day, for Dask workers or any
    tool that reads Parquet."""
    from leap.data.export import export_parquet

    ws = workspace(ctx)
    with Store(ws.store_path, read_only=True) as store:
        res = export_parquet(store, directory, parse_day(start, "--start"),
                             parse_day(end, "--end"))
    out = {"directory": str(res.directory), "rows": res.rows, "days": res.days}
    if as_json:
        print_json(out)
        return
    console.print(f"exported {res.rows:,} attempts ({res.days} days) to {res.directory}",
                  highlight=False)


def _unknown(column: str) -> str:
    hint = did_you_mean(column, ALL_COLUMNS).removeprefix("; ")
    return f"'{column}' ({hint})" if hint else f"'{column}'"


def _min_med_max(values: list[int]) -> tuple[float, float, float]:
    ordered = sorted(values)
    mid = len(ordered) // 2
    med = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return float(ordered[0]), float(med), float(ordered[-1])


def _counts(what: str, counts: dict[str, int], total: int) -> Table:
    t = Table(title=f"per {what}", title_justify="left")
    t.add_column(what)
    t.add_column("rows", justify="right")
    t.add_column("share", justify="right")
    for k, n in counts.items():
        t.add_row(k, f"{n:,}", f"{n / total:.1%}" if total else "-")
    return t


@app.command(epilog="Example:  leap quarantine --limit 50 --json")
@guarded
def quarantine(
    ctx: typer.Context,
    limit: int = typer.Option(20, "--limit", min=1, help="Show at most this many rows."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Show quarantined rows (newest batch first): file, row, reason and original values.

    The row number counts data records from 1 (a CSV header is not counted).
    """
    ws = workspace(ctx)
    with Store(ws.store_path, read_only=True) as store:
        rows = store.quarantined(limit=limit).to_pylist()
        total = store.quarantine_count()
    if as_json:
        print_json({"total": total, "rows": [
            {**r, "record": json.loads(r["record"]) if r["record"] else None} for r in rows]})
        return
    t = Table(title=f"quarantine: {len(rows):,} of {total:,} rows", title_justify="left")
    for name in ("batch", "file", "row", "reason", "values"):
        t.add_column(name, overflow="fold")
    for r in rows:
        t.add_row(str(r["batch_id"]), Path(r["source"] or "-").name,
                  str(r["row_number"] or "-"), r["reason"], r["record"] or "")
    console.print(t)
