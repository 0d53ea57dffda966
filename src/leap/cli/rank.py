"""CLI: `leap rank` (one job's preference list) and `leap serve` (the HTTP service)."""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from leap.cli import app, console, err_console, guarded, print_json, workspace
from leap.config import Workspace
from leap.errors import ConfigError, DataError
from leap.metrics import si
from leap.serve.batching import MAX_BATCH

DEFAULT_PORT = 8787


def read_request(path: Path) -> dict[str, Any]:
    """A rank request from a JSON file (``-`` = stdin): a bare job, or ``{"job": ...}``."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text("utf-8")
    except OSError as exc:
        raise DataError(f"cannot read job file {path}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise DataError(f"{path}: expected a JSON object (a job, or {{\"job\": {{...}}}}), got "
                        f"{type(doc).__name__}")
    return doc if isinstance(doc.get("job"), dict) else {"job": doc}


def _validate(request: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from leap.serve.payloads import RankRequest

    try:
        return RankRequest.model_validate(request)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        got = repr(first.get("input"))
        raise DataError(f"{where}: {first['msg']} (got {got[:80]})") from None


def _costs(ws: Workspace) -> Any:
    from leap.catalog import Catalog

    # Your catalog's prices apply without retraining; without one, the model's snapshot.
    return Catalog.load(ws.catalog_path) if ws.catalog_path else None


@app.command(epilog="Example: leap rank --job job.json --candidates H100-SXM,A100-SXM4-80GB,L4 "
             "--json   (for your scheduler: --format skypilot|kubernetes|slurm)")
@guarded
def rank(
    ctx: typer.Context,
    job: Path = typer.Option(..., "--job", help="JSON file ('-' = stdin) with the job's "
                             "launch-time fields, or a rank request {\"job\": {...}, "
                             "\"candidates\": [...]}."),
    candidates: str = typer.Option(None, "--candidates", help="Comma-separated eligible "
                                   "types (default: the whole catalog)."),
    objective: str = typer.Option(None, "--objective", help="value (samples per unit cost, "
                                  "default) or throughput (fastest within the budget)."),
    max_cost_per_hour: float = typer.Option(None, "--max-cost-per-hour", help="Budget: leave "
                                            "out types that cost more per hour."),
    risk: str = typer.Option(None, "--risk", help="cautious (default: the cheapest type "
                             "first unless a dearer one is confidently better), neutral (by "
                             "the median prediction) or averse (by the low end of each type's "
                             "80% interval)."),
    premium_min_speedup: float = typer.Option(1.25, "--premium-min-speedup", help="Speed-up "
                                              "a premium type needs when the job has no "
                                              "flops_per_sample."),
    version: str = typer.Option(None, "--version", help="Model version, a name from `leap "
                                "models list` (default: latest)."),
    model_config: Path = typer.Option(None, "--model-config", help="The model's config.json: "
                                      "fills the architecture fields the job leaves empty "
                                      "(see `leap describe-model`)."),
    as_json: bool = typer.Option(False, "--json", help="Print the HTTP response object."),
    fmt: str = typer.Option(None, "--format", help="Print the preference list for your "
                            "scheduler: skypilot (resources.ordered), kubernetes (pod "
                            "nodeAffinity preferences) or slurm (#SBATCH lines per choice). "
                            "Names come from the catalog (overridable)."),
    record: bool = typer.Option(False, "--record", help="Record this ranking in the decision "
                                "log (<home>/decisions.duckdb; see `leap monitor`)."),
) -> None:
    """Rank the eligible accelerator types of one job by value (the preference list)."""
    from leap.model.imports import without_sklearn

    without_sklearn()
    from leap.model.artifact import Registry
    from leap.rank.ranker import Ranker
    from leap.serve.payloads import RankResponse

    request = read_request(job)
    if model_config is not None:
        from leap.arch import read_model_config

        request["job"].setdefault("model_config", read_model_config(model_config))
    if candidates:
        request["candidates"] = [c.strip() for c in candidates.split(",") if c.strip()]
    if objective is not None:
        request["objective"] = objective
    if max_cost_per_hour is not None:
        request["max_cost_per_hour"] = max_cost_per_hour
    if risk is not None:
        request["risk"] = risk
    if fmt is not None:
        from leap.rank.formats import check_format

        check_format(fmt)
    req = _validate(request)
    ws = workspace(ctx)
    # A version is a name in the models folder (a path is refused with a clear message); one
    # that fails verification fails open below (an empty ranking with the reason).
    ranker = Ranker(Registry(ws.models_dir), costs=_costs(ws),
                    premium_min_speedup=premium_min_speedup, background_reload=False,
                    version=version)
    decisions = None
    if record:
        from leap.rank.decisions import DecisionLog, decisions_path

        decisions = DecisionLog(decisions_path(ws.ensure().home), retention_days=None)
        ranker.decision_sink = decisions.sink("cli")
    try:
        result = ranker.rank(req.job.launch_fields(), req.candidates, objective=req.objective,
                             max_cost_per_hour=req.max_cost_per_hour, risk=req.risk,
                             strict=True)
    finally:
        if decisions is not None:
            decisions.close()
    if decisions is not None and decisions.written < decisions.recorded:
        err_console.print(f"[yellow]warning:[/] the decision was not recorded: "
                          f"{decisions.last_error}", highlight=False)
    out = RankResponse.model_validate(result.to_dict()).model_dump(mode="json")
    if fmt is not None:
        from leap.catalog import Catalog
        from leap.rank.formats import render

        text = render(fmt, out, req.job.launch_fields(), Catalog.load(ws.catalog_path))
        if as_json:
            print_json({**out, "format": fmt, "formatted": text})
        else:
            sys.stdout.write(text)
        return
    if as_json:
        print_json(out)
        return
    _print_ranking(out)


#: One-character codes of a ranked entry's flags (:data:`leap.rank.policy.FLAGS`), explained
#: in a line under the table, so the table fits an 80-column terminal.
FLAG_CODES = {"missing_family_history": "F", "missing_hardware_history": "T",
              "uncertain": "~", "memory_fit_unknown": "M", "utilization_above_peak": "!",
              "premium_kept_mfu": "P", "premium_kept_speedup": "S", "no_free_devices": "0"}


def ranking_table(ranking: list[dict[str, Any]], *, title: str,
                  truth: Mapping[str, float] | None = None, limit: int | None = None
                  ) -> tuple[Table, str]:
    """A preference list as a table that fits 80 columns, and the legend of its flag codes.

    ``ranking``: the ``ranking`` entries of a result's :meth:`to_dict`; ``truth`` adds a
    column of true samples/s per type (the demo's simulator); ``limit`` shows the first
    entries and says how many more there are.
    """
    from leap.rank.policy import FLAGS  # loaded already: the ranking came from it

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              collapse_padding=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("type", no_wrap=True)
    t.add_column("samples/s", justify="right", no_wrap=True)
    t.add_column("80% range", justify="right", no_wrap=True)
    if truth is not None:
        t.add_column("true", justify="right", no_wrap=True)
    for name in ("$/hour", "per $", "MFU"):
        t.add_column(name, justify="right", no_wrap=True)
    if truth is None:
        t.add_column("speed-up", justify="right", no_wrap=True)
    t.add_column("flags", no_wrap=True)
    shown = ranking if limit is None else ranking[:limit]
    seen: dict[str, str] = {}
    for i, r in enumerate(shown, start=1):
        mfu = r["predicted_utilization"]
        span = "—" if r.get("throughput_p10") is None else \
            f"{si(r['throughput_p10'])}–{si(r['throughput_p90'])}"
        codes = [(FLAG_CODES.get(f, f), FLAGS.get(f, f)) for f in r["flags"]]
        seen.update(codes)
        cells = [str(i), r["hardware"], si(r["predicted_throughput"]), span]
        if truth is not None:
            cells.append(si(truth.get(r["hardware"])))
        cells += [_money(r["cost_per_hour"]), si(r["value"]),
                  "—" if mfu is None else f"{100 * mfu:.0f}%"]
        if truth is None:
            cells.append("—" if r["speedup"] is None else f"{r['speedup']:.2f}x")
        cells.append("".join(dict.fromkeys(code for code, _ in codes)))
        t.add_row(*cells)
    if len(shown) < len(ranking):
        t.caption = f"... and {len(ranking) - len(shown)} more"
    legend = " · ".join(f"{code} {what}" for code, what in seen.items())
    return t, (f"flags: {legend}" if legend else "")


def _money(x: float) -> str:
    """A cost per hour in at most six characters: cents below 100, whole units up to 9,999.

    >>> _money(24.6401), _money(1164.8), _money(23_296.0)
    ('24.64', '1,165', '23.3k')
    """
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}" if x < 9999.5 else si(x)


def _print_ranking(out: dict[str, Any]) -> None:
    if out["reason"]:
        console.print(f"[yellow]no ranking (fail-open):[/] {out['reason']}", highlight=False)
    if out["ranking"]:
        by = "value" if out["objective"] == "value" else "predicted throughput"
        how = {"averse": "at the 80% range's low end",
               "cautious": "the cheapest type first unless confidently beaten"
               }.get(out.get("risk", ""), "at the median")
        t, legend = ranking_table(out["ranking"], title=f"preference list by {by} ({how})")
        console.print(t)
        if legend:
            console.print(legend, highlight=False)
    if out["excluded"]:
        t = Table(title="left out", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("type", "reason", "detail"):
            t.add_column(col)
        for e in out["excluded"]:
            t.add_row(e["hardware"], e["reason"], e["detail"])
        console.print(t)
    if out["ignored_fields"]:
        console.print(f"[yellow]ignored job fields:[/] {', '.join(out['ignored_fields'])}")
    console.print(f"model {out['model_version'] or '—'}, {out['latency_ms']:.1f} ms")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@app.command(epilog="Example: leap serve --port 8787   then   curl -s "
             "http://127.0.0.1:8787/healthz   (OpenAPI at /docs)")
@guarded
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind. Anything but "
                             "loopback needs --token."),
    port: int = typer.Option(DEFAULT_PORT, "--port", min=0, max=65535, help="TCP port."),
    token: str = typer.Option(None, "--token", envvar="LEAP_TOKEN", show_default=False,
                              help="Require 'Authorization: Bearer TOKEN' on every endpoint "
                              "but /healthz (or set LEAP_TOKEN)."),
    insecure_no_token: bool = typer.Option(False, "--insecure-no-token", help="Bind a "
                                           "non-loopback address without a token."),
    check_interval: float = typer.Option(1.0, "--check-interval", min=0.05, help="Seconds "
                                         "between looks for a newly published model."),
    premium_min_speedup: float = typer.Option(1.25, "--premium-min-speedup", help="Speed-up "
                                              "a premium type needs when a job has no "
                                              "flops_per_sample."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    workers: int = typer.Option(1, "--workers", min=1, help="Server processes on the port, "
                                "each with its own copy of the model and (Linux) its own "
                                "socket, the kernel spreading connections over them (use one "
                                "per core to serve more requests/s; /metrics then reports the "
                                "process that answers)."),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, "--max-body-bytes", min=1024,
                                       help="Largest request body; larger ones get a 413."),
    max_predict_rows: int = typer.Option(20_000, "--max-predict-rows", min=1, help="Largest "
                                         "(job, hardware) row count of one /v1/predict call "
                                         "(422 beyond)."),
    max_concurrent_predicts: int = typer.Option(2, "--max-concurrent-predicts", min=1,
                                                help="/v1/predict calls served at once per "
                                                "process; more get a 429 with Retry-After."),
    decision_log: bool = typer.Option(True, "--decision-log/--no-decision-log", help="Record "
                                      "every ranking served in <home>/decisions.duckdb (off "
                                      "the request path; see `leap monitor`)."),
    decision_retention_days: float = typer.Option(90.0, "--decision-retention-days", min=0.001,
                                                  help="Delete recorded decisions older than "
                                                  "this."),
    decision_queue: int = typer.Option(50_000, "--decision-queue", min=1, help="Rankings "
                                       "waiting to be recorded at most; beyond, they are "
                                       "dropped and counted (leap_decisions_dropped_total)."),
    monitor_gauges: bool = typer.Option(False, "--monitor-gauges", help="Also export `leap "
                                        "monitor`'s latest day as leap_monitor_* gauges in "
                                        "/metrics (recomputed at most every 5 minutes; each "
                                        "time the store is opened read-only for a moment)."),
    compiled: bool = typer.Option(False, "--compiled/--no-compiled", help="Score with "
                                  "compiled trees when the 'fast' extra is installed: each "
                                  "model version is compiled once (in the background, minutes "
                                  "of CPU for the reference model; cached beside it) and used "
                                  "only when it reproduces LightGBM."),
    max_rank_batch: int = typer.Option(MAX_BATCH, "--max-rank-batch", min=1, max=256, help="Most "
                                       "/v1/rank requests that arrived together ranked in one "
                                       "pass (same answers, a fraction of the CPU each under "
                                       "load); 1 ranks each alone."),
    malloc_tuning: bool = typer.Option(True, "--malloc-tuning/--no-malloc-tuning",
                                       help="Restart the process with PYTHONMALLOC=malloc and "
                                       "MALLOC_ARENA_MAX=2 (unless set), so memory returns to "
                                       "its level after a burst of large batches."),
) -> None:
    """Serve rank/predict over HTTP; picks up newly published models without a restart."""
    if not _is_loopback(host) and not token and not insecure_no_token:
        raise ConfigError(f"--host {host} exposes the service beyond this machine; set --token "
                          "(or LEAP_TOKEN), or pass --insecure-no-token")
    if malloc_tuning and os.environ.get(_MALLOC_TUNED_ENV) != "1":
        _restart_with_malloc_tuning()
    import uvicorn

    from leap.model.imports import without_sklearn

    without_sklearn()

    ws = workspace(ctx)
    settings = ServeSettings(home=str(ws.home),
                             catalog=str(ws.catalog_path) if ws.catalog_path else None,
                             token=token, check_interval_s=check_interval,
                             premium_min_speedup=premium_min_speedup,
                             max_body_bytes=max_body_bytes, max_predict_rows=max_predict_rows,
                             max_concurrent_predicts=max_concurrent_predicts,
                             decision_log=decision_log,
                             decision_retention_days=decision_retention_days,
                             decision_queue=decision_queue, monitor_gauges=monitor_gauges,
                             compiled=compiled, max_rank_batch=max_rank_batch)
    if workers == 1:
        uvicorn.run(settings.app(announce=True, host=host, port=port), host=host, port=port,
                    log_level=log_level, access_log=False)
        return
    from leap.serve.workers import check_address, reuse_port_supported, run_workers

    # Worker processes import the factory and read these settings from their environment.
    os.environ[SERVE_SETTINGS_ENV] = json.dumps(asdict(settings))
    factory = "leap.cli.rank:app_from_env"
    own_sockets = port != 0 and reuse_port_supported()
    if own_sockets:
        check_address(host, port)  # before the model loads: a taken port fails at once
    # Load once here so errors show now (no decision writer: the workers own theirs).
    settings.app(announce=True, host=host, port=port, announce_only=True)
    if own_sockets:  # each worker on its own socket: the kernel spreads connections
        run_workers(factory, host=host, port=port, workers=workers, log_level=log_level)
    else:
        uvicorn.run(factory, factory=True, workers=workers, host=host, port=port,
                    log_level=log_level, access_log=False)


#: Set once `leap serve` has restarted itself with the allocator settings below.
_MALLOC_TUNED_ENV = "LEAP_SERVE_MALLOC_TUNED"


def _restart_with_malloc_tuning() -> None:
    """Re-execute this command with allocator settings that hand memory back to the OS.

    Measured with bench/bench_predict_memory.py: after 20 maximum-size batches the server's
    RSS stays ~40% above its level with Python's small-object allocator and glibc's per-thread
    arenas (freed memory is kept, fragmented, for reuse), and returns to within a few percent
    with ``PYTHONMALLOC=malloc`` (read only at interpreter start, hence the re-exec) and two
    arenas. Values already in the environment are kept.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONMALLOC", "malloc")
    env.setdefault("MALLOC_ARENA_MAX", "2")
    env[_MALLOC_TUNED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "leap", *sys.argv[1:]], env)


#: The environment variable that hands `leap serve --workers N` settings to its processes.
SERVE_SETTINGS_ENV = "LEAP_SERVE_SETTINGS"


@dataclass(frozen=True)
class ServeSettings:
    """What each server process needs to build its app (plain values, JSON-friendly)."""

    home: str
    catalog: str | None
    token: str | None
    check_interval_s: float
    premium_min_speedup: float
    max_body_bytes: int = 8 * 1024 * 1024
    max_predict_rows: int = 20_000
    max_concurrent_predicts: int = 2
    decision_log: bool = True
    decision_retention_days: float = 90.0
    decision_queue: int = 50_000
    monitor_gauges: bool = False
    compiled: bool = False
    max_rank_batch: int = MAX_BATCH

    def app(self, *, announce: bool = False, host: str = "", port: int = 0,
            announce_only: bool = False) -> Any:
        from leap.model.artifact import Registry
        from leap.rank.ranker import Ranker
        from leap.serve.app import create_app

        ws = Workspace(Path(self.home), Path(self.catalog) if self.catalog else None)
        ranker = Ranker(Registry(ws.models_dir), costs=_costs(ws),
                        premium_min_speedup=self.premium_min_speedup,
                        check_interval_s=self.check_interval_s,
                        # The announcing parent of N workers serves nothing: it compiles
                        # nothing; the workers share one compile (a lock beside the model).
                        compiled=None if announce_only else self.compiled)
        if announce:
            version = ranker.model_version
            if version is None:
                err_console.print(f"[yellow]warning:[/] {ranker.watcher.error}; serving anyway "
                                  "(rank answers fail open until a model is published)",
                                  highlight=False)
            err_console.print(f"leap serving model {version or '—'} on http://{host}:{port} "
                              f"(docs at /docs{', token required' if self.token else ''})",
                              highlight=False)
        from leap.rank.decisions import decisions_path
        from leap.serve.monitor import MonitorCollector

        # The web page and (with monitor_gauges) /metrics read the live figures from here.
        monitor = MonitorCollector(ws.store_path, decisions_path(ws.home), ttl_s=300.0)
        collectors: list[Any] = [monitor] if self.monitor_gauges else []
        decisions = None
        if self.decision_log and not announce_only:
            from leap.rank.decisions import DecisionLog, decisions_path

            decisions = DecisionLog(decisions_path(ws.ensure().home),
                                    retention_days=self.decision_retention_days,
                                    max_queue=self.decision_queue, process=True)
        return create_app(ranker, token=self.token, poll_interval_s=self.check_interval_s,
                          max_body_bytes=self.max_body_bytes,
                          max_predict_rows=self.max_predict_rows,
                          max_concurrent_predicts=self.max_concurrent_predicts,
                          decisions=decisions, extra_collectors=collectors,
                          monitor=monitor, max_rank_batch=self.max_rank_batch, freeze_gc=True)


def app_from_env() -> Any:
    """The app factory each `leap serve --workers N` process calls (via uvicorn)."""
    from leap.model.imports import without_sklearn

    without_sklearn()
    return ServeSettings(**json.loads(os.environ[SERVE_SETTINGS_ENV])).app()
