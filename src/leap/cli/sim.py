"""`leap simulate`: write the reference fleet's attempts into the store, and check it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from leap.catalog import Catalog
from leap.cli import app, console, err_console, guarded, print_json, workspace
from leap.data.store import Store
from leap.errors import ConfigError
from leap.sim.calibrate import TARGETS, calibrate, check_targets
from leap.sim.run import DEFAULT_START, simulate
from leap.sim.scenario import Scenario


def _start(text: str) -> datetime:
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise ConfigError(f"--start '{text}' is not a date; write it as YYYY-MM-DD, e.g. "
                          "2026-01-01") from None


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _target(key: str) -> str:
    lo, hi = TARGETS[key]
    if lo is not None and hi is not None:
        return f"{lo:g}-{hi:g}"
    return f">= {lo:g}" if lo is not None else f"<= {hi:g}"


def _print_calibration(cal: dict[str, Any], ok: dict[str, bool]) -> None:
    table = Table(title="fleet calibration", title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("spec", justify="right")
    rows = [
        ("attempts per day", "attempts_per_day"),
        ("days", "days"),
        ("families seen", "families"),
        ("model types seen", "model_types"),
        ("hardware types used", "hardware_types_used"),
        ("throughput span (orders of magnitude, p0.1-p99.9)", "throughput_span_orders"),
        ("oracle ceiling (share within +-20%)", "oracle_ceiling"),
        ("oracle ceiling, GPU-hour weighted", "oracle_ceiling_gpu_hours"),
        ("observed (family, eligible type) pair share", "observed_pair_share"),
        ("median eligible / observed types per family", None),
        ("new families seen per day", "new_families_per_day"),
        ("GPU-hour share of the top 1% attempts", "gpu_hours_share_of_top_1pct_attempts"),
        (f"attempts on new hardware {cal['new_hardware'] or '(none)'}"
         + (f" (from day {cal['new_hardware_first_day']})"
            if cal["new_hardware_first_day"] is not None else " (not in this span)"),
         "new_hardware_attempts"),
    ]
    for label, key in rows:
        if key is None:
            value = (f"{cal['median_eligible_types_per_family']:g} / "
                     f"{cal['median_observed_types_per_family']:g}")
            table.add_row(label, value, "")
            continue
        spec = ""
        if key in TARGETS:
            spec = f"[green]{_target(key)}[/]" if ok[key] else f"[red]{_target(key)} MISSED[/]"
        table.add_row(label, _fmt(cal[key]), spec)
    shares = ", ".join(f"{k} {v:.1%}" for k, v in cal["status_share"].items())
    table.caption = f"status: {shares}"
    console.print(table)


@app.command("simulate", epilog="Examples:\n\n  leap --home /tmp/fleet simulate --days 31 --seed 1"
             "\n\n  leap --home /tmp/fleet simulate --check\n\n"
             "  leap --home /tmp/small simulate --days 7 --attempts-per-day 2000 --check --json")
@guarded
def simulate_cmd(
    ctx: typer.Context,
    days: int = typer.Option(None, "--days", min=1, help="Days to simulate from --start.",
                             show_default=False),
    attempts_per_day: int = typer.Option(None, "--attempts-per-day", min=1,
                                         help="Attempts per day (scenario default 25,000).",
                                         show_default=False),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed: same seed, same fleet."),
    start: str = typer.Option(DEFAULT_START.date().isoformat(), "--start",
                              help="Day 0 (YYYY-MM-DD, UTC)."),
    scenario_file: Path = typer.Option(None, "--scenario", help="Scenario TOML overriding the "
                                       "default knobs (see resources/default_scenario.toml).",
                                       show_default=False),
    check: bool = typer.Option(False, "--check", help="Print the calibration of the simulated "
                               "fleet (after simulating, when --days is given); exit 1 if a "
                               "figure misses its spec range."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Simulate the reference fleet's attempts into the store (deterministic by seed).

    Rows pass the same validation as `leap ingest`; attempt ids are deterministic, so the
    same command twice adds nothing, and a longer run extends a shorter one. The store
    remembers the scenario and seed, so evaluation can rebuild the oracle (the true median
    throughput of any job on any type). `--check` alone checks what the store holds.
    """
    if days is None and not check:
        raise ConfigError("nothing to do: pass --days N to simulate, and/or --check to "
                          "calibrate the simulated store")
    ws = workspace(ctx)
    out: dict[str, Any] = {"store": str(ws.store_path)}
    if days is not None:
        scenario = Scenario.load(scenario_file)
        if attempts_per_day is not None:
            scenario = scenario.override(attempts_per_day=attempts_per_day)
        catalog = Catalog.load(ws.catalog_path)
        day0 = _start(start)
        with Store(ws.ensure().store_path) as store, Progress(
                TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                TextColumn("days"), TimeElapsedColumn(), console=err_console,
                transient=True, disable=as_json) as bar:
            task = bar.add_task("days", total=days)
            report = simulate(store, catalog, scenario, days=days, seed=seed, start=day0,
                              progress=lambda done: bar.update(task, completed=done))
            out["simulation"] = report.to_dict()
            out["attempts_in_store"] = store.count()
        if not as_json:
            console.print(
                f"simulated {report.days} days from {report.start} (seed {report.seed}): "
                f"{report.attempts:,} attempts, [bold]{report.added:,} added[/], "
                f"{report.already_stored:,} already stored, {report.quarantined:,} "
                f"quarantined; {report.families:,} families; {report.seconds:.1f} s")
            console.print("status: " + ", ".join(f"{k} {v:,}" for k, v in report.status.items())
                          + "; placement: " + ", ".join(f"{k} {v:,}" for k, v in
                                                        report.placement.items()))
            console.print(f"store: {ws.store_path} ({out['attempts_in_store']:,} attempts)")
    missed: list[str] = []
    if check:
        if not ws.store_path.exists():
            raise ConfigError(f"no attempt store at {ws.store_path}; simulate first, e.g. "
                              "leap simulate --days 7 --check")
        with Store(ws.store_path, read_only=True) as store:
            cal = calibrate(store)
        ok = check_targets(cal)
        missed = [k for k, v in ok.items() if not v]
        out["calibration"] = cal
        out["calibration_ok"] = ok
        if not as_json:
            _print_calibration(cal, ok)
    if as_json:
        print_json(out)
    if missed:
        err_console.print(f"[bold red]calibration:[/] {', '.join(missed)} outside the spec "
                          "range", highlight=False)
        raise typer.Exit(1)
