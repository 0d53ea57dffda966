"""Run the reference fleet: attempts day by day, into the store through the ingest checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from leap.catalog import Catalog
from leap.data.schema import ATTEMPTS_SCHEMA, PRECISIONS, STATUSES
from leap.errors import ConfigError, ParamError
from leap.sim.families import MAX_TRAINERS, attempt_duration_sd
from leap.sim.fleet import S_ATTEMPTS, SIM_VERSION, Fleet, day_rng
from leap.sim.physics import JobShape
from leap.sim.scenario import CATEGORIES, Scenario
from leap.sim.scheduler import CHOICES, schedule_day

if TYPE_CHECKING:
    from leap.data.store import Store

#: Default first simulated day.
DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)
_US_PER_DAY = 86_400_000_000
_OK, _FAILED, _OOM, _PREEMPTED = (STATUSES.index(s) for s in
                                  ("succeeded", "failed", "oom", "preempted"))


@dataclass
class DayOutcome:
    """One simulated day: the attempt rows and what the scheduler did."""

    table: pa.Table
    choice_counts: dict[str, int]
    families: np.ndarray


def _nullable(values: np.ndarray) -> pa.Array:
    """Float column with NaN as null (ingest refuses NaN in optional fields)."""
    return pa.array(values, type=pa.float64(), mask=np.isnan(values))


def _vary(rng: np.random.Generator, base: JobShape, share_base: float,
          spread: int = 1) -> JobShape:
    """Most attempts run the base shape; the rest change trainers or batch size.

    With ``spread`` 1 (the default fleet) a variant doubles or halves one of them. A wider
    spread (a fleet whose jobs are retuned often) scales trainers by ``2^j``, ``|j| <=
    spread``, and the batch size by a continuous factor within ``2^+-spread`` (rounded to a
    multiple of the devices per trainer), both at once, so exact configurations rarely repeat.
    """
    n = len(base.model_type)
    variant = rng.uniform(size=n) >= share_base
    t, b = base.trainer_count, base.batch_size
    pp, dpt = base.pipeline_parallel, base.devices_per_trainer
    if spread > 1:
        # Only a wider spread draws these numbers: the default fleet stays exactly as it was.
        j = rng.integers(-spread, spread + 1, n)
        up = np.minimum(t * 2 ** np.maximum(j, 0), MAX_TRAINERS)
        down = t // 2 ** np.maximum(-j, 0)
        new_t = np.where(j >= 0, up, np.where((down >= pp) & (down % pp == 0), down, t))
        factor = 2.0 ** rng.uniform(-spread, spread, n)
        new_b = np.maximum(dpt, np.round(b * factor / dpt).astype(np.int64) * dpt)
        return JobShape(base.model_type, np.where(variant, new_t, t), dpt,
                        np.where(variant, new_b, b), base.precision, base.tensor_parallel, pp)
    kind = rng.integers(0, 4, n)
    half_t = t // 2
    can_half_t = (half_t >= pp) & (half_t % pp == 0)
    new_t = np.where((kind == 0) | ~can_half_t, t * 2, half_t)
    half_b = b // 2
    can_half_b = half_b >= dpt
    new_b = np.where((kind == 2) | ~can_half_b, b * 2, half_b)
    return JobShape(base.model_type, np.where(variant & (kind < 2), new_t, t), dpt,
                    np.where(variant & (kind >= 2), new_b, b), base.precision,
                    base.tensor_parallel, pp)


def simulate_day(fleet: Fleet, day: int) -> DayOutcome:
    """Simulate every attempt of ``day`` (vectorised; the same day always gives the same rows).

    Parameters
    ----------
    fleet : Fleet
        The fleet (grown to ``day`` as needed).
    day : int
        Day index, 0 = the fleet's start date.

    Returns
    -------
    DayOutcome
        Rows in :data:`leap.data.schema.ATTEMPTS_SCHEMA`, in submission order.
    """
    sc = fleet.scenario
    fleet.ensure_days(day + 1)
    rng = day_rng(fleet.seed, S_ATTEMPTS, day)
    f = fleet.families
    n = sc.attempts_per_day
    w = np.where(f.alive(day), f.weight, 0.0)
    fam = rng.choice(len(f), n, p=w / w.sum())
    offset_us = np.sort(rng.integers(0, _US_PER_DAY, n))
    shape = _vary(rng, f.shape(fam), sc.base_config_share, sc.config_spread)

    placed = schedule_day(fleet, fam, shape.devices, day)
    hw = placed.hardware
    days = np.full(n, day)
    true = fleet.samples_per_s(fam, shape, hw, days)

    # Fixed draws per day, whatever the outcomes, so every stream stays aligned.
    u_status = rng.uniform(size=n)
    noise = np.exp(rng.normal(0.0, sc.attempt_noise_log_sd, n))
    straggler = rng.uniform(size=n) < sc.straggler_share
    slow = rng.uniform(sc.straggler_low, sc.straggler_high, n)
    duration = np.exp(f.dur_log_hours[fam] + rng.normal(0.0, attempt_duration_sd(sc), n))
    cut = rng.uniform(size=n)

    oom = np.isnan(true)
    within = placed.choice != CHOICES.index("over_capacity")
    p_pre = np.where(within, sc.preemption_prob, sc.over_capacity_preemption_prob)
    status = np.where(oom, _OOM, np.where(u_status < sc.failure_prob, _FAILED, np.where(
        u_status < sc.failure_prob + p_pre, _PREEMPTED, _OK)))
    ok = status == _OK
    measured = np.where(ok, true * noise * np.where(straggler, slow, 1.0), np.nan)
    duration = np.minimum(duration, sc.duration_cap_hours)
    # Attempts that end early run for part of their time (an OOM dies within minutes).
    duration = np.where(oom, duration * (0.01 + 0.04 * cut),
                        np.where(ok, duration, duration * (0.02 + 0.98 * cut)))

    prefix = f"sim-{fleet.seed}-{day:04d}-"
    start_us = int((fleet.start.timestamp()) * 1_000_000) + day * _US_PER_DAY
    table = attempt_table(fleet, [f"{prefix}{i:06d}" for i in range(n)], fam, shape, hw,
                          start_us + offset_us, status, measured, duration)
    counts = np.bincount(placed.choice, minlength=len(CHOICES))
    return DayOutcome(table=table, choice_counts=dict(zip(CHOICES, counts.tolist(),
                                                           strict=True)),
                      families=np.unique(fam))


def attempt_table(fleet: Fleet, attempt_ids: list[str], fam: np.ndarray, shape: JobShape,
                  hw: np.ndarray, submitted_us: np.ndarray, status: np.ndarray,
                  measured: np.ndarray, duration: np.ndarray) -> pa.Table:
    """Attempt rows (:data:`~leap.data.schema.ATTEMPTS_SCHEMA`) of simulated jobs: families
    ``fam`` at ``shape`` on pool types ``hw``, submitted at ``submitted_us`` (microseconds
    since the epoch), with ``status`` (indices into ``STATUSES``), ``measured`` samples/s
    (NaN unless succeeded) and ``duration`` hours. What :func:`simulate_day` writes and
    :func:`leap.sim.measure.measure_jobs` returns.
    """
    mt = shape.model_type
    types = fleet.types
    names = pa.array(fleet.pool.names, pa.string())
    columns: dict[str, pa.Array] = {
        "attempt_id": pa.array(attempt_ids, pa.string()),
        "family_id": pa.array(fleet.family_ids()[fam], pa.string()),
        "model_type": pa.array(types.name[mt], pa.string()),
        "submitted_at": pa.array(submitted_us, ATTEMPTS_SCHEMA.field("submitted_at").type),
        "hardware": names.take(pa.array(hw)),
        "trainer_count": pa.array(shape.trainer_count, pa.int64()),
        "batch_size": pa.array(shape.batch_size, pa.int64()),
        "status": pa.array(STATUSES, pa.string()).take(pa.array(status)),
        "throughput": _nullable(measured),
        "model_category": pa.array(CATEGORIES, pa.string()).take(
            pa.array(types.category[mt])),
        "num_params": _nullable(types.num_params[mt]),
        "flops_per_sample": _nullable(types.flops_per_sample[mt]),
        "embedding_params": _nullable(types.embedding_params[mt]),
        "num_layers": _nullable(types.num_layers[mt]),
        "hidden_dim": _nullable(types.hidden_dim[mt]),
        "seq_len": _nullable(types.seq_len[mt]),
        "num_dense_features": _nullable(types.num_dense_features[mt]),
        "num_sparse_features": _nullable(types.num_sparse_features[mt]),
        "precision": pa.array(PRECISIONS, pa.string()).take(pa.array(shape.precision)),
        "devices_per_trainer": pa.array(shape.devices_per_trainer, pa.int64()),
        "data_parallel": pa.array(shape.data_parallel, pa.int64()),
        "tensor_parallel": pa.array(shape.tensor_parallel, pa.int64()),
        "pipeline_parallel": pa.array(shape.pipeline_parallel, pa.int64()),
        "duration_hours": pa.array(duration, pa.float64()),
    }
    return pa.Table.from_pydict(columns, schema=ATTEMPTS_SCHEMA)


@dataclass
class SimReport:
    """What :func:`simulate` did."""

    seed: int
    start: str
    days: int
    attempts: int
    added: int
    already_stored: int
    quarantined: int
    families: int
    seconds: float
    status: dict[str, int] = field(default_factory=dict)
    placement: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_META_KEYS = ("scenario", "seed", "start", "catalog", "version")


def _scenario_diff(old_toml: str, new: Scenario) -> str:
    old = Scenario.from_toml(old_toml, origin="store sim.scenario").to_dict()
    changed = [f"{k}: {old[k]!r} -> {v!r}" for k, v in new.to_dict().items() if old.get(k) != v]
    return "; ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")


def _check_store(store: Store, meta: dict[str, str], scenario: Scenario,
                 catalog: Catalog) -> None:
    """Refuse to mix two different fleets (or real data) in one store."""
    old = {k: store.get_meta(f"sim.{k}") for k in _META_KEYS}
    if old["seed"] is None:
        if store.count():
            raise ParamError(f"attempt store {store.path} already holds {store.count():,} "
                             "attempts that were not simulated; simulate into a fresh {home}")
        return
    differs: list[str] = []
    for key in ("version", "seed", "start"):
        if old[key] != meta[key]:
            differs.append(f"{key} {old[key]} (asked: {meta[key]})")
    if old["scenario"] and Scenario.from_toml(old["scenario"]).fingerprint() != \
            scenario.fingerprint():
        differs.append(f"another scenario ({_scenario_diff(old['scenario'], scenario)})")
    if old["catalog"] and Catalog.from_toml(old["catalog"]).fingerprint() != \
            catalog.fingerprint():
        differs.append("another hardware catalog")
    if differs:
        raise ParamError(f"attempt store {store.path} already holds a fleet simulated with "
                         f"{', '.join(differs)}; use a fresh {{home}}, or the same settings to "
                         "extend it")


def simulate(store: Store, catalog: Catalog, scenario: Scenario, *, days: int, seed: int,
             start: datetime = DEFAULT_START, progress: Callable[[int], None] | None = None,
             chunk_days: int = 4) -> SimReport:
    """Simulate ``days`` days of the reference fleet into ``store``.

    Rows go through :func:`leap.data.ingest.ingest_table` (the validation of ``leap ingest``),
    ``chunk_days`` days per atomic batch. ``attempt_id`` is ``sim-<seed>-<day>-<i>``, so
    running the same command again adds nothing, and a longer run extends a shorter one.
    The store records the scenario, seed, start and catalog (``sim.*`` metadata) so that
    :meth:`Fleet.from_store` can rebuild the oracle.

    Parameters
    ----------
    store : Store
        Open for writing; empty, or holding a fleet simulated with the same settings.
    catalog : Catalog
        Hardware types of the fleet.
    scenario : Scenario
        The knobs.
    days : int
        Number of days from ``start``.
    seed : int
        Non-negative.
    start : datetime
        Day 0 (truncated to midnight UTC).
    progress : callable, optional
        Called with the number of days done after each day.
    chunk_days : int
        Days per store transaction.

    Returns
    -------
    SimReport

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from leap.data.store import Store
    >>> sc = Scenario.load().override(attempts_per_day=200, initial_families=100,
    ...                               n_model_types=30)
    >>> with Store(Path(tempfile.mkdtemp()) / "s.duckdb") as store:
    ...     simulate(store, Catalog.default(), sc, days=2, seed=1).added
    400
    """
    from leap.data.ingest import ingest_table

    if days < 1:
        raise ConfigError(f"days must be >= 1, got {days}")
    if chunk_days < 1:
        raise ConfigError(f"chunk_days must be >= 1, got {chunk_days}")
    t0 = time.perf_counter()
    start = start.astimezone(UTC) if start.tzinfo else start.replace(tzinfo=UTC)
    start = start.replace(hour=0, minute=0, second=0, microsecond=0)
    meta = {"scenario": scenario.to_toml(), "seed": str(seed), "start": start.isoformat(),
            "catalog": catalog.to_toml(), "version": SIM_VERSION}
    _check_store(store, meta, scenario, catalog)
    fleet = Fleet(scenario, catalog, seed, start)
    for key, value in meta.items():
        store.set_meta(f"sim.{key}", value)
    report = SimReport(seed=seed, start=start.date().isoformat(), days=days, attempts=0,
                       added=0, already_stored=0, quarantined=0, families=0, seconds=0.0,
                       status=dict.fromkeys(STATUSES, 0), placement=dict.fromkeys(CHOICES, 0))
    ran: set[int] = set()
    for first in range(0, days, chunk_days):
        last = min(first + chunk_days, days)
        tables = []
        for day in range(first, last):
            out = simulate_day(fleet, day)
            tables.append(out.table)
            ran.update(out.families.tolist())
            for k, v in out.choice_counts.items():
                report.placement[k] += v
            if progress is not None:
                progress(day + 1)
        table = pa.concat_tables(tables)
        counts = table.group_by("status").aggregate([("status", "count")]).to_pydict()
        for s, c in zip(counts["status"], counts["status_count"], strict=True):
            report.status[s] += int(c)
        r = ingest_table(store, table, catalog,
                         origin=f"simulate seed={seed} days {first}-{last - 1}")
        report.attempts += table.num_rows
        report.added += r.added
        report.already_stored += r.already_stored
        report.quarantined += r.quarantined
    old_days = store.get_meta("sim.days")
    store.set_meta("sim.days", str(max(days, int(old_days) if old_days else 0)))
    report.families = len(ran)
    report.seconds = round(time.perf_counter() - t0, 3)
    return report
