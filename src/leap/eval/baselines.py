"""Baselines LEAP is measured against: the lookup table (the previous system) and simple rankers.

:class:`LookupTable` is the system the paper replaced: the median measured throughput of past
attempts with exactly the same configuration on the same hardware, keyed by
``(family_id, hardware, trainer_count, batch_size)``; a job whose key never ran has no
estimate. :func:`lookup_comparison` puts it beside LEAP on one held-out day.

The ranking baselines order a job's eligible types without a model: :func:`cheapest_order`
(lowest cost per device-hour first), :func:`fastest_peak_order` (highest peak dense 16-bit
FLOP/s first) and :func:`most_used_order` (the family's most-used types in the training
window first, then cheapest). Every order breaks ties by name, so it never depends on the
order of the candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.errors import DataError, ModelError

#: The lookup table's key: the exact job configuration and the hardware.
LOOKUP_KEY: tuple[str, ...] = ("family_id", "hardware", "trainer_count", "batch_size")


def gpu_hours(jobs: pd.DataFrame) -> np.ndarray:
    """Device-hours of each attempt: ``duration_hours x trainer_count x devices_per_trainer``.

    Missing ``duration_hours`` counts as 0 hours and missing ``devices_per_trainer`` as 1.

    Examples
    --------
    >>> gpu_hours(pd.DataFrame({"trainer_count": [2, 1], "devices_per_trainer": [8, None],
    ...                         "duration_hours": [1.5, 4.0]})).tolist()
    [24.0, 4.0]
    """
    return job_devices(jobs) * _column(jobs, "duration_hours", 0.0)


def job_devices(jobs: pd.DataFrame) -> np.ndarray:
    """Devices of each job: ``trainer_count x devices_per_trainer`` (missing: 1 per trainer).

    >>> job_devices(pd.DataFrame({"trainer_count": [2, 3], "devices_per_trainer": [8, None]}))
    array([16.,  3.])
    """
    return _column(jobs, "trainer_count", 1.0) * _column(jobs, "devices_per_trainer", 1.0)


def _column(jobs: pd.DataFrame, name: str, default: float) -> np.ndarray:
    if name not in jobs.columns:
        return np.full(len(jobs), default)
    values = pd.to_numeric(jobs[name], errors="coerce").astype("float64").to_numpy()
    return np.where(np.isfinite(values), values, default)


class LookupTable:
    """The previous system: median throughput of past attempts of the exact configuration.

    Parameters
    ----------
    keys : sequence of str
        Columns that must match exactly (default :data:`LOOKUP_KEY`).
    min_count : int
        Past succeeded attempts a key needs before the table answers for it.

    Attributes
    ----------
    table_ : pandas.DataFrame
        One row per key seen in training: ``median_throughput`` and ``count``.

    Examples
    --------
    >>> past = pd.DataFrame({"family_id": ["f", "f", "g"], "hardware": ["A", "A", "A"],
    ...                      "trainer_count": [1, 1, 1], "batch_size": [8, 8, 8],
    ...                      "status": ["succeeded"] * 3, "throughput": [10.0, 30.0, 5.0]})
    >>> new = past.iloc[[0]].assign(hardware="B")
    >>> LookupTable().fit(past).predict(pd.concat([past.iloc[[0]], new])).tolist()
    [20.0, nan]
    """

    def __init__(self, *, keys: Sequence[str] = LOOKUP_KEY, min_count: int = 1) -> None:
        self.keys = tuple(keys)
        self.min_count = min_count

    def fit(self, attempts: pd.DataFrame) -> LookupTable:
        """Learn the median of each key from the succeeded attempts with a throughput."""
        if self.min_count < 1:
            raise ModelError(f"min_count must be >= 1, got {self.min_count}")
        missing = [k for k in (*self.keys, "status", "throughput") if k not in attempts.columns]
        if missing:
            raise DataError(f"lookup table: the attempts lack column(s) {', '.join(missing)}; "
                            "pass attempt rows as loaded from the store")
        tp = pd.to_numeric(attempts["throughput"], errors="coerce")
        ok = attempts[(attempts["status"] == "succeeded") & (tp > 0)]
        grouped = ok.assign(throughput=tp[ok.index]).groupby(list(self.keys), sort=True,
                                                              observed=True)["throughput"]
        table = pd.DataFrame({"median_throughput": grouped.median(), "count": grouped.size()})
        self.table_ = table[table["count"] >= self.min_count]
        self.fitted_ = True
        return self

    def predict(self, jobs: pd.DataFrame) -> np.ndarray:
        """Median samples/s of each job's key; NaN where the key never ran (not covered)."""
        if not getattr(self, "fitted_", False):
            raise ModelError("this LookupTable is not fitted yet; call fit(past_attempts) first")
        missing = [k for k in self.keys if k not in jobs.columns]
        if missing:
            raise DataError(f"lookup table: the jobs lack key column(s) {', '.join(missing)}")
        if len(jobs) == 0:
            return np.empty(0)
        index = pd.MultiIndex.from_frame(jobs[list(self.keys)]) if len(self.keys) > 1 \
            else pd.Index(jobs[self.keys[0]])
        return self.table_["median_throughput"].reindex(index).to_numpy(dtype=np.float64)


def lookup_comparison(past: pd.DataFrame, jobs: pd.DataFrame,
                      leap_pred: np.ndarray) -> dict[str, Any]:
    """The lookup table beside LEAP on one held-out day (the paper's 13.3% / 53.2% vs 85.1%).

    Parameters
    ----------
    past : pandas.DataFrame
        Attempts of the training window (the table's memory).
    jobs : pandas.DataFrame
        The held-out day's succeeded attempts (with ``throughput``).
    leap_pred : numpy.ndarray
        LEAP's predicted samples/s for each row of ``jobs`` (NaN = no prediction).

    Returns
    -------
    dict
        ``n``; ``table_coverage`` (share of attempts whose key ran before) and
        ``leap_coverage``; ``table_accuracy_covered`` and ``leap_accuracy_covered`` (within
        ±20% on the table's covered subset), ``leap_accuracy_all``; the same GPU-hour
        weighted (``*_gpu_hours``); median APEs on the covered subset.

    Examples
    --------
    >>> past = pd.DataFrame({"family_id": ["f"], "hardware": ["A"], "trainer_count": [1],
    ...                      "batch_size": [8], "status": ["succeeded"], "throughput": [10.0]})
    >>> day = pd.concat([past, past.assign(hardware="B")]).assign(throughput=[11.0, 20.0])
    >>> r = lookup_comparison(past, day, np.array([11.0, 30.0]))
    >>> r["table_coverage"], r["table_accuracy_covered"], r["leap_accuracy_all"]
    (0.5, 1.0, 0.5)
    """
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    leap_pred = np.asarray(leap_pred, dtype=np.float64)
    if len(leap_pred) != len(jobs):
        raise DataError(f"got {len(leap_pred)} LEAP predictions for {len(jobs)} jobs; pass one "
                        "per held-out attempt")
    table = LookupTable().fit(past).predict(jobs)
    covered = np.isfinite(table)
    hours = gpu_hours(jobs)

    def share(mask: np.ndarray, w: np.ndarray | None = None) -> float:
        w = np.ones(len(mask)) if w is None else w
        return float((w * mask).sum() / w.sum()) if len(mask) and w.sum() > 0 else float("nan")

    return {
        "n": len(jobs),
        "n_covered": int(covered.sum()),
        "keys": list(LOOKUP_KEY),
        "table_coverage": share(covered),
        "table_coverage_gpu_hours": share(covered, hours),
        "leap_coverage": share(np.isfinite(leap_pred)),
        "table_accuracy_covered": metrics.accuracy(table[covered], actual[covered]),
        "leap_accuracy_covered": metrics.accuracy(leap_pred[covered], actual[covered]),
        "table_accuracy_covered_gpu_hours": metrics.accuracy(table[covered], actual[covered],
                                                             hours[covered]),
        "leap_accuracy_covered_gpu_hours": metrics.accuracy(leap_pred[covered],
                                                            actual[covered], hours[covered]),
        "table_median_ape_covered": metrics.median_ape(table[covered], actual[covered]),
        "leap_median_ape_covered": metrics.median_ape(leap_pred[covered], actual[covered]),
        "leap_accuracy_all": metrics.accuracy(leap_pred, actual),
        "leap_accuracy_all_gpu_hours": metrics.accuracy(leap_pred, actual, hours),
        # The table answers nothing for uncovered rows: as a whole-day system it scores this.
        "table_accuracy_all": metrics.accuracy(table, actual),
    }


# Ranking baselines ----------------------------------------------------------------------------
def cheapest_order(candidates: Sequence[str], costs: Catalog) -> list[str]:
    """Candidates by cost per device-hour, cheapest first (ties by name).

    Examples
    --------
    >>> cat = Catalog.default()
    >>> cheapest_order(["H100-SXM", "T4", "L4"], cat)[0]
    'L4'
    """
    return sorted(candidates, key=lambda n: (costs[n].cost_per_device_hour, n))


def fastest_peak_order(candidates: Sequence[str], costs: Catalog) -> list[str]:
    """Candidates by peak dense 16-bit FLOP/s per device, fastest first (ties by name).

    Examples
    --------
    >>> fastest_peak_order(["T4", "H100-SXM", "L4"], Catalog.default())[0]
    'H100-SXM'
    """
    return sorted(candidates, key=lambda n: (-costs[n].peak_bf16_tflops, n))


def family_usage(past: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Attempts per hardware type of each family in ``past`` (all statuses count as use).

    Examples
    --------
    >>> family_usage(pd.DataFrame({"family_id": ["f", "f", "g"], "hardware": ["A", "A", "B"]}))
    {'f': {'A': 2}, 'g': {'B': 1}}
    """
    counts = past.groupby(["family_id", "hardware"], sort=True, observed=True).size()
    out: dict[str, dict[str, int]] = {}
    for (fam, hw), n in counts.items():
        out.setdefault(str(fam), {})[str(hw)] = int(n)
    return out


def most_used_order(candidates: Sequence[str], usage: Mapping[str, int],
                    costs: Catalog) -> list[str]:
    """The family's most-used candidates first, the never-used ones after them by cost.

    A family with no history (or none on the candidates) falls back to :func:`cheapest_order`.

    Examples
    --------
    >>> most_used_order(["T4", "L4", "H100-SXM"], {"H100-SXM": 3, "L4": 1}, Catalog.default())
    ['H100-SXM', 'L4', 'T4']
    """
    return sorted(candidates, key=lambda n: (-usage.get(n, 0), costs[n].cost_per_device_hour, n))
