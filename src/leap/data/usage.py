"""What an attempt counts for: the one usable-attempt filter and the one device-hours rule.

Every study, baseline and report that asks "which attempts measured a throughput?" or "how
many device-hours did this attempt use?" asks here, so the answers agree everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd


def usable_mask(attempts: pd.DataFrame) -> np.ndarray:
    """Attempts that measured a throughput: ``status == "succeeded"`` and ``throughput > 0``.

    A throughput that is not a number counts as missing.

    Examples
    --------
    >>> usable_mask(pd.DataFrame({"status": ["succeeded", "failed", "succeeded"],
    ...                           "throughput": [10.0, None, 0.0]})).tolist()
    [True, False, False]
    """
    tp = pd.to_numeric(attempts["throughput"], errors="coerce")
    return ((attempts["status"] == "succeeded") & (tp > 0)).to_numpy(dtype=bool)


def usable_attempts(attempts: pd.DataFrame, types: Iterable[str]) -> pd.DataFrame:
    """The :func:`usable_mask` rows of ``attempts`` on one of ``types`` (e.g. a catalog: a
    type it lacks cannot be scored), renumbered from 0."""
    ok = usable_mask(attempts) & attempts["hardware"].isin(list(types)).to_numpy(dtype=bool)
    return attempts[ok].reset_index(drop=True)


def job_devices(jobs: pd.DataFrame) -> np.ndarray:
    """Devices of each job: ``trainer_count x devices_per_trainer`` (missing: 1 per trainer).

    Examples
    --------
    >>> job_devices(pd.DataFrame({"trainer_count": [2, 3], "devices_per_trainer": [8, None]}))
    array([16.,  3.])
    """
    return _column(jobs, "trainer_count", 1.0) * _column(jobs, "devices_per_trainer", 1.0)


def device_hours(jobs: pd.DataFrame) -> np.ndarray:
    """Device-hours of each attempt: ``duration_hours x trainer_count x devices_per_trainer``.

    Missing ``duration_hours`` counts as 0 hours and missing ``devices_per_trainer`` as 1.

    Examples
    --------
    >>> device_hours(pd.DataFrame({"trainer_count": [2, 1], "devices_per_trainer": [8, None],
    ...                            "duration_hours": [1.5, 4.0]})).tolist()
    [24.0, 4.0]
    """
    return job_devices(jobs) * _column(jobs, "duration_hours", 0.0)


def recorded_device_hours(jobs: pd.DataFrame) -> np.ndarray | None:
    """:func:`device_hours` of attempts that carry ``duration_hours``; None for rows without
    the column (job requests, which have not run): the GPU-hour weighting then is skipped."""
    return device_hours(jobs) if "duration_hours" in jobs.columns else None


def _column(jobs: pd.DataFrame, name: str, default: float) -> np.ndarray:
    if name not in jobs.columns:
        return np.full(len(jobs), default)
    values = pd.to_numeric(jobs[name], errors="coerce").astype("float64").to_numpy()
    return np.where(np.isfinite(values), values, default)
