"""`leap import-benchmarks` and `leap experiment real-data`: the public measured throughput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from leap.catalog import Catalog
from leap.cli import (
    app,
    console,
    err_console,
    guarded,
    print_json,
    print_tables,
    workspace,
)
from leap.errors import CatalogError

if TYPE_CHECKING:
    from leap.eval.real_data import RealDataResult


def experiment_group() -> typer.Typer:
    """The `leap experiment` sub-command group, shared with other command modules.

    Whichever module registers first creates it; later ones add their commands to it, so
    two modules never create competing groups of the same name.
    """
    for group in app.registered_groups:
        if group.name == "experiment" and group.typer_instance is not None:
            return group.typer_instance
    group_app = typer.Typer(help="Experiments that measure how good the predictions are.",
                            no_args_is_help=True)
    app.add_typer(group_app, name="experiment")
    return group_app


experiment_app = experiment_group()


@app.command("import-benchmarks",
             epilog="Example:  leap --home ./bench import-benchmarks --source sia --json")
@guarded
def import_benchmarks(
    ctx: typer.Context,
    source: list[str] = typer.Option(
        None, "--source", "-s", help="Only this source (repeatable): lambda_pytorch, "
        "lambda_tensorflow, gavel, sia, vectorlm. Default: all.", show_default=False),
    include_flagged: bool = typer.Option(
        False, "--include-flagged", help="Also import the rows the sources flag as suspect."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Import the shipped public throughput measurements into the store as attempts.

    One succeeded attempt per measured configuration (see `leap.datasets.to_attempts` for
    the mapping: family = source/table/model/precision). Importing twice adds nothing. The
    hardware must be in your catalog: without --catalog the shipped benchmark catalog is
    used, and later commands need it too (the message says how).
    """
    import pandas as pd

    from leap.data.ingest import ingest_table
    from leap.data.store import Store
    from leap.datasets import benchmark_catalog, benchmark_catalog_path, load_throughput
    from leap.datasets import to_attempts as map_rows

    ws = workspace(ctx)
    path = benchmark_catalog_path()
    chosen = list(dict.fromkeys(source)) if source else [None]
    frames = [load_throughput(s, include_flagged=include_flagged) for s in chosen]
    rows = pd.concat(frames, ignore_index=True)
    if ws.catalog_path is not None:
        catalog = Catalog.load(ws.catalog_path)
        missing = sorted(set(rows["hardware"]) - set(catalog.names))
        if missing:
            raise CatalogError(
                f"catalog {ws.catalog_path} lacks {len(missing)} hardware type(s) the benchmark "
                f"rows use ({', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}); "
                f"append the hardware tables of {path} to it, or run with "
                f"`leap --catalog {path} import-benchmarks`")
        note = ""
    else:
        catalog = benchmark_catalog()
        note = (f"these attempts use accelerator types outside the default catalog: pass "
                f"`--catalog {path}` to later commands, or copy it to {ws.home / 'catalog.toml'}")
    origin = "import-benchmarks " + (",".join(source) if source else "all") + (
        " include-flagged" if include_flagged else "")
    table = map_rows(rows)
    with Store(ws.ensure().store_path) as store:
        report = ingest_table(store, table, catalog, origin=origin)
        stored = store.count()
    by_source = rows.groupby("source").size().to_dict()
    if as_json:
        print_json({"store": str(ws.store_path), "rows_by_source": by_source,
                    "report": report.to_dict(), "attempts_in_store": stored,
                    "catalog": str(ws.catalog_path or path), "note": note})
        return
    out = Table(title="benchmark rows imported", title_justify="left")
    for name in ("source", "rows"):
        out.add_column(name, justify="right" if name == "rows" else "left")
    for s, n in by_source.items():
        out.add_row(s, f"{n:,}")
    console.print(out)
    console.print(f"added {report.added:,}, already stored {report.already_stored:,}, "
                  f"quarantined {report.quarantined:,}; {stored:,} attempts in {ws.store_path}")
    if note:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)


def evaluate_real_data(*, workers: int | None, quiet: bool, without_architecture: bool = False,
                       **options: Any) -> RealDataResult:
    """:func:`leap.eval.real_data.run_real_data` on the packaged data, with a progress bar.

    ``workers`` processes run the folds (default: one per CPU), each of the learned
    predictor's fits on its share of the cores; ``without_architecture`` also scores the learned
    predictor with the architecture summaries blanked; ``options`` go to ``run_real_data``.
    """
    from leap.datasets import load_throughput
    from leap.eval.parallel import Parallel, default_workers
    from leap.eval.real_data import default_predictors, run_real_data

    par = Parallel(workers=workers if workers is not None else default_workers(1))
    with Progress(TextColumn("{task.description:<44}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("folds"), TimeElapsedColumn(), console=err_console,
                  transient=True, disable=quiet) as bar:
        task = bar.add_task("real-data evaluation", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        return run_real_data(load_throughput(), parallel=par, progress=progress,
                             predictors=default_predictors(
                                 without_architecture=without_architecture,
                                 threads=par.task_threads(2)), **options)


@experiment_app.command("real-data", epilog=(
    "Example:  leap experiment real-data --source lambda_pytorch --out reports/real --json"))
@guarded
def real_data(
    ctx: typer.Context,
    out: Path = typer.Option(
        None, "--out", help="Directory for real_data.json and real_data.html. "
        "Default: <home>/work/reports.", show_default=False),
    source: list[str] = typer.Option(
        None, "--source", "-s", help="Only this source (repeatable). Default: all.",
        show_default=False),
    protocol: list[str] = typer.Option(
        None, "--protocol", "-p", help="Only this protocol (repeatable): held_out_cells, "
        "unseen_hardware, unseen_model, scaling, newest_types. Default: all.",
        show_default=False),
    folds: int = typer.Option(10, "--folds", min=2, help="Folds of held_out_cells."),
    seed: int = typer.Option(0, "--seed", help="Seed dealing cells into folds."),
    include_flagged: bool = typer.Option(
        False, "--include-flagged", help="Keep the rows the sources flag as suspect."),
    workers: int = typer.Option(
        None, "--workers", min=1, help="Processes for the folds (default: one per CPU; "
        "each of the learned predictor's fits then runs on its share of the cores).",
        show_default=False),
    without_architecture: bool = typer.Option(
        False, "--without-architecture", help="Also score leap with the rows' architecture "
        "summaries (parameters, FLOPs per sample ...) left blank, as the sources publish "
        "them: what the filled-in architectures change. Doubles leap's time."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Score the predictor and its baselines on public measured throughput, per source.

    Protocols: held-out cells, unseen hardware, unseen model, multi-device scaling. Methods:
    lookup table, peak-spec scaling (FLOP/s, bandwidth, both, whichever binds), k-NN, linear
    scaling, and the learned predictor when one is wired in. With Lambda PyTorch among the
    sources, also reproduces the reference spec-ratio figures and checks the ranking by
    samples per dollar on public prices. Writes real_data.json and an HTML section.
    """
    from leap.eval.real_data import PROTOCOLS, html_section
    from leap.eval.tables import real_data_reference_lines, real_data_tables

    ws = workspace(ctx)
    target = out if out is not None else ws.work_dir / "reports"
    result = evaluate_real_data(workers=workers, quiet=as_json,
                                without_architecture=without_architecture,
                                sources=source or None,
                                protocols=protocol or PROTOCOLS, n_folds=folds, seed=seed,
                                include_flagged=include_flagged)
    target.mkdir(parents=True, exist_ok=True)
    json_path = target / "real_data.json"
    html_path = target / "real_data.html"
    data = result.to_dict()
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    html_path.write_text(html_section(result) + "\n", encoding="utf-8")
    if as_json:
        print_json(data)
        return
    tables = real_data_tables(result)
    ranking = [t for t in tables if t.key == "real_data_ranking"]
    print_tables([t for t in tables if t.key != "real_data_ranking"])
    lines = real_data_reference_lines(result)
    if lines:
        console.print("[bold]reference check[/] (Lambda PyTorch, 1 GPU, each type held out):")
        for line in lines:
            console.print(f"  {line}")
    print_tables(ranking)
    for line in result.verdicts:
        console.print(f"  {line}")
    console.print(f"wrote {json_path} and {html_path}")
