"""The `leap` command line: thin commands that parse, call the library and print.

Each command group lives in its own module (``cli/data.py``, ``cli/sim.py`` ...) and registers
itself on :data:`app`. This module is the only place library errors become exit codes.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from leap.config import DEFAULT_HOME, Workspace
from leap.errors import ConfigError, LeapError, ParamError

if TYPE_CHECKING:
    from leap.eval.tables import Table
    from leap.records import Record

app = typer.Typer(
    name="leap",
    help="Predict training throughput on every accelerator type before launch, "
    "and rank the types by value (samples per unit cost).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


@app.callback()
def _root(
    ctx: typer.Context,
    home: Path = typer.Option(
        None, "--home", help="Workspace directory (store + models). Default: $LEAP_HOME or ./.leap",
        show_default=False,
    ),
    catalog: Path = typer.Option(
        None, "--catalog", help="Your hardware catalog TOML (overrides/extends the default). "
        "Default: $LEAP_CATALOG or <home>/catalog.toml if present.", show_default=False,
    ),
) -> None:
    home_path = home or Path(os.environ.get("LEAP_HOME", str(DEFAULT_HOME)))
    catalog_path = catalog or (Path(os.environ["LEAP_CATALOG"]) if os.environ.get("LEAP_CATALOG")
                               else None)
    if catalog_path is None and (home_path / "catalog.toml").exists():
        catalog_path = home_path / "catalog.toml"
    ctx.obj = Workspace(home=home_path, catalog_path=catalog_path)


def workspace(ctx: typer.Context) -> Workspace:
    ws = ctx.obj
    assert isinstance(ws, Workspace)
    return ws


#: The flag of each library parameter a :class:`~leap.errors.ParamError` may name.
FLAGS: dict[str, str] = {
    "nights": "--nights", "end": "--end", "window_days": "--window-days",
    "as_of": "--as-of", "source": "--model-source", "type_share": "--type-share",
    "dask": "--dask", "workers": "--workers", "budget": "--budget", "budgets": "--budgets",
    "hardware": "--hardware", "trial_hours": "--trial-hours", "type_discount": "--type-discount",
    "sample": "--sample", "home": "--home", "scenario": "--scenario", "force": "--force",
}


def parse_day(value: str | None, option: str = "--as-of") -> datetime | None:
    """A YYYY-MM-DD option as UTC midnight (None passes through)."""
    if value is None:
        return None
    try:
        d = datetime.strptime(value, "%Y-%m-%d")
    except ValueError:
        raise ConfigError(f"{option} must be a date like 2026-01-31, got {value!r}") from None
    return d.replace(tzinfo=UTC)


def require_store(ws: Workspace) -> None:
    """Refuse, with the way out, a command that reads a store the workspace does not have."""
    if not ws.store_path.exists():
        raise ConfigError(f"no attempt store at {ws.store_path}; run `leap ingest` or "
                          "`leap simulate` first (or pass --home)")


def error_text(exc: LeapError) -> str:
    """The message of a library error as a CLI user reads it: parameters named by flag."""
    return exc.render(FLAGS) if isinstance(exc, ParamError) else str(exc)


def guarded(fn: F) -> F:
    """Turn library errors into one red line on stderr and exit code 1 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LeapError as exc:
            err_console.print(f"[bold red]error:[/] {error_text(exc)}", highlight=False,
                              soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def print_tables(tables: Iterable[Table]) -> None:
    """Print :mod:`leap.eval.tables` tables: label columns left, figures right.

    A table too wide for the terminal whose rows fit as columns is printed turned: one
    column per row (headed by its labels), one line per figure.
    """
    from rich.measure import Measurement
    from rich.table import Table as RichTable

    for t in tables:
        table = RichTable(title=t.title, title_justify="left")
        for i, col in enumerate(t.columns):
            table.add_column(col, justify="left" if i < t.labels else "right",
                             no_wrap=i < t.labels)
        for row in t.rows:
            table.add_row(*row)
        unbounded = console.options.update_width(1 << 16)
        if Measurement.get(console, unbounded, table).maximum > console.width:
            turned = _turned(t)
            if Measurement.get(console, unbounded, turned).maximum <= console.width:
                table = turned
        console.print(table)


def _turned(t: Table) -> Any:
    """``t`` with rows and columns swapped (see :func:`print_tables`)."""
    from rich.table import Table as RichTable

    turned = RichTable(title=t.title, title_justify="left")
    turned.add_column("", no_wrap=True)
    for row in t.rows:
        turned.add_column(" ".join(c for c in row[:t.labels] if c), justify="right")
    for j in range(t.labels, len(t.columns)):
        turned.add_row(t.columns[j], *(row[j] for row in t.rows))
    return turned


def print_json(obj: Any) -> None:
    """Machine-readable output on stdout (plain JSON, no colour)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def write_study(directory: Path, name: str, result: Record, tables: Iterable[Table], *,
                as_json: bool, seconds: float) -> None:
    """Write a study's result to ``directory/<name>.json`` (where ``leap report`` finds it),
    then print it as JSON (``--json``) or as its ``tables`` and where it went."""
    from leap.eval.backtest import write_json_atomic

    directory.mkdir(parents=True, exist_ok=True)
    data = result.to_dict()
    write_json_atomic(directory / f"{name}.json", data)
    if as_json:
        print_json(data)
        return
    print_tables(tables)
    console.print(f"wrote {directory / f'{name}.json'}; {seconds:.0f} s")


def _register() -> None:
    # Imported for their side effect of adding commands to `app`; each module owns its commands.
    # The order here is the order of `leap --help`.
    import importlib

    for mod in ("data", "sim", "model", "rank", "describe", "ops", "evaluate", "boundaries",
                "bench_data", "trials", "demo"):
        importlib.import_module(f"leap.cli.{mod}")


def main() -> None:
    _register()
    app()
