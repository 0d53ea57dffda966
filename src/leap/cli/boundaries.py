"""CLI: `leap experiment new-families|new-hardware|alternatives`: where history runs out, and
what else could predict it."""

from __future__ import annotations

from pathlib import Path

import typer

from leap.cli import err_console, guarded, parse_day, require_store, workspace, write_study
from leap.cli.bench_data import experiment_group
from leap.cli.options import model_opt, specialists_opt, train_config, window_opt
from leap.errors import ConfigError

experiment_app = experiment_group()


@experiment_app.command("new-families", epilog="Example:  leap experiment new-families "
                        "--type-share 0.1 --json   (writes <home>/work/reports/new_families.json)")
@guarded
def new_families_cmd(
    ctx: typer.Context,
    as_of: str = typer.Option(None, "--as-of", help="Held-out day (YYYY-MM-DD). Default: the "
                              "last full day in the store.", show_default=False),
    type_share: float = typer.Option(0.1, "--type-share", min=0.001, max=0.999,
                                     help="Share of the day's model types whose families all "
                                     "leave training together."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draw of model types."),
    window_days: int = window_opt(),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    out: Path = typer.Option(None, "--out", help="Directory for new_families.json. Default: "
                             "<home>/work/reports.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Leave families out of training (by model type, and one large family alone) and measure
    the accuracy lost on them, with and without the architecture prior.

    Trains two models on the window before the held-out day: one on every family, one
    without the left-out families; scores the left-out families' attempts of the day with
    both, and with the second again with their architecture columns blanked.
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.new_families import new_families_study
    from leap.eval.report import report_tables

    ws = workspace(ctx)
    require_store(ws)
    cfg = train_config(window_days, model, specialists, False)
    with Store(ws.store_path, read_only=True) as store, \
            err_console.status("new-families study", spinner="dots") as status:
        result = new_families_study(store, Catalog.load(ws.catalog_path), cfg,
                                    as_of=parse_day(as_of, "--as-of"), type_share=type_share,
                                    seed=seed, progress=status.update)
    write_study(out if out is not None else ws.work_dir / "reports", "new_families", result,
                report_tables(new_families=result), as_json=as_json,
                seconds=result.timings["total_s"])


@experiment_app.command("alternatives", epilog="Example:  leap experiment alternatives "
                        "--json   (writes <home>/work/reports/alternatives.json)")
@guarded
def alternatives_cmd(
    ctx: typer.Context,
    as_of: str = typer.Option(None, "--as-of", help="Held-out day (YYYY-MM-DD). Default: the "
                              "last full day in the store.", show_default=False),
    window_days: int = window_opt(),
    sample_rows: int = typer.Option(200_000, "--sample-rows", min=1000, help="Training rows "
                                    "the linear model and the MLP learn from (k-NN: a "
                                    "quarter of them)."),
    out: Path = typer.Option(None, "--out", help="Directory for alternatives.json. Default: "
                             "<home>/work/reports.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Other learners, simple rules and ablations beside leap on one held-out day.

    One training set is encoded; leap, one LightGBM model, linear regression, k-NN, a small
    MLP, the analytic roofline, the base margin and the lookup table all learn from it and
    predict the same attempts; accuracy (as they came and with their own pair history
    masked), fit time and prediction latency for each.
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.alternatives import alternatives_study
    from leap.eval.report import report_tables

    ws = workspace(ctx)
    require_store(ws)
    cfg = train_config(window_days, "cascade", 13, False)
    with Store(ws.store_path, read_only=True) as store, \
            err_console.status("alternatives study", spinner="dots") as status:
        result = alternatives_study(store, Catalog.load(ws.catalog_path), cfg,
                                    as_of=parse_day(as_of, "--as-of"), sample_rows=sample_rows,
                                    knn_rows=max(1000, sample_rows // 4),
                                    status=status.update)
    write_study(out if out is not None else ws.work_dir / "reports", "alternatives",
                result, report_tables(alternatives=result), as_json=as_json,
                seconds=result.timings["total_s"])


def _days_list(value: str, option: str) -> list[int]:
    try:
        days = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{option} must be whole numbers separated by commas, got "
                          f"{value!r}") from None
    if any(d < 0 for d in days):
        raise ConfigError(f"{option} must be numbers >= 0, got {value!r}")
    return days


@experiment_app.command("new-hardware", epilog="Example:  leap experiment new-hardware "
                        "--hardware B200 --hardware MI300X --json   (writes "
                        "<home>/work/reports/new_hardware.json)")
@guarded
def new_hardware_cmd(
    ctx: typer.Context,
    hardware: list[str] = typer.Option(["B200", "MI300X", "Gaudi3"], "--hardware", help="A type to "
                                       "hold out of training (repeat for several; one "
                                       "retraining each)."),
    as_of: str = typer.Option(None, "--as-of", help="Held-out day (YYYY-MM-DD). Default: the "
                              "last full day in the store.", show_default=False),
    sample: int = typer.Option(500, "--sample", min=1, help="Jobs of the day ranked per type "
                               "against the oracle (simulated stores)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the job sample."),
    curve_days: str = typer.Option("0,1,2,3,5,7,10,14,20", "--curve-days",
                                   help="Days of history of the newest type at which it is "
                                   "scored (one retraining each); '' skips the curve."),
    window_days: int = window_opt(),
    model: str = model_opt(),
    specialists: int = specialists_opt(),
    out: Path = typer.Option(None, "--out", help="Directory for new_hardware.json. Default: "
                             "<home>/work/reports.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Hold accelerator types out of training and measure accuracy and ranking regret on them,
    beside the same types seen; and the newest type's accuracy night by night since its first
    day, beside the fleet's.

    One retraining per held-out type (plus one on everything) and one per curve night.
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.eval.new_hardware import new_hardware_study
    from leap.eval.report import report_tables

    ws = workspace(ctx)
    require_store(ws)
    cfg = train_config(window_days, model, specialists, False)
    catalog = Catalog.load(ws.catalog_path)
    with Store(ws.store_path, read_only=True) as store, \
            err_console.status("new-hardware study", spinner="dots") as status:
        result = new_hardware_study(store, catalog, cfg, hardware=hardware,
                                    as_of=parse_day(as_of, "--as-of"), sample=sample, seed=seed,
                                    curve_days=_days_list(curve_days, "--curve-days"),
                                    progress=status.update)
    write_study(out if out is not None else ws.work_dir / "reports", "new_hardware", result,
                report_tables(new_hardware=result), as_json=as_json,
                seconds=result.timings["total_s"])


