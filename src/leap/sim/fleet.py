"""The reference fleet, rebuilt deterministically from (scenario, catalog, seed, start).

:class:`Fleet` holds the model types, the families (growing day by day), their efficiency
paths over time and the hardware pool; it is also the oracle: :meth:`Fleet.true_throughput`
gives the true median samples/s of any job on any type at any time. The oracle is for
evaluation only, never a feature.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from leap.catalog import Catalog
from leap.data.schema import PRECISIONS
from leap.errors import CatalogError, ConfigError, DataError, ParamError, did_you_mean
from leap.sim.families import Families, make_families
from leap.sim.models import ModelTypes, make_model_types
from leap.sim.physics import HardwarePool, JobShape, fits, ideal_samples_per_s
from leap.sim.scenario import Scenario

if TYPE_CHECKING:
    from leap.data.store import Store

#: Bump when the simulator's physics or random streams change: the oracle of a store
#: simulated by another version would not match its attempts.
SIM_VERSION = "1"

# Independent random streams: (seed, stream[, day]) so each day's draws do not depend on
# how many days are simulated, and a longer run repeats a shorter one exactly.
S_TYPES, S_TYPE_VENDOR, S_INITIAL, S_ARRIVALS, S_DRIFT, S_ATTEMPTS, S_SCHEDULER = range(1, 8)

JobsLike: TypeAlias = pa.Table | pd.DataFrame
_DAY = timedelta(days=1)
_US_PER_DAY = 86_400_000_000


def day_rng(seed: int, stream: int, day: int | None = None) -> np.random.Generator:
    """The generator of one stream (and day): the only source of randomness."""
    key = [seed, stream] if day is None else [seed, stream, day + 1_000_000]
    return np.random.default_rng(key)


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class Fleet:
    """Model types, families and hardware of the reference fleet, and its oracle.

    Parameters
    ----------
    scenario : Scenario
        The knobs (see ``resources/default_scenario.toml``).
    catalog : Catalog
        The hardware types; ``scenario.new_hardware`` must be one of them (or empty).
    seed : int
        Non-negative; the same seed gives the same fleet.
    start : datetime
        Midnight UTC of simulated day 0.

    Examples
    --------
    >>> from leap.catalog import Catalog
    >>> sc = Scenario.load().override(initial_families=200, n_model_types=40)
    >>> fleet = Fleet(sc, Catalog.default(), seed=1, start=datetime(2026, 1, 1, tzinfo=UTC))
    >>> len(fleet.types), len(fleet.families)
    (40, 200)
    """

    def __init__(self, scenario: Scenario, catalog: Catalog, seed: int, start: datetime) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"seed must be a whole number >= 0, got {seed!r}")
        seed = int(seed)
        if scenario.new_hardware and scenario.new_hardware not in catalog.names:
            raise ConfigError(f"scenario: new_hardware '{scenario.new_hardware}' is not in the "
                              f"catalog{did_you_mean(scenario.new_hardware, catalog)}; set it to "
                              "a catalog name, or to \"\" for none")
        self.scenario = scenario
        self.catalog = catalog
        self.seed = seed
        self.start = _utc(start)
        self.pool = HardwarePool.from_catalog(catalog, scenario)
        self.types: ModelTypes = make_model_types(day_rng(seed, S_TYPES), scenario.n_model_types,
                                                  dict(scenario.category_share))
        self.type_vendor = day_rng(seed, S_TYPE_VENDOR).normal(
            0.0, scenario.type_vendor_sd, (len(self.types), len(self.pool.vendors)))
        self.families: Families = make_families(
            day_rng(seed, S_INITIAL), scenario.initial_families, arrival_day=-1,
            types=self.types, pool=self.pool, scenario=scenario)
        # Efficiency paths [family, day], grown by doubling so extending is amortised O(1).
        self._drift = np.zeros((max(len(self.families), 1) * 2, 64))
        self._days = 1
        self._family_ids: np.ndarray = np.empty(0, dtype=object)
        self._family_id_set = pa.array([], pa.string())

    # Time -----------------------------------------------------------------------------------
    @property
    def days(self) -> int:
        """Number of days whose families and drift are built so far."""
        return self._days

    def ensure_days(self, n_days: int) -> None:
        """Grow families and efficiency paths up to day ``n_days - 1`` (deterministic)."""
        sc = self.scenario
        for day in range(self._days, n_days):
            rng = day_rng(self.seed, S_ARRIVALS, day)
            n_new = int(rng.poisson(sc.new_families_per_day))
            if n_new:
                self.families = self.families.concat(make_families(
                    rng, n_new, arrival_day=day, types=self.types, pool=self.pool, scenario=sc))
            n = len(self.families)
            rng = day_rng(self.seed, S_DRIFT, day)
            step = np.where(rng.uniform(size=n) < sc.step_change_prob_per_day,
                            rng.normal(0.0, sc.step_change_log_sd, n), 0.0)
            inc = rng.normal(0.0, sc.drift_sd_per_day, n) + step
            # A family's path starts at zero on its arrival day.
            inc = np.where(self.families.arrival_day < day, inc, 0.0)
            rows, cols = self._drift.shape
            if n > rows or day >= cols:
                grown = np.zeros((max(rows, 2 * n if n > rows else rows),
                                  max(cols, 2 * (day + 1) if day >= cols else cols)))
                grown[:rows, :cols] = self._drift
                self._drift = grown
            self._drift[:n, day] = self._drift[:n, day - 1] + inc
            self._days = day + 1

    def day_of(self, at: datetime | Sequence[Any] | np.ndarray | pa.Array | pd.Series
               ) -> np.ndarray:
        """Simulated day index (0 = ``start``) of each time in ``at`` (UTC; naive = UTC)."""
        if isinstance(at, datetime):
            us = np.array([int(_utc(at).timestamp() * 1_000_000)])
        else:
            us = _to_utc_us(at)
        start_us = int(self.start.timestamp() * 1_000_000)
        days = np.floor_divide(us - start_us, _US_PER_DAY)
        if len(days) and (days < 0).any():
            raise DataError(f"time before the simulation start {self.start.isoformat()}; the "
                            "oracle only knows the simulated span")
        if len(days):
            self.ensure_days(int(days.max()) + 1)
        return days

    def date_of(self, day: int) -> datetime:
        return self.start + day * _DAY

    # Names ----------------------------------------------------------------------------------
    def family_ids(self) -> np.ndarray:
        """``fam-000042`` style ids of every family built so far (object array)."""
        n = len(self.families)
        if len(self._family_ids) != n:
            self._family_ids = np.array([f"fam-{i:06d}" for i in range(n)], dtype=object)
            self._family_id_set = pa.array(self._family_ids, pa.string())
        return self._family_ids

    def family_index(self, family_id: np.ndarray | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Positions of ``family_id`` values; unknown ids raise :class:`DataError`."""
        self.family_ids()
        idx = _lookup(family_id, self._family_id_set)
        if (idx < 0).any():
            bad = _as_strings(family_id).filter(pa.array(idx < 0))[0].as_py()
            raise DataError(f"family_id '{bad}' is not a family of this simulated fleet (seed "
                            f"{self.seed}); the oracle only knows simulated families")
        return idx

    def hardware_index(self, hardware: str | Sequence[str] | np.ndarray | pa.Array
                       | pa.ChunkedArray, n: int) -> np.ndarray:
        """Pool positions of hardware names (one name is broadcast to ``n`` rows)."""
        values = [hardware] if isinstance(hardware, str) else hardware
        idx = _lookup(values, pa.array(self.pool.names, pa.string()))
        if (idx < 0).any():
            bad = str(_as_strings(values).filter(pa.array(idx < 0))[0].as_py())
            raise CatalogError(f"unknown hardware '{bad}'{did_you_mean(bad, self.pool.names)}")
        if len(idx) == 1 and n != 1:
            return np.full(n, idx[0])
        if len(idx) != n:
            raise DataError(f"got {len(idx)} hardware names for {n} jobs; pass one name, or "
                            "one per job")
        return idx

    # Jobs -----------------------------------------------------------------------------------
    def job_shape(self, jobs: JobsLike) -> tuple[np.ndarray, JobShape]:
        """``(family positions, JobShape)`` of attempt-like rows.

        ``family_id``, ``trainer_count`` and ``batch_size`` are required; ``precision``,
        ``devices_per_trainer``, ``tensor_parallel`` and ``pipeline_parallel`` default to the
        family's base shape where absent or null. The model type is always the family's.
        """
        fam = self.family_index(_column(jobs, "family_id", required=True))
        base = self.families.shape(fam)

        def ints(name: str, default: np.ndarray | None) -> np.ndarray:
            col = _column(jobs, name, required=default is None)
            if col is None:
                assert default is not None
                return default
            vals = _numeric(col)
            if default is None:
                if np.isnan(vals).any() or (vals < 1).any():
                    raise DataError(f"column '{name}' must be a whole number >= 1 in every job")
                return vals.astype(np.int64)
            return np.where(np.isnan(vals), default, vals).astype(np.int64)

        prec_col = _column(jobs, "precision", required=False)
        precision = base.precision
        if prec_col is not None:
            lowered = pc.utf8_lower(_as_strings(prec_col))
            pidx = _lookup(lowered, pa.array(PRECISIONS, pa.string()))
            precision = np.where(pidx >= 0, pidx, base.precision)
        shape = JobShape(
            model_type=base.model_type,
            trainer_count=ints("trainer_count", None),
            devices_per_trainer=ints("devices_per_trainer", base.devices_per_trainer),
            batch_size=ints("batch_size", None),
            precision=precision,
            tensor_parallel=ints("tensor_parallel", base.tensor_parallel),
            pipeline_parallel=ints("pipeline_parallel", base.pipeline_parallel),
        )
        return fam, shape

    def log_effect(self, fam: np.ndarray, hw: np.ndarray, day: np.ndarray) -> np.ndarray:
        """Hidden log-multiplier: family efficiency, vendor affinities, drift, stack maturity."""
        self.ensure_days(int(np.max(day, initial=0)) + 1)
        vendor = self.pool.vendor_idx[hw]
        mt = self.families.model_type[fam]
        cat = self.types.category[mt]
        return (self.families.log_eff[fam] + self.families.affinity[fam, vendor]
                + self.type_vendor[mt, vendor] + self._drift[fam, day]
                + np.log(self.pool.vendor_category_factor[hw, cat]))

    def samples_per_s(self, fam: np.ndarray, shape: JobShape, hw: np.ndarray,
                      day: np.ndarray) -> np.ndarray:
        """True median samples/s from positions and shapes (NaN where it does not fit)."""
        ideal = ideal_samples_per_s(self.types, shape, self.pool, hw)
        return ideal * np.exp(self.log_effect(fam, hw, day))

    # Oracle API -----------------------------------------------------------------------------
    def true_throughput(self, jobs: JobsLike, hardware: str | Sequence[str] | np.ndarray,
                        at: datetime | Sequence[Any] | np.ndarray | pa.Array) -> np.ndarray:
        """The true median samples/s of each job on ``hardware`` at ``at`` (evaluation only).

        Parameters
        ----------
        jobs : pyarrow.Table or pandas.DataFrame
            Attempt-like rows (see :meth:`job_shape`); the same job may be asked on any type.
        hardware : str or array-like of str
            One type for all rows, or one per row.
        at : datetime or array-like of datetimes
            One time for all rows, or one per row (e.g. ``submitted_at``).

        Returns
        -------
        numpy.ndarray
            float64 per row; NaN where the job does not fit the type (memory or host size).

        Examples
        --------
        >>> from leap.catalog import Catalog
        >>> sc = Scenario.load().override(initial_families=100, n_model_types=30)
        >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
        >>> fleet = Fleet(sc, Catalog.default(), seed=3, start=t0)
        >>> jobs = fleet.base_jobs(np.arange(3))
        >>> fleet.true_throughput(jobs, "H100-SXM", t0).shape
        (3,)
        """
        # Time first: it grows the fleet to that day, so later families are known.
        day = self.day_of(at)
        fam, shape = self.job_shape(jobs)
        n = len(fam)
        hw = self.hardware_index(hardware, n)
        day = np.full(n, day[0]) if len(day) == 1 else day
        if len(day) != n:
            raise DataError(f"got {len(day)} times for {n} jobs; pass one time, or one per job")
        return self.samples_per_s(fam, shape, hw, day)

    def eligible(self, jobs: JobsLike, at: datetime | Sequence[Any] | np.ndarray | pa.Array
                 ) -> np.ndarray:
        """Bool ``[n_jobs, n_types]`` (columns: :attr:`hardware_names`): the job's own shape
        fits the type and the type takes jobs at ``at``."""
        day = self.day_of(at)
        fam, shape = self.job_shape(jobs)
        n = len(fam)
        day = np.full(n, day[0]) if len(day) == 1 else day
        if len(day) != n:
            raise DataError(f"got {len(day)} times for {n} jobs; pass one time, or one per job")
        t = len(self.pool.names)
        rows = np.repeat(np.arange(n), t)
        hw = np.tile(np.arange(t), n)
        ok = fits(self.types, shape.take(rows), self.pool, hw).reshape(n, t)
        return ok & self.pool.available(day)

    @property
    def hardware_names(self) -> tuple[str, ...]:
        return self.pool.names

    def base_jobs(self, fam: np.ndarray) -> pa.Table:
        """Attempt-like rows with the base shape of families ``fam`` (for examples/tests)."""
        s = self.families.shape(np.asarray(fam))
        return pa.table({
            "family_id": self.family_ids()[fam].tolist(),
            "model_type": self.types.name[s.model_type].tolist(),
            "trainer_count": s.trainer_count, "batch_size": s.batch_size,
            "precision": [PRECISIONS[p] for p in s.precision],
            "devices_per_trainer": s.devices_per_trainer,
            "tensor_parallel": s.tensor_parallel, "pipeline_parallel": s.pipeline_parallel,
        })

    # Capacity -------------------------------------------------------------------------------
    def requested_device_hours(self, fam: np.ndarray, devices: np.ndarray) -> np.ndarray:
        """What the scheduler books for an attempt: devices x the family's median hours
        (at most one day)."""
        return devices * np.minimum(np.exp(self.families.dur_log_hours[fam]), 24.0)

    def capacity_device_hours(self, day: int) -> np.ndarray:
        """Device-hours each type offers on ``day``: its share of the expected bookings."""
        self.ensure_days(day + 1)
        f = self.families
        alive = f.alive(day)
        w = np.where(alive, f.weight, 0.0)
        all_idx = np.arange(len(f))
        booked = self.requested_device_hours(all_idx, f.shape().devices)
        expected = float((w * booked).sum() / max(w.sum(), 1e-12)) \
            * self.scenario.attempts_per_day
        share = np.where(self.pool.available(day), self.pool.share, 0.0)
        return share / share.sum() * expected * self.scenario.capacity_factor

    # Store ----------------------------------------------------------------------------------
    @classmethod
    def from_store(cls, store: Store) -> Fleet:
        """Rebuild the fleet that ``leap simulate`` wrote into ``store``.

        Raises
        ------
        ConfigError
            The store was not simulated, or by another simulator version.
        """
        meta = {k: store.get_meta(f"sim.{k}") for k in ("scenario", "seed", "start", "catalog",
                                                         "version")}
        if meta["scenario"] is None or meta["seed"] is None or meta["start"] is None:
            raise ConfigError(f"attempt store {store.path} holds no simulated fleet (no "
                              "sim.* metadata); the oracle needs a store written by "
                              "`leap simulate`")
        if meta["version"] != SIM_VERSION:
            raise ParamError(f"attempt store {store.path} was simulated by simulator version "
                             f"{meta['version']}, this leap has {SIM_VERSION}; simulate again "
                             "into a fresh {home}")
        scenario = Scenario.from_toml(meta["scenario"], origin="store sim.scenario")
        catalog = Catalog.from_toml(meta["catalog"], origin="store sim.catalog") \
            if meta["catalog"] else Catalog.default()
        start = datetime.fromisoformat(meta["start"])
        fleet = cls(scenario, catalog, int(meta["seed"]), start)
        days = store.get_meta("sim.days")
        if days:
            fleet.ensure_days(int(days))
        return fleet


def _numeric(col: Any) -> np.ndarray:
    """Float64 values of a column (nulls and non-numbers as NaN)."""
    if isinstance(col, pa.ChunkedArray | pa.Array):
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            return np.asarray(col.cast(pa.float64()).to_numpy(zero_copy_only=False),
                              dtype=np.float64)
        col = col.to_numpy(zero_copy_only=False)
    arr = np.asarray(col)
    if arr.dtype.kind in "biuf":
        return arr.astype(np.float64)
    return pd.to_numeric(pd.Series(arr), errors="coerce").to_numpy(np.float64)


def _as_strings(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values.cast(pa.string()) if values.type != pa.string() else values
    return pa.array(np.asarray(values, dtype=object), pa.string(), from_pandas=True)


def _lookup(values: Any, choices: pa.Array) -> np.ndarray:
    """Position of each value in ``choices`` (hash lookup in Arrow); -1 when absent."""
    idx = pc.index_in(_as_strings(values), value_set=choices)
    return np.asarray(idx.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _to_utc_us(at: Sequence[Any] | np.ndarray | pa.Array | pa.ChunkedArray | pd.Series
               ) -> np.ndarray:
    """Microseconds since the epoch (int64) of UTC times; naive times are UTC."""
    if isinstance(at, pa.Array | pa.ChunkedArray) and pa.types.is_timestamp(at.type):
        if at.null_count:
            raise DataError("a time given to the oracle is empty; pass one per job")
        # Timestamps are stored as UTC instants whatever their display zone.
        return np.asarray(at.cast(pa.timestamp("us", tz=at.type.tz)).cast(pa.int64())
                          .to_numpy(zero_copy_only=False), dtype=np.int64)
    if isinstance(at, np.ndarray) and np.issubdtype(at.dtype, np.datetime64):
        if np.isnat(at).any():
            raise DataError("a time given to the oracle is empty; pass one per job")
        return at.astype("datetime64[us]").astype(np.int64)
    values = at.to_pylist() if isinstance(at, pa.Array | pa.ChunkedArray) else at
    ts = pd.to_datetime(pd.Series(values), utc=True)
    if ts.isna().any():
        raise DataError("a time given to the oracle is empty; pass one per job")
    return ts.dt.as_unit("us").astype("int64").to_numpy()


def _column(jobs: JobsLike, name: str, *, required: bool) -> Any:
    """A column (Arrow for a Table, NumPy for a DataFrame), or None when absent and optional."""
    if isinstance(jobs, pa.Table):
        if name not in jobs.column_names:
            if required:
                raise DataError(f"jobs lack required column '{name}'")
            return None
        return jobs.column(name)
    if isinstance(jobs, pd.DataFrame):
        if name not in jobs.columns:
            if required:
                raise DataError(f"jobs lack required column '{name}'")
            return None
        return jobs[name].to_numpy()
    raise DataError(f"jobs must be a pyarrow Table or a pandas DataFrame, got "
                    f"{type(jobs).__name__}")
