"""CLI: `leap backtest`, `leap report` and `leap experiment lookup|ranking|impact` (the
studies of the report; the others are in :mod:`leap.cli.boundaries` and :mod:`leap.cli.trials`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

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
)
from leap.cli.bench_data import experiment_group
from leap.cli.options import (
    as_of_opt,
    dask_opt,
    model_opt,
    no_history_opt,
    parallel,
    source_opt,
    specialists_opt,
    train_config,
    window_opt,
    workers_opt,
)
from leap.config import Workspace
from leap.errors import ConfigError

if TYPE_CHECKING:
    from leap.eval.real_data import RealDataResult

experiment_app = experiment_group()


def _night_bar(disable: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("nights"), TimeElapsedColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[last]}"), console=err_console, disable=disable,
                    transient=True)


def _run_backtest(ws: Workspace, *, nights: int, window_days: int, end: str | None,
                  model: str, specialists: int, no_history: bool, workers: int | None,
                  dask: str | None, quiet: bool) -> Any:
    from leap.catalog import Catalog
    from leap.eval.backtest import run_backtest

    par = parallel(workers, dask)
    require_store(ws)
    cfg = train_config(window_days, model, specialists, no_history)
    catalog = Catalog.load(ws.catalog_path)
    with _night_bar(quiet) as bar:
        task = bar.add_task(f"backtest ({par.backend}, {par.workers} worker"
                            f"{'s' if par.workers > 1 else ''})", total=nights, last="")

        def progress(done: int, total: int, night: Any) -> None:
            last = "" if night is None else (
                f"{night.day}: {100 * night.held_out.accuracy:.1f}% within ±20%")
            bar.update(task, completed=done, total=total, last=last)

        return run_backtest(ws.store_path, catalog, cfg, nights=nights, work_dir=ws.work_dir,
                            end=parse_day(end, "--end"), parallel=par, progress=progress)


# leap backtest --------------------------------------------------------------------------------
@app.command("backtest", epilog="Examples:\n\n  leap backtest --nights 30\n\n"
             "  leap backtest --nights 30 --model global --workers 4\n\n"
             "  leap backtest --nights 10 --window-days 14 --dask tcp://10.0.0.5:8786 --json")
@guarded
def backtest_cmd(
    ctx: typer.Context,
    nights: int = typer.Option(30, "--nights", min=1, help="Consecutive nightly retrainings."),
    window_days: int = window_opt(),
    end: str = typer.Option(None, "--end", help="Last held-out day (YYYY-MM-DD). Default: the "
                            "last full day in the store.", show_default=False),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    no_history: bool = no_history_opt(),
    workers: int = workers_opt(),
    dask: str = dask_opt(),
    as_json: bool = typer.Option(False, "--json", help="Print the result (every night) as "
                                 "JSON."),
) -> None:
    """Retrain nightly over consecutive nights, scoring each on the day after its window.

    Per night: accuracy within ±20% (attempt- and GPU-hour-weighted), median absolute
    percentage error, coverage, seen vs unseen families, the oracle ceiling (simulated
    stores) and the lookup table's coverage. Summary: median, min and max over the nights.
    Resumable: finished nights are kept under <home>/work/backtest-<hash>/ and a rerun
    (or a longer backtest with the same settings) computes only the missing ones.
    """
    ws = workspace(ctx)
    result = _run_backtest(ws, nights=nights, window_days=window_days, end=end, model=model,
                           specialists=specialists, no_history=no_history, workers=workers,
                           dask=dask, quiet=as_json)
    if as_json:
        print_json(result.to_dict())
        return
    from leap.eval.report import report_tables

    print_tables(report_tables(backtest=result))
    console.print(f"{len(result.computed)} night(s) computed, {len(result.reused)} reused "
                  f"from {result.run_dir}; {result.wall_s:.0f} s")


# Studies --------------------------------------------------------------------------------------
def _study_day(ws: Workspace, store: Any, *, as_of: str | None, window_days: int, model: str,
               specialists: int, no_history: bool, source: str) -> Any:
    from leap.catalog import Catalog
    from leap.eval.studies import eval_day

    cfg = train_config(window_days, model, specialists, no_history)
    with err_console.status("preparing the model of the held-out day (training if needed)",
                            spinner="dots"):
        return eval_day(store, Catalog.load(ws.catalog_path), cfg,
                        as_of=parse_day(as_of, "--as-of"), models_dir=ws.models_dir,
                        source=source)


def _ranking(ed: Any, ws: Workspace, store: Any, sample: int, seed: int) -> Any:
    from leap.eval.studies import ranking_day, study_costs

    with err_console.status("", spinner="dots") as status:
        return ranking_day(ed, store, study_costs(ed, ws.catalog_path), sample=sample,
                           seed=seed, status=status.update)


def _impact(ed: Any, ws: Workspace, store: Any, days: int, depth: int | None,
            delay_cost: float) -> Any:
    from leap.eval.studies import impact_day, study_costs

    with err_console.status("", spinner="dots") as status:
        return impact_day(ed, store, study_costs(ed, ws.catalog_path), days=days,
                          advice_depth=depth, delay_cost=delay_cost, status=status.update)


def _depth(value: int) -> int | None:
    return None if value == 0 else value


def _study(compute: Callable[[Any, Workspace, Any], Any],
           ctx: typer.Context, *, as_of: str | None, source: str, window_days: int,
           model: str, specialists: int, no_history: bool, as_json: bool) -> None:
    """One study command: the held-out day's model, ``compute(ed, ws, store)``, then print."""
    from leap.data.store import Store
    from leap.eval.report import report_tables
    from leap.eval.studies import ImpactResult, LookupResult, RankingResult

    ws = workspace(ctx)
    require_store(ws)
    with Store(ws.store_path, read_only=True) as store:
        ed = _study_day(ws, store, as_of=as_of, window_days=window_days, model=model,
                        specialists=specialists, no_history=no_history, source=source)
        result = compute(ed, ws, store)
    if as_json:
        print_json(result.to_dict())
        return
    print_tables(report_tables(lookup=result if isinstance(result, LookupResult) else None,
                               ranking=result if isinstance(result, RankingResult) else None,
                               impact=result if isinstance(result, ImpactResult) else None))
    console.print(f"model: {ed.source}" + (f"; {result.wall_s:.0f} s"
                                            if isinstance(result, ImpactResult) else ""))


@experiment_app.command("lookup", epilog="Example:  leap experiment lookup --json")
@guarded
def lookup_cmd(
    ctx: typer.Context,
    as_of: str = as_of_opt(),
    source: str = source_opt(),
    window_days: int = window_opt(),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    no_history: bool = no_history_opt(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The lookup table (the previous system) beside LEAP on one held-out day.

    The table is the median throughput of past attempts with exactly the same (family,
    hardware, trainer count, batch size) in the training window. Prints its coverage, its
    accuracy on what it covers, LEAP's accuracy on that same subset, and LEAP's coverage.
    """
    from leap.eval.studies import lookup_day

    _study(lambda ed, ws, store: lookup_day(ed),
           ctx, as_of=as_of, source=source, window_days=window_days, model=model,
           specialists=specialists, no_history=no_history, as_json=as_json)


@experiment_app.command("ranking", epilog="Example:  leap experiment ranking --sample 500 "
                        "--json")
@guarded
def ranking_cmd(
    ctx: typer.Context,
    sample: int = typer.Option(1000, "--sample", min=1, help="Jobs of the day to score."),
    seed: int = typer.Option(0, "--seed", help="Seed of the job sample."),
    as_of: str = as_of_opt(),
    source: str = source_opt(),
    window_days: int = window_opt(),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    no_history: bool = no_history_opt(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Ranking quality against the simulator's truth (simulated stores only).

    For sampled jobs of the held-out day and their eligible types: top-1 agreement with the
    oracle's best-value type, value regret of the top choice (1 - true value of the pick /
    true value of the best) and NDCG, for LEAP and for simple baselines (cheapest type,
    fastest peak FLOP/s, the family's most-used type, random).
    """
    _study(lambda ed, ws, store: _ranking(ed, ws, store, sample, seed),
           ctx, as_of=as_of, source=source, window_days=window_days, model=model,
           specialists=specialists, no_history=no_history, as_json=as_json)


@experiment_app.command("impact", epilog="Example:  leap experiment impact --days 3 "
                        "--advice-depth 3 --json")
@guarded
def impact_cmd(
    ctx: typer.Context,
    days: int = typer.Option(3, "--days", min=1, help="Days replayed from the held-out day on "
                             "(later days use the same model)."),
    advice_depth: int = typer.Option(3, "--advice-depth", min=0, help="List entries the "
                                     "scheduler tries before the home type (0: all)."),
    delay_cost: float = typer.Option(1.0, "--delay-cost", min=0.0, help="Cost of an hour a "
                                     "waiting attempt is delayed, per device-hour of its "
                                     "home price."),
    as_of: str = as_of_opt(),
    source: str = source_opt(),
    window_days: int = window_opt(),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    no_history: bool = no_history_opt(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Will advice save money? Replay days under capacity that matches the work.

    Each attempt books the device-hours it really uses on the chosen type (its samples at
    that type's true throughput); one that finds no room waits for its home type (a delay
    cost). Arms: no advice, LEAP, LEAP told each type's free devices, the greedy oracle (true
    value, blind to capacity), and the LP optimum (minimum cost under the budgets). Prints
    the saving of each arm and its share of the optimum's, coverage and first-choice shares
    beside the paper's, and the cost change split by placement kind (simulated stores only).
    """
    _study(lambda ed, ws, store: _impact(ed, ws, store, days, _depth(advice_depth),
                                         delay_cost),
           ctx, as_of=as_of, source=source, window_days=window_days, model=model,
           specialists=specialists, no_history=no_history, as_json=as_json)


# leap report ----------------------------------------------------------------------------------
@app.command("report", epilog="Examples:\n\n  leap report --out reports/2026-01\n\n"
             "  leap report --out /tmp/r --nights 5 --window-days 7 --model global --sample 300")
@guarded
def report_cmd(
    ctx: typer.Context,
    out: Path = typer.Option(..., "--out", help="Folder for index.html, report.json and the "
                             "PNG plots (created if missing)."),
    nights: int = typer.Option(30, "--nights", min=1, help="Backtest nights (resumes a "
                               "backtest with the same settings)."),
    window_days: int = window_opt(),
    end: str = typer.Option(None, "--end", help="Last held-out day (YYYY-MM-DD); the studies "
                            "use it too. Default: the last full day in the store.",
                            show_default=False),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    no_history: bool = no_history_opt(),
    workers: int = workers_opt(),
    dask: str = dask_opt(),
    sample: int = typer.Option(1000, "--sample", min=1, help="Jobs scored by the ranking "
                               "study."),
    impact_days: int = typer.Option(3, "--impact-days", min=1, help="Days replayed by the "
                                    "impact study (from the last night on)."),
    advice_depth: int = typer.Option(3, "--advice-depth", min=0, help="Advice entries the "
                                     "scheduler tries first (0: all)."),
    real_data_json: Path = typer.Option(None, "--real-data-json", help="Include this result "
                                        "of `leap experiment real-data` (default: "
                                        "<home>/work/reports/real_data.json when present).",
                                        show_default=False),
    real_data: bool = typer.Option(False, "--real-data", help="Run the real-data evaluation "
                                   "now and include it."),
    as_json: bool = typer.Option(False, "--json", help="Print the report JSON."),
) -> None:
    """Backtest, lookup comparison, ranking quality and impact study, as an HTML report.

    Writes index.html (with PNG plots: accuracy per night with the oracle ceiling, error
    distribution, lookup vs LEAP, ranking regret, cost with and without advice) and
    report.json with every number into --out, and prints the tables. The backtest resumes
    from finished nights; the studies use the last night's model.
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.studies import run_report

    ws = workspace(ctx)
    bt = _run_backtest(ws, nights=nights, window_days=window_days, end=end, model=model,
                       specialists=specialists, no_history=no_history, workers=workers,
                       dask=dask, quiet=as_json)
    with Store(ws.store_path, read_only=True) as store, \
            err_console.status("", spinner="dots") as status:
        report = run_report(store, bt, catalog=Catalog.load(ws.catalog_path),
                            catalog_path=ws.catalog_path, models_dir=ws.models_dir,
                            work_dir=ws.work_dir,
                            cfg=train_config(window_days, model, specialists, no_history),
                            sample=sample, impact_days=impact_days,
                            advice_depth=_depth(advice_depth), status=status.update)
    report.real_data = _real_data(ws, real_data_json, real_data)
    page = report.write(out, meta={"home": str(ws.home), "command": "leap report"})
    if as_json:
        print_json(json.loads((out / "report.json").read_text(encoding="utf-8")))
        return
    print_tables(report.tables())
    console.print(f"wrote {page} (and report.json, plots) in {out}")


def _real_data(ws: Workspace, path: Path | None, run: bool) -> RealDataResult | None:
    if run:
        from leap.cli.bench_data import evaluate_real_data

        return evaluate_real_data(workers=None, quiet=False)
    default = ws.work_dir / "reports" / "real_data.json"
    chosen = path if path is not None else (default if default.is_file() else None)
    if chosen is None:
        return None
    try:
        data = json.loads(chosen.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--real-data-json {chosen}: cannot read it ({exc}); write it with "
                          "`leap experiment real-data`") from None
    if not isinstance(data, dict) or "results" not in data:
        raise ConfigError(f"--real-data-json {chosen} is not a result of `leap experiment "
                          "real-data`")
    from leap.eval.real_data import RealDataResult

    return RealDataResult.from_dict(data)
