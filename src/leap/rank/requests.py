"""Validation of a ranking request: the job, the candidates, the objective and options.

Only the edges raise (with ``strict``); :class:`~leap.rank.ranker.Ranker` turns these errors
into a fail-open answer otherwise.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.jobs import (
    MODEL_CONFIG,
    REQUIRED_JOB,
    check_job,
    check_jobs_frame,
    expand_model_config,
    plain_values,
)
from leap.errors import CatalogError, ConfigError, DataError, did_you_mean
from leap.features.encode import job_values, jobs_frame, values_frame
from leap.rank.results import OBJECTIVES, Excluded

#: The one job validation every entry point uses (:func:`leap.data.jobs.check_job`), under
#: the name the ranker has always exported.
normalize_job = check_job


def _check_objective(objective: str, max_cost_per_hour: float | None) -> None:
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                          f"{objective!r}")
    if max_cost_per_hour is not None and not (
            isinstance(max_cost_per_hour, int | float) and not isinstance(max_cost_per_hour, bool)
            and 0 < max_cost_per_hour < math.inf):
        raise ConfigError(f"max_cost_per_hour must be a positive number, got "
                          f"{max_cost_per_hour!r}")


def _check_free_devices(free_devices: Mapping[str, float] | None) -> None:
    if free_devices is None:
        return
    if not isinstance(free_devices, Mapping):
        raise DataError(f"free_devices must map hardware names to device counts, got "
                        f"{free_devices!r}")
    for name, n in free_devices.items():
        if not isinstance(n, int | float | np.integer | np.floating) or isinstance(n, bool) \
                or not n >= 0:
            raise DataError(f"free_devices['{name}'] must be a number >= 0, got {n!r}")


def resolve_candidates(costs: Catalog | None, model_catalog: Catalog | None,
                       candidates: Sequence[str] | None, strict: bool
                       ) -> tuple[list[str], list[Excluded]]:
    """The candidate names to rank (default: every type of ``costs``) and the unknown ones.

    An unknown name is a :class:`~leap.errors.CatalogError` with a suggestion when ``strict``,
    else an ``unknown_hardware`` exclusion; a malformed list is a
    :class:`~leap.errors.DataError`.
    """
    if candidates is None:
        return (list(costs) if costs is not None else []), []
    if isinstance(candidates, str) or not all(isinstance(c, str) for c in candidates):
        raise DataError("candidates must be a list of hardware names, got "
                        f"{candidates!r}")
    if len(candidates) == 0:
        raise DataError("candidates is empty; omit it to rank every catalog type")
    names = list(dict.fromkeys(candidates))
    if costs is None:
        return names, []
    # An ordered list (not a set): the did-you-mean suggestion must be deterministic.
    known = list(dict.fromkeys([*costs, *(model_catalog or [])]))
    out: list[str] = []
    unknown: list[Excluded] = []
    for n in names:
        if n in known:
            out.append(n)
            continue
        msg = f"unknown hardware '{n}'{did_you_mean(n, known)}"
        if strict:
            raise CatalogError(f"candidates: {msg}")
        unknown.append(Excluded(n, "unknown_hardware", msg))
    return out, unknown


def jobs_request(jobs: pd.DataFrame | Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """A batch prediction's jobs as one checked frame (records: each job checked and its
    ``model_config`` expanded; a frame: :func:`~leap.data.jobs.check_jobs_frame`)."""
    if isinstance(jobs, pd.DataFrame):
        return check_jobs_frame(jobs)
    records = list(jobs)
    if all(type(r) is dict and MODEL_CONFIG not in r for r in records):
        values = job_values(records)
        if plain_values(values):
            # Typed whole and checked a column at a time (the same rules, a tenth of the time
            # on thousands of jobs); a bad value (or a count past int64) is named below,
            # record by record, as always.
            with contextlib.suppress(DataError, OverflowError):
                return check_jobs_frame(values_frame(values))
    for i, rec in enumerate(records):
        try:
            records[i] = expand_model_config(rec)
            check_job(records[i])
        except DataError as exc:
            raise DataError(f"jobs row {i}: {exc}") from None
    return jobs_frame(records)


def check_jobs_for(frame: pd.DataFrame, catalog: Catalog) -> None:
    """Every ``hardware`` a job names is in the model's ``catalog``, and every required
    field is there."""
    if "hardware" in frame.columns:
        for hw in frame["hardware"].dropna().unique():
            if str(hw) not in catalog:
                raise CatalogError(f"jobs: unknown hardware '{hw}'"
                                   f"{did_you_mean(str(hw), catalog)}")
    missing = [c for c in REQUIRED_JOB if c not in frame.columns]
    if missing:
        raise DataError(f"jobs lack required field(s) {', '.join(missing)}")
