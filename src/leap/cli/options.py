"""Options and settings shared by the commands that train and evaluate (`leap backtest`,
`leap report`, `leap experiment ...`)."""

from __future__ import annotations

from typing import Any

import typer


def window_opt() -> Any:
    return typer.Option(30, "--window-days", min=2, help="Days of attempts each night trains on.")


def model_opt() -> Any:
    return typer.Option("cascade", "--model", help="cascade (router + specialists) or global "
                        "(one model): the backtest costs what this model costs per night.")


def specialists_opt() -> Any:
    return typer.Option(13, "--specialists", min=2, help="K for the cascade.")


def no_history_opt() -> Any:
    return typer.Option(False, "--no-history", help="Ablation: drop the history features.")


def workers_opt() -> Any:
    return typer.Option(None, "--workers", min=1, help="Local processes for the nights "
                        "(default: CPUs / 2, as each fit runs 2 LightGBM threads; 1 runs in "
                        "this process).", show_default=False)


def dask_opt() -> Any:
    return typer.Option(None, "--dask", help="Run the nights on Dask: 'local' for a "
                        "LocalCluster of --workers processes, or a scheduler address "
                        "tcp://HOST:PORT (workers must see the store path).",
                        show_default=False)


def as_of_opt() -> Any:
    return typer.Option(None, "--as-of", help="Held-out day (YYYY-MM-DD). Default: the "
                        "published model's day, else the last full day in the store.",
                        show_default=False)


def source_opt() -> Any:
    return typer.Option("auto", "--model-source", help="auto (a kept or published model for "
                        "the day, else train), published, or train.")


def train_config(window_days: int, model: str, specialists: int, no_history: bool) -> Any:
    from leap.model.window import TrainConfig

    return TrainConfig(window_days=window_days, model_kind=model, n_specialists=specialists,
                       use_history=not no_history)


def parallel(workers: int | None, dask: str | None) -> Any:
    from leap.eval.parallel import Parallel, default_workers

    return Parallel(workers=workers if workers is not None else default_workers(), dask=dask)

