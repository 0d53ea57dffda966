"""The simulator measuring jobs someone chose to run: a planned trial becomes an attempt row.

:func:`measure_jobs` runs given (family, shape) jobs on a given type at a given time and
returns attempt rows as :func:`leap.sim.run.simulate_day` would have written them: the same
true median (:meth:`Fleet.samples_per_s`), the same outcome draws (OOM where the job does not
fit, ``failure_prob``, the measurement noise and stragglers of the scenario) and the same
columns. Only the placement differs (the caller chose the type, so no preemption over
capacity) and the random stream (its own ``rng``, so the fleet's streams are untouched and a
store extended by ``leap simulate`` later is the same).
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd

from leap.data.schema import STATUSES
from leap.sim.families import attempt_duration_sd
from leap.sim.fleet import Fleet
from leap.sim.run import attempt_table

_OK, _FAILED, _OOM = (STATUSES.index(s) for s in ("succeeded", "failed", "oom"))


def measure_jobs(fleet: Fleet, jobs: pd.DataFrame, hardware: str, at: datetime,
                 rng: np.random.Generator, *, id_prefix: str = "trial-",
                 duration_hours: float | None = None) -> pd.DataFrame:
    """Run ``jobs`` on ``hardware`` at ``at`` in the simulated fleet: one attempt row each.

    Parameters
    ----------
    fleet : Fleet
        The fleet of the store (``Fleet.from_store``).
    jobs : pandas.DataFrame
        ``family_id``, ``trainer_count``, ``batch_size`` and optionally ``precision``,
        ``devices_per_trainer``, ``tensor_parallel``, ``pipeline_parallel`` (see
        :meth:`Fleet.job_shape`).
    hardware : str
        The type every job runs on.
    at : datetime
        Submission time of every row (UTC).
    rng : numpy.random.Generator
        The draws of this measurement (seeded by the caller).
    id_prefix : str
        ``attempt_id`` is ``<id_prefix><i>``: trial rows are told apart by it.
    duration_hours : float, optional
        How long each job runs (a trial that only measures throughput is short); default
        the family's own duration draw.

    Returns
    -------
    pandas.DataFrame
        Attempt rows (the columns of a simulated attempt); ``throughput`` is NaN unless
        ``status`` is ``succeeded``.

    Examples
    --------
    >>> from datetime import UTC
    >>> from leap.catalog import Catalog
    >>> from leap.sim.scenario import Scenario
    >>> sc = Scenario.load().override(initial_families=50, n_model_types=10)
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> fleet = Fleet(sc, Catalog.default(), seed=1, start=t0)
    >>> rows = measure_jobs(fleet, fleet.base_jobs([0, 1]).to_pandas(), "H100-SXM", t0,
    ...                     np.random.default_rng(0))
    >>> list(rows["attempt_id"]), set(rows["hardware"])
    (['trial-0', 'trial-1'], {'H100-SXM'})
    """
    sc = fleet.scenario
    day = fleet.day_of(at)
    fam, shape = fleet.job_shape(jobs)
    n = len(fam)
    hw = fleet.hardware_index(hardware, n)
    days = np.full(n, int(day[0]))
    true = fleet.samples_per_s(fam, shape, hw, days)
    # The draws of simulate_day, in its order, for the outcomes it can have here.
    u_status = rng.uniform(size=n)
    noise = np.exp(rng.normal(0.0, sc.attempt_noise_log_sd, n))
    straggler = rng.uniform(size=n) < sc.straggler_share
    slow = rng.uniform(sc.straggler_low, sc.straggler_high, n)
    duration = np.exp(fleet.families.dur_log_hours[fam]
                      + rng.normal(0.0, attempt_duration_sd(sc), n))
    oom = np.isnan(true)
    status = np.where(oom, _OOM, np.where(u_status < sc.failure_prob, _FAILED, _OK))
    ok = status == _OK
    measured = np.where(ok, true * noise * np.where(straggler, slow, 1.0), np.nan)
    if duration_hours is not None:
        duration = np.full(n, float(duration_hours))
    submitted_us = np.full(n, int(pd.Timestamp(at).timestamp() * 1_000_000))
    return attempt_table(fleet, [f"{id_prefix}{i}" for i in range(n)], fam, shape, hw,
                         submitted_us, status, measured,
                         np.minimum(duration, sc.duration_cap_hours)).to_pandas()
