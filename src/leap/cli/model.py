"""CLI: `leap train`, `leap models ...`, `leap predict`, `leap check-features`."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from leap.cli import (
    app,
    console,
    guarded,
    parse_day,
    print_json,
    require_store,
    workspace,
)
from leap.errors import ConfigError
from leap.metrics import si

models_app = typer.Typer(help="List published model versions and roll back.",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


def _pct(x: Any) -> str:
    return "—" if x is None or x != x else f"{100 * float(x):.1f}%"


@app.command(epilog="Example: leap --home /tmp/x train --as-of 2026-01-31 --window-days 30")
@guarded
def train(
    ctx: typer.Context,
    as_of: str = typer.Option(None, "--as-of", help="Held-out day (YYYY-MM-DD): train on the "
                              "window before it, evaluate on it. Default: the day after the "
                              "last full day in the store, ignoring attempts stamped after "
                              "now."),
    window_days: int = typer.Option(30, "--window-days", min=2, help="Days of attempts to "
                                    "train on."),
    model: str = typer.Option("cascade", "--model", help="cascade (router + specialists) "
                              "or global (one model)."),
    specialists: int = typer.Option(13, "--specialists", min=2, help="K for the cascade."),
    objective: str = typer.Option("quantile", "--objective", help="quantile (median) or l2."),
    no_history: bool = typer.Option(False, "--no-history", help="Ablation: drop the history "
                                    "features."),
    quality_margin: float = typer.Option(0.02, "--quality-margin", help="Refuse to publish "
                                         "if held-out accuracy is this much below the "
                                         "current model's."),
    force: bool = typer.Option(False, "--force", help="Publish even if the quality gate "
                               "refuses."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Train and evaluate; publish "
                                 "nothing."),
    dask: str = typer.Option(None, "--dask", help="Train on a Dask cluster: 'local' (a "
                             "LocalCluster on this machine) or a scheduler address "
                             "(tcp://HOST:8786). Default: in this process."),
    workers: int = typer.Option(2, "--workers", min=1, help="Worker processes of "
                                "--dask local."),
    export_dir: Path = typer.Option(None, "--export-dir", help="With --dask: where to export "
                                    "the window as Parquet; must be reachable by every "
                                    "worker. Default: a temporary directory (local cluster "
                                    "only)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Train the nightly model on the window before --as-of and publish it.

    The days it encodes and the pair models it fits are kept in <home>/cache for the next
    night, which reads what was made from the same attempts instead of making it again
    (in this process or on --dask local; a remote cluster's workers do not reach it).
    """
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.model.artifact import Registry
    from leap.model.train import train_nightly
    from leap.model.window import NightCache, TrainConfig

    ws = workspace(ctx)
    cfg = TrainConfig(window_days=window_days, model_kind=model, n_specialists=specialists,
                      objective=objective, use_history=not no_history,
                      quality_margin=quality_margin)
    catalog = Catalog.load(ws.catalog_path)
    require_store(ws)
    with Store(ws.store_path, read_only=True) as store:
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=console, disable=as_json, transient=True) as bar:
            tasks: dict[str, Any] = {}

            def progress(stage: str, done: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(stage, total=total)
                bar.update(tasks[stage], completed=done, total=total)

            with ExitStack() as stack:
                client = None
                if dask is not None:
                    from leap.model.distributed import dask_client

                    client = stack.enter_context(dask_client(dask, workers))
                elif export_dir is not None:
                    raise ConfigError("--export-dir is for --dask runs; add --dask local or "
                                      "--dask tcp://HOST:8786")
                result = train_nightly(store, catalog, Registry(ws.models_dir),
                                       as_of=parse_day(as_of), cfg=cfg, publish=not dry_run,
                                       force=force, progress=progress, now=datetime.now(UTC),
                                       dask_client=client, export_dir=export_dir,
                                       disk_cache=NightCache.at(ws.cache_dir)
                                       if dask in (None, "local") else None)
        out = result.to_json()
        if result.metrics.held_out is not None:
            from leap.eval.oracle import day_ceiling

            ceiling = day_ceiling(store, catalog, result.as_of)
            if ceiling is not None:
                out["metrics"]["held_out"]["oracle_ceiling"] = ceiling
    if as_json:
        print_json(out)
        return
    print_train(out)


def print_train(out: dict[str, Any]) -> None:
    """The terminal summary of a training run (``leap train`` and ``leap demo``)."""
    m = out["metrics"]
    console.print(f"window {m['window']['start'][:10]} .. {m['window']['end'][:10]} "
                  f"({m['train_rows']:,} succeeded attempts)")
    held = m.get("held_out")
    if held:
        t = Table(title=f"held-out day {held['day']}")
        for col in ("rows", "accuracy ±20%", "GPU-hour weighted", "median APE"):
            t.add_column(col, justify="right")
        t.add_column("slice")
        for name, blk in (("all", held), ("seen families", held["seen_families"]),
                          ("unseen families", held["unseen_families"])):
            t.add_row(f"{int(blk['n']):,}", _pct(blk["accuracy"]),
                      _pct(blk.get("accuracy_gpu_hours")), _pct(blk["median_ape"]), name)
        console.print(t)
        if held.get("novelty"):
            groups = {}
            for name, g in held["novelty"].items():
                groups[name] = g
                # The new shapes at a trainer count new to their pair: a subset, indented.
                if name == "seen_pair_new_shape" and held.get("new_trainer_count"):
                    groups["  new trainer count"] = \
                        held["new_trainer_count"]
            console.print(_novelty_table(groups))
        if "oracle_ceiling" in held:
            console.print(f"oracle ceiling (simulator truth within ±20%): "
                          f"{_pct(held['oracle_ceiling'])}")
    else:
        console.print("[yellow]no held-out day in the store: accuracy not measured[/]")
    gate = out["quality_gate"]
    if out["published"]:
        console.print(f"[green]published[/] model {out['version']}")
    else:
        console.print("dry run: nothing published")
    if gate.get("current_accuracy") is not None:
        console.print(f"quality gate: new {_pct(gate['new_accuracy'])} vs current "
                      f"{gate['current_version']} {_pct(gate['current_accuracy'])}")
    t = out["timings_s"]
    console.print("time: " + ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in t.items()))
    if "cache" in out:
        c = out["cache"]
        console.print(f"kept between nights (<home>/cache): {c['days_read']} days read, "
                      f"{c['days_encoded']} encoded; pair models {c['pair_models_read']} "
                      f"read, {c['pair_models_fit']} fit")


#: The novelty groups (:data:`leap.features.encode.NOVELTY_GROUPS`) as the CLI's tables name
#: them ("new type (2)": the family never ran on this type, and ran on 2 others); files and
#: JSON keep the names themselves.
NOVELTY_LABELS = {"seen_config": "seen config", "seen_pair_new_shape": "new shape",
                  "unobserved_pair_1": "new type (1)", "unobserved_pair_2": "new type (2)",
                  "unobserved_pair_3plus": "new type (3+)", "new_family": "new family"}


def _span(ci: Any) -> str:
    return "" if not ci else f" ({100 * ci[0]:.0f}–{100 * ci[1]:.0f})"


def _novelty_table(groups: dict[str, Any]) -> Table:
    """The held-out day by novelty group, with family-resampled 90% confidence intervals."""
    t = Table(title="by novelty group (90% confidence: families resampled)")
    for col in ("rows", "families", "accuracy ±20%", "in 80% interval"):
        t.add_column(col, justify="right")
    t.add_column("group")
    for name, g in groups.items():
        fams = g.get("effective_families")
        t.add_row(f"{int(g['n']):,}", "—" if fams is None else f"{fams:,.0f}",
                  _pct(g["accuracy"]) + _span(g.get("accuracy_ci")),
                  _pct(g.get("interval_coverage")) + _span(g.get("interval_coverage_ci")),
                  NOVELTY_LABELS.get(name, name))
    return t


@models_app.command("list", epilog="Example: leap models list --json")
@guarded
def models_list(ctx: typer.Context,
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List published model versions; the one serving is marked."""
    import json

    from leap.model.artifact import MANIFEST, Registry

    reg = Registry(workspace(ctx).models_dir)
    latest = reg.latest_version()
    rows = []
    for v in reg.versions():
        try:
            man = json.loads((reg.path(v) / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            man = {"model_kind": "unreadable manifest (corrupt)"}
        if not isinstance(man, dict):
            man = {"model_kind": "unreadable manifest (corrupt)"}
        held = man.get("metrics", {}).get("held_out", {})
        rows.append({"version": v, "latest": v == latest, "as_of": man.get("as_of"),
                     "model_kind": man.get("model_kind"), "accuracy": held.get("accuracy"),
                     "created_at": man.get("created_at")})
    if as_json:
        print_json({"latest": latest, "versions": rows})
        return
    if not rows:
        console.print("no published models yet; run `leap train`")
        return
    t = Table()
    for c in ("", "version", "as of", "kind", "held-out accuracy", "created (UTC)"):
        t.add_column(c, no_wrap=True)
    for r in rows:
        t.add_row("*" if r["latest"] else "", r["version"], str(r["as_of"])[:10],
                  str(r["model_kind"]), _pct(r["accuracy"]),
                  str(r["created_at"])[:16].replace("T", " "))
    console.print(t)


@models_app.command("rollback", epilog="Example: leap models rollback --to 20260130-01")
@guarded
def models_rollback(ctx: typer.Context,
                    to: str = typer.Option(None, "--to", help="Version to serve (default: "
                                           "the one before the current).")) -> None:
    """Point `latest` back at an earlier version (the server picks it up without restart).

    The version is first loaded and checked against its recorded probe predictions in a
    separate process; one that fails is refused and `latest` does not move.
    """
    from leap.model.artifact import Registry

    reg = Registry(workspace(ctx).models_dir)
    version = reg.rollback(to)  # loads and verifies the version in a child process first
    console.print(f"latest is now {version}")


@app.command(epilog="Example: leap predict jobs.csv --candidates H100-SXM,A100-SXM4-80GB "
             "--out predictions.csv")
@guarded
def predict(
    ctx: typer.Context,
    jobs_file: Path = typer.Argument(..., help="Jobs (CSV, Parquet or JSON Lines). Rows with "
                                     "a hardware column are scored on it; otherwise on "
                                     "every --candidates type."),
    candidates: str = typer.Option(None, "--candidates", help="Comma-separated types for "
                                   "rows without hardware (default: the whole catalog)."),
    out: Path = typer.Option(None, "--out", help="Write predictions here (.csv or .parquet) "
                             "instead of printing."),
    version: str = typer.Option(None, "--version", help="Model version (default: latest)."),
    model_config: Path = typer.Option(None, "--model-config", help="A model's config.json for "
                                      "every row: fills the architecture fields rows leave "
                                      "empty (a JSON Lines row may carry its own "
                                      "\"model_config\" object instead)."),
) -> None:
    """Predict samples/s for each (job, hardware) row with the published model."""
    from leap.model.imports import without_sklearn

    without_sklearn()
    from leap.data.jobs import fill_from_model_configs
    from leap.model.artifact import Registry
    from leap.model.predict import predict_frame, read_jobs

    config = None
    if model_config is not None:
        from leap.arch import read_model_config

        config = read_model_config(model_config)
    jobs = read_jobs(jobs_file)
    if config is not None:
        jobs = fill_from_model_configs(jobs, config)
    art = Registry(workspace(ctx).models_dir).load(version)
    names = [c.strip() for c in candidates.split(",")] if candidates else None
    frame = predict_frame(art, jobs, names)
    if out is None:
        _print_predictions(frame)
        return
    if out.suffix == ".parquet":
        frame.to_parquet(out, index=False)
    else:
        frame.to_csv(out, index=False)
    console.print(f"wrote {len(frame):,} predictions to {out}")


#: Rows `leap predict` prints without --out (the file gets every row and column).
PRINT_ROWS = 50


def _print_predictions(frame: Any) -> None:
    """The first rows of ``frame`` as a table that fits 80 columns: which job, the type, the
    prediction and its 80% range, the novelty group (:data:`NOVELTY_LABELS`)."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, right in (("job", True), ("family_id", False), ("hardware", False),
                        ("samples/s", True), ("80% range", True), ("novelty", False)):
        t.add_column(name, justify="right" if right else "left", no_wrap=True)
    shown = frame.head(PRINT_ROWS)
    for r in shown.itertuples(index=False):
        lo, hi = getattr(r, "throughput_p10", None), getattr(r, "throughput_p90", None)
        t.add_row(str(r.job), str(r.family_id), str(r.hardware), si(r.predicted_throughput),
                  "—" if lo is None or lo != lo else f"{si(lo)}–{si(hi)}",
                  NOVELTY_LABELS.get(r.novelty, str(r.novelty)))
    console.print(t)
    if len(frame) > len(shown):
        console.print(f"... and {len(frame) - len(shown):,} more rows", highlight=False)
    console.print("--out FILE.csv|.parquet writes every row and column (passed-through input "
                  "columns too)", highlight=False)


@app.command("check-features", epilog="Example: leap check-features --as-of 2026-01-31")
@guarded
def check_features(
    ctx: typer.Context,
    as_of: str = typer.Option(None, "--as-of", help="Day whose attempts are checked "
                              "(default: the last day in the store)."),
    sample: int = typer.Option(1000, "--sample", min=1, help="Attempts to check."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Prove training and serving build identical features for the same jobs."""
    from leap.catalog import Catalog
    from leap.data.store import Store
    from leap.errors import ArtifactError
    from leap.model.artifact import Registry
    from leap.model.parity import check_parity

    ws = workspace(ctx)
    spec = None
    catalog = Catalog.load(ws.catalog_path)
    try:
        art = Registry(ws.models_dir).load()
        spec, catalog = art.spec, art.catalog
    except ArtifactError:
        pass  # no model yet: check every feature leap can compute
    with Store(ws.store_path, read_only=True) as store:
        report = check_parity(store, catalog, as_of=parse_day(as_of), sample=sample, spec=spec)
    if as_json:
        print_json(report.to_json())
    else:
        console.print(f"{report.rows:,} attempts of {report.as_of:%Y-%m-%d}, "
                      f"{report.features} features")
        for label, items in (("differ between training and serving", report.mismatched_features),
                             ("change with the outcome", report.outcome_sensitive_features),
                             ("cannot be supplied by a request", report.unsuppliable_features)):
            if items:
                console.print(f"[red]features that {label}:[/] {items}")
        if report.ok:
            console.print("[green]ok[/]: training and serving features are identical")
    if not report.ok:
        raise typer.Exit(1)
