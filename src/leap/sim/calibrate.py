"""Calibration of a simulated fleet: is it as varied, sparse and noisy as the spec asks?"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from leap.data.schema import STATUSES
from leap.errors import ConfigError
from leap.metrics import within
from leap.sim.fleet import Fleet

if TYPE_CHECKING:
    from leap.data.store import Store

_COLUMNS = ("attempt_id", "family_id", "submitted_at", "hardware", "trainer_count",
            "batch_size", "status", "throughput", "precision", "devices_per_trainer",
            "tensor_parallel", "pipeline_parallel", "duration_hours", "model_type")

#: Spec targets, for the check table: key -> (low, high), None for an open side.
TARGETS: dict[str, tuple[float | None, float | None]] = {
    "throughput_span_orders": (5.0, None),
    "oracle_ceiling": (0.85, 0.95),
    "observed_pair_share": (None, 0.4),
}


def calibration_from_table(fleet: Fleet, table: pa.Table) -> dict[str, Any]:
    """The calibration figures of simulated attempt rows (see :func:`calibrate`)."""
    n = table.num_rows
    if n == 0:
        raise ConfigError("no attempts to calibrate; simulate a fleet into the store first")
    day = fleet.day_of(table.column("submitted_at"))
    n_days = int(day.max()) + 1
    status = table.column("status").to_numpy(zero_copy_only=False)
    ok = status == "succeeded"
    measured = table.column("throughput").to_numpy(zero_copy_only=False).astype(np.float64)
    succ = table.filter(pa.array(ok))
    thr = measured[ok]
    truth = fleet.true_throughput(succ, succ.column("hardware"), succ.column("submitted_at"))
    hit = within(truth, thr)
    fam, shape = fleet.job_shape(succ)
    dur = succ.column("duration_hours").to_numpy(zero_copy_only=False).astype(np.float64)
    gpu_hours = shape.devices * np.nan_to_num(dur)

    # (family, eligible type) pairs: eligible = the family's base shape fits and the type
    # is available by the end of the span; observed = a succeeded attempt measured it.
    all_fam = fleet.family_index(table.column("family_id").to_numpy(zero_copy_only=False))
    families = np.unique(all_fam)
    eligible = fleet.families.fit_base[families] & fleet.pool.available(n_days - 1)[None, :]
    hw = fleet.hardware_index(succ.column("hardware").to_numpy(zero_copy_only=False), len(fam))
    observed = np.zeros((len(fleet.families), len(fleet.pool.names)), dtype=bool)
    observed[fam, hw] = True
    observed = observed[families] & eligible
    per_family_eligible = eligible.sum(axis=1)

    arrived = fleet.families.arrival_day[families]
    all_dur = table.column("duration_hours").to_numpy(zero_copy_only=False).astype(np.float64)
    devices = fleet.job_shape(table)[1].devices
    hours = np.sort(devices * np.nan_to_num(all_dur))[::-1]
    top = max(1, n // 100)
    new_hw = fleet.scenario.new_hardware
    on_new = pc.equal(table.column("hardware"), new_hw).to_numpy(zero_copy_only=False) \
        if new_hw else np.zeros(n, dtype=bool)
    counts = {s: int((status == s).sum()) for s in STATUSES}
    q_lo, q_hi = np.quantile(thr, [0.001, 0.999])
    return {
        "days": n_days,
        "attempts": n,
        "attempts_per_day": n / n_days,
        "families": len(families),
        "model_types": len(np.unique(fleet.families.model_type[families])),
        "hardware_types_used": len(np.unique(hw)),
        "status_share": {s: c / n for s, c in counts.items()},
        "throughput_span_orders": float(np.log10(q_hi / q_lo)),
        "throughput_span_orders_min_max": float(np.log10(thr.max() / thr.min())),
        "throughput_median_samples_per_s": float(np.median(thr)),
        "oracle_ceiling": float(hit.mean()),
        "oracle_ceiling_gpu_hours": float((hit * gpu_hours).sum() / max(gpu_hours.sum(), 1e-9)),
        "observed_pair_share": float(observed.sum() / max(eligible.sum(), 1)),
        "median_eligible_types_per_family": float(np.median(per_family_eligible)),
        "median_observed_types_per_family": float(np.median(observed.sum(axis=1))),
        "new_families_per_day": float((arrived >= 1).sum() / max(n_days - 1, 1)),
        "gpu_hours_share_of_top_1pct_attempts": float(hours[:top].sum() / max(hours.sum(),
                                                                              1e-9)),
        "new_hardware": new_hw,
        "new_hardware_first_day": int(day[on_new].min()) if on_new.any() else None,
        "new_hardware_attempts": int(on_new.sum()),
    }


def calibrate(store: Store) -> dict[str, Any]:
    """Calibration of the fleet simulated into ``store``.

    Returns a JSON-ready dict with, among others: ``attempts_per_day``,
    ``throughput_span_orders`` (log10 of the 99.9th over the 0.1st percentile of measured
    samples/s), ``observed_pair_share`` (share of (family, eligible type) pairs with a
    succeeded attempt), ``new_families_per_day``, and ``oracle_ceiling``: the share of
    succeeded attempts whose true median is within +-20% of the measured value (the best
    accuracy any predictor can reach; spec: about 0.85-0.95), also GPU-hour weighted.

    Raises
    ------
    ConfigError
        The store holds no simulated fleet, or no attempts.

    Examples
    --------
    Not run here (it needs a workspace)::

        leap simulate --days 7 && python -c "..."
        calibrate(Store(ws.store_path))["oracle_ceiling"]  -> about 0.92

    >>> sorted(TARGETS)
    ['observed_pair_share', 'oracle_ceiling', 'throughput_span_orders']
    """
    fleet = Fleet.from_store(store)
    return calibration_from_table(fleet, store.attempts(columns=list(_COLUMNS)))


def check_targets(report: dict[str, Any]) -> dict[str, bool]:
    """Whether each figure in :data:`TARGETS` is within its spec range."""
    out = {}
    for key, (lo, hi) in TARGETS.items():
        v = report[key]
        out[key] = (lo is None or v >= lo) and (hi is None or v <= hi)
    return out
