"""CLI: `leap trials plan` (which families to try on a new type) and `leap trials check`
(the plan against random trials, in the simulator)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import typer

from leap.cli import (
    app,
    console,
    err_console,
    guarded,
    parse_day,
    print_json,
    print_tables,
    require_store,
    workspace,
    write_study,
)
from leap.errors import ConfigError

trials_app = typer.Typer(help="Trial jobs on a new (or little-used) accelerator type: which "
                         "families to run so rankings improve most per trial dollar.",
                         no_args_is_help=True)
app.add_typer(trials_app, name="trials")


@trials_app.command("plan", epilog="Examples:\n\n  leap trials plan --hardware B200 --budget 10"
                    "\n\n  leap trials plan --hardware MI300X --budget 25 --out plan.csv\n\n"
                    "  leap trials plan --hardware B200 --budget 5 --json")
@guarded
def plan_cmd(
    ctx: typer.Context,
    hardware: str = typer.Option(..., "--hardware", help="The new or little-used type."),
    budget: int = typer.Option(..., "--budget", help="Number of trials (>= 1)."),
    trial_hours: float = typer.Option(0.5, "--trial-hours", help="Length of each trial; "
                                      "the cost is devices x hours x the type's price."),
    type_discount: float = typer.Option(0.5, "--type-discount", help="Factor on a family's "
                                        "score per chosen trial of its model type (1: no "
                                        "preference for covering model types)."),
    out: Path = typer.Option(None, "--out", help="Write the plan to this file: .csv or "
                             ".json.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Plan trial jobs on a type: family, shape, devices, estimated cost and duration, and why.

    Uses the published model (`leap train`) and the attempts of its window. Each family's
    usual shape is scored by its window spend x the expected ranking loss a measurement on
    the type removes (from the prediction's 80% interval and the family's best other type),
    per trial dollar; trials are chosen greedily, each halving (--type-discount) the score of
    its model type's other families.
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.errors import ArtifactError
    from leap.eval.new_hardware import check_hardware
    from leap.eval.trials import PLAN_COLUMNS, plan_trials
    from leap.model.artifact import Registry
    from leap.model.window import day_start, load_attempts

    ws = workspace(ctx)
    if budget < 1:
        raise ConfigError(f"--budget must be >= 1, got {budget}")
    if out is not None and out.suffix.lower() not in (".csv", ".json"):
        raise ConfigError(f"--out {out}: name a .csv or .json file")
    require_store(ws)
    costs = Catalog.load(ws.catalog_path)
    check_hardware([hardware], costs)
    try:
        artifact = Registry(ws.models_dir).load()
    except ArtifactError as exc:
        raise ConfigError(f"no usable published model in {ws.models_dir} ({exc}); run "
                          "`leap train` first") from None
    as_of = day_start(datetime.fromisoformat(str(artifact.manifest["as_of"])))
    start = datetime.fromisoformat(str(artifact.manifest["window_start"]))
    with Store(ws.store_path, read_only=True) as store, \
            err_console.status("planning trials", spinner="dots"):
        history = load_attempts(store, start, as_of)
        plan = plan_trials(artifact, history, hardware, budget, costs=costs,
                           trial_hours=trial_hours, type_discount=type_discount)
    result = plan.to_dict()
    summary = plan.summary()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix.lower() == ".csv":
            plan.rows[list(PLAN_COLUMNS)].to_csv(out, index=False)
        else:
            from leap.eval.backtest import write_json_atomic

            write_json_atomic(out, result)
    if as_json:
        print_json(result)
        return
    from leap.eval.experiment_tables import trials_plan_table

    print_tables([trials_plan_table(summary)])
    for t in summary.trials:
        console.print(f"{t.rank}. {t.family_id}: {t.why}", highlight=False)
    console.print(f"{summary.planned} trial(s) of {summary.candidates:,} families that fit "
                  f"{hardware}; estimated cost ${summary.total_cost:,.0f}"
                  + (f"; wrote {out}" if out is not None else ""))


@trials_app.command("check", epilog="Example:  leap trials check --hardware B200 --budgets "
                    "0,5,10,25,50 --json   (writes <home>/work/reports/trials.json)")
@guarded
def check_cmd(
    ctx: typer.Context,
    hardware: str = typer.Option("B200", "--hardware", help="The type trials run on."),
    budgets: str = typer.Option("0,5,10,25,50", "--budgets", help="Numbers of trials "
                                "compared (two retrainings each, one for 0)."),
    little_used: bool = typer.Option(False, "--little-used", help="Keep the type's attempts "
                                     "in the history (default: it leaves the history, a new "
                                     "type)."),
    as_of: str = typer.Option(None, "--as-of", help="Held-out day (YYYY-MM-DD). Default: the "
                              "last full day in the store.", show_default=False),
    sample: int = typer.Option(500, "--sample", min=1, help="Jobs of the day ranked against "
                               "the oracle per model."),
    seed: int = typer.Option(0, "--seed", help="Seed of measurements, random plans, sample."),
    trial_hours: float = typer.Option(0.5, "--trial-hours", help="Length of each trial."),
    window_days: int = typer.Option(30, "--window-days", min=2, help="Days of attempts each "
                                    "model trains on."),
    specialists: int = typer.Option(13, "--specialists", min=2, help="K for the cascade."),
    out: Path = typer.Option(None, "--out", help="Directory for trials.json. Default: "
                             "<home>/work/reports.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Check the plan in the simulator: run the planned trials and random ones of the same
    number and cost, add them to the history, retrain, and compare accuracy and ranking
    regret on the type for each number of trials (simulated stores only).
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.report import report_tables
    from leap.eval.trials_check import trials_study
    from leap.model.window import TrainConfig

    ws = workspace(ctx)
    require_store(ws)
    try:
        numbers = [int(b) for b in budgets.split(",") if b.strip()]
    except ValueError:
        raise ConfigError(f"--budgets must be whole numbers separated by commas, got "
                          f"{budgets!r}") from None
    if not numbers or min(numbers) < 0:
        raise ConfigError(f"--budgets must be numbers >= 0, got {budgets!r}")
    cfg = TrainConfig(window_days=window_days, n_specialists=specialists)
    with Store(ws.store_path, read_only=True) as store, \
            err_console.status("trials check", spinner="dots") as status:
        result = trials_study(store, Catalog.load(ws.catalog_path), cfg, hardware=hardware,
                              budgets=numbers, as_of=parse_day(as_of, "--as-of"),
                              new_type=not little_used, sample=sample, seed=seed,
                              trial_hours=trial_hours, progress=status.update)
    write_study(out if out is not None else ws.work_dir / "reports", "trials", result,
                report_tables(trials=result), as_json=as_json, seconds=result.wall_s)
