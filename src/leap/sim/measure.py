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

from leap.data.schema import PRECISIONS
from leap.sim.families import attempt_duration_sd
from leap.sim.fleet import Fleet

#: Status names in the order of the outcome draw.
_OK, _FAILED, _OOM = "succeeded", "failed", "oom"


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
    types = fleet.types
    mt = shape.model_type
    if duration_hours is not None:
        duration = np.full(n, float(duration_hours))
    return pd.DataFrame({
        "attempt_id": [f"{id_prefix}{i}" for i in range(n)],
        "family_id": fleet.family_ids()[fam].astype(object),
        "model_type": types.name[mt].astype(object),
        "submitted_at": pd.Timestamp(at).tz_convert("UTC") if pd.Timestamp(at).tzinfo
        else pd.Timestamp(at, tz="UTC"),
        "hardware": hardware,
        "trainer_count": shape.trainer_count.astype(np.int64),
        "batch_size": shape.batch_size.astype(np.int64),
        "status": status.astype(object),
        "throughput": measured,
        "model_category": np.asarray([_category(c) for c in types.category[mt]], dtype=object),
        "num_params": _floats(types.num_params[mt]),
        "flops_per_sample": _floats(types.flops_per_sample[mt]),
        "embedding_params": _floats(types.embedding_params[mt]),
        "num_layers": _floats(types.num_layers[mt]),
        "hidden_dim": _floats(types.hidden_dim[mt]),
        "seq_len": _floats(types.seq_len[mt]),
        "num_dense_features": _floats(types.num_dense_features[mt]),
        "num_sparse_features": _floats(types.num_sparse_features[mt]),
        "precision": np.asarray([PRECISIONS[p] for p in shape.precision], dtype=object),
        "devices_per_trainer": shape.devices_per_trainer.astype(np.int64),
        "data_parallel": shape.data_parallel.astype(np.int64),
        "tensor_parallel": shape.tensor_parallel.astype(np.int64),
        "pipeline_parallel": shape.pipeline_parallel.astype(np.int64),
        "duration_hours": np.minimum(duration, sc.duration_cap_hours),
    })


def _category(index: int) -> str:
    from leap.sim.scenario import CATEGORIES

    return CATEGORIES[int(index)]


def _floats(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)
