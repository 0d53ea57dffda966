"""The simulator as an oracle: the one test of "is this store simulated?", its fleet, and
the ceiling any predictor can reach on a held-out day (the truth scored like a prediction).

Only a store written by ``leap simulate`` has an oracle; real data has none, so every study
that needs one asks :func:`is_simulated` or :func:`oracle_fleet` here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.data.usage import device_hours
from leap.errors import LeapError
from leap.records import Record

if TYPE_CHECKING:
    from leap.data.store import Store
    from leap.sim.fleet import Fleet

#: The metadata ``leap simulate`` writes and :meth:`leap.sim.fleet.Fleet.from_store` needs.
SIM_KEYS: tuple[str, ...] = ("sim.scenario", "sim.seed", "sim.start")


def is_simulated(store: Store) -> bool:
    """Whether ``leap simulate`` wrote ``store`` (it carries the simulator's metadata)."""
    return all(store.get_meta(key) is not None for key in SIM_KEYS)


def oracle_fleet(store: Store, *, strict: bool = False) -> Fleet | None:
    """The fleet that simulated ``store``, or None for real data.

    Parameters
    ----------
    store : Store
        The attempt store.
    strict : bool
        A store simulated by another simulator version has no trustworthy oracle: False gives
        None (a figure is left out), True raises its :class:`~leap.errors.ConfigError` (a
        study that needs the oracle stops early, with the fix).
    """
    if not is_simulated(store):
        return None
    from leap.sim.fleet import Fleet

    try:
        return Fleet.from_store(store)
    except LeapError:
        if strict:
            raise
        return None


@dataclass(frozen=True)
class Ceiling(Record):
    """What a perfect model of the simulator reaches on a day (:func:`oracle_ceiling`):
    accuracy within ±20%, device-hour weighted too, and the median APE."""

    accuracy: float
    accuracy_gpu_hours: float
    median_ape: float


def oracle_ceiling(fleet: Fleet, jobs: pd.DataFrame) -> Ceiling:
    """The simulator's truth scored as a prediction of the measured ``jobs``: measurement
    noise is its only error."""
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    truth = fleet.true_throughput(jobs, jobs["hardware"].to_numpy(),
                                  jobs["submitted_at"].to_numpy())
    return Ceiling(accuracy=metrics.accuracy(truth, actual),
                   accuracy_gpu_hours=metrics.accuracy(truth, actual, device_hours(jobs)),
                   median_ape=metrics.median_ape(truth, actual))


def day_ceiling(store: Store, catalog: Catalog, as_of: datetime) -> float | None:
    """The oracle's accuracy on the held-out day ``as_of`` (its succeeded attempts), or None
    when the store has no oracle."""
    fleet = oracle_fleet(store)
    if fleet is None:
        return None
    from leap.model.window import load_attempts, succeeded_attempts

    day = succeeded_attempts(load_attempts(store, as_of, as_of + timedelta(days=1)), catalog)
    return oracle_ceiling(fleet, day).accuracy
