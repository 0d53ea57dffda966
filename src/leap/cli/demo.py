"""CLI: `leap demo` — simulate a fleet, train, show held-out accuracy and a few rankings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import typer
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from leap.cli import app, console, guarded, workspace
from leap.cli.model import print_train
from leap.cli.rank import ranking_table
from leap.metrics import si
from leap.rank.results import value

DEMO_START = datetime(2026, 1, 1, tzinfo=UTC)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn(
        "{task.completed}/{task.total}"), TimeElapsedColumn(), console=console)


@app.command(epilog="Example: leap --home /tmp/leap-demo demo")
@guarded
def demo(
    ctx: typer.Context,
    days: int = typer.Option(31, "--days", min=3, help="Days to simulate; the last one is "
                             "held out."),
    attempts_per_day: int = typer.Option(6000, "--attempts-per-day", min=500,
                                         help="Fleet size (the paper's fleet: 25000)."),
    seed: int = typer.Option(1, "--seed", min=0, help="Simulator seed."),
    model: str = typer.Option("cascade", "--model", help="cascade or global."),
) -> None:
    """Simulate a fleet, train the nightly model, and rank hardware for three example jobs.

    Everything stays in the workspace (--home): run `leap stats`, `leap rank`, `leap serve`
    on it afterwards. The default fleet is a quarter of the paper's (6,000 attempts a day)
    so the demo takes a few minutes; --attempts-per-day 25000 gives the full scale.
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.oracle import oracle_ceiling
    from leap.model.artifact import Registry
    from leap.model.train import train_nightly
    from leap.model.window import TrainConfig, load_attempts, succeeded_attempts
    from leap.rank.ranker import Ranker
    from leap.sim.fleet import Fleet
    from leap.sim.run import simulate
    from leap.sim.scenario import Scenario

    ws = workspace(ctx).ensure()
    catalog = Catalog.load(ws.catalog_path)
    base = Scenario.load()
    scale = attempts_per_day / base.attempts_per_day
    scenario = base.override(
        attempts_per_day=attempts_per_day,
        initial_families=max(200, round(base.initial_families * scale)),
        new_families_per_day=max(5.0, base.new_families_per_day * scale))
    console.print(Panel.fit(
        f"[bold]leap demo[/]  workspace {ws.home}\n"
        f"1. simulate {days} days of a fleet: {attempts_per_day:,} attempts/day, "
        f"{len(catalog)} accelerator types\n"
        f"2. train the nightly model on days 1-{days - 1}, evaluate on day {days}\n"
        "3. rank the hardware for three jobs of the held-out day"))

    with Store(ws.store_path) as store, _progress() as bar:
        task = bar.add_task("simulating days", total=days)
        report = simulate(store, catalog, scenario, days=days, seed=seed, start=DEMO_START,
                          progress=lambda done: bar.update(task, completed=done))
    console.print(f"simulated {report.attempts:,} attempts of {report.families:,} families "
                  f"({report.added:,} new in the store) in {report.seconds:.0f}s")

    as_of = DEMO_START + timedelta(days=days - 1)
    cfg = TrainConfig(window_days=min(30, days - 1), model_kind=model)
    registry = Registry(ws.models_dir)
    with Store(ws.store_path, read_only=True) as store:
        with _progress() as bar:
            tasks: dict[str, Any] = {}

            def progress(stage: str, done: int, total: int) -> None:
                label = {"features": "history + features", "fit": "fitting the model"}[stage]
                if stage not in tasks:
                    tasks[stage] = bar.add_task(label, total=total)
                bar.update(tasks[stage], completed=done, total=total)

            result = train_nightly(store, catalog, registry, as_of=as_of, cfg=cfg, force=True,
                                   progress=progress)
        day = succeeded_attempts(load_attempts(store, as_of, as_of + timedelta(days=1)),
                                 catalog)
        out = result.to_json()
        fleet = Fleet.from_store(store)
        out["metrics"]["held_out"]["oracle_ceiling"] = oracle_ceiling(fleet, day).accuracy
    print_train(out)

    ranker = Ranker(registry, costs=catalog, background_reload=False)
    art = registry.load()
    fam_n = art.snapshot.tables["fam"].set_index("family_id")["fam_n"]
    day = day.assign(history=day["family_id"].map(fam_n).fillna(0.0))
    examples = _pick_examples(day, ranker)
    for title, row, res in examples:
        job = {k: (None if pd.isna(v) else v) for k, v in row.items()
               if k in _job_fields()}
        names = [r.hardware for r in res.ranking]
        truth = dict(zip(names, fleet.true_throughput(pd.DataFrame([row] * len(names)), names,
                                                      row["submitted_at"]), strict=True)) \
            if names else {}
        console.print()
        console.print(f"[bold]{title}[/]: family {job['family_id']} ({job['model_type']}, "
                      f"{job['trainer_count']} x {job.get('devices_per_trainer') or 1} devices, "
                      f"batch {job['batch_size']}, {job.get('precision')})")
        table, legend = ranking_table(res.to_dict()["ranking"], title="preference list (best "
                                      "value first)", truth=truth, limit=8)
        console.print(table)
        if legend:
            console.print("  " + legend, highlight=False)
        console.print("  " + _pick_verdict(res, truth))
        premium = [e for e in res.excluded if e.reason == "premium_below_threshold"]
        others = [e for e in res.excluded if e.reason != "premium_below_threshold"]
        for e in premium:
            console.print(f"  [yellow]dropped premium {e.hardware}[/]: {e.detail}")
        if others:
            reasons = pd.Series([e.reason for e in others]).value_counts().to_dict()
            console.print("  also left out: " + ", ".join(f"{n} {r}" for r, n in reasons.items()))
    console.print(f"\nNext: `leap --home {ws.home} serve` and POST a job to /v1/rank, or "
                  f"`leap --home {ws.home} rank --job job.json`.")


def _pick_verdict(result: Any, truth: dict[str, float]) -> str:
    """How far the pick was from the truth, and from the best type among those ranked."""
    if not result.ranking:
        return f"no ranking: {result.reason or 'every type was left out'}"
    pick = result.ranking[0]
    true_tp = truth.get(pick.hardware, float("nan"))
    values = {r.hardware: value(truth.get(r.hardware, float("nan")), r.cost_per_hour)
              for r in result.ranking}
    best = max(values, key=lambda n: values[n] if values[n] == values[n] else -1.0)
    regret = 1 - values[pick.hardware] / values[best] if values[best] > 0 else float("nan")
    inside = pick.throughput_p10 is not None and pick.throughput_p90 is not None and \
        pick.throughput_p10 <= true_tp <= pick.throughput_p90
    return (f"pick {pick.hardware}: true samples/s {si(true_tp)} = "
            f"{true_tp / pick.predicted_throughput:.2f}x the prediction "
            f"({'inside' if inside else 'outside'} its interval); best true value among the "
            f"ranked types: {best}" + ("" if best == pick.hardware else
                                       f", so the pick loses {100 * regret:.0f}% of value"))


def _job_fields() -> tuple[str, ...]:
    from leap.data.schema import JOB_COLUMNS

    return JOB_COLUMNS


def _pick_examples(day: pd.DataFrame, ranker: Any) -> list[tuple[str, dict[str, Any], Any]]:
    """A job with rich history, one of a family never seen before, and one where a premium
    type is dropped for low predicted utilization (searched among the day's jobs)."""
    fields = _job_fields()

    def rank(row: pd.Series) -> Any:
        job = {k: (None if pd.isna(row[k]) else row[k].item() if hasattr(row[k], "item")
                   else row[k]) for k in fields if k in row.index}
        return ranker.rank(job)

    rng = np.random.default_rng(0)
    picks: list[tuple[str, dict[str, Any], Any]] = []
    for title, pool in (("A job with history", day[day["history"] > 20]),
                        ("A new family (no history)", day[day["history"] == 0])):
        # The first job of the pool (in a seeded order) that fits some type.
        for i in rng.permutation(len(pool))[:50]:
            row = pool.iloc[int(i)]
            res = rank(row)
            if res.ranking:
                picks.append((title, row.to_dict(), res))
                break
    for i in rng.permutation(len(day))[:300]:
        row = day.iloc[int(i)]
        res = rank(row)
        if any(e.reason == "premium_below_threshold" for e in res.excluded) and res.ranking:
            picks.append(("A job where a premium type is filtered", row.to_dict(), res))
            break
    return picks
