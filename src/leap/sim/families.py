"""Job families of the reference fleet: recurring jobs with a base shape and hidden effects."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from leap.data.schema import PRECISIONS
from leap.sim.models import ModelTypes
from leap.sim.physics import MEMORY_HEADROOM, HardwarePool, JobShape, memory_bytes_per_device
from leap.sim.scenario import CATEGORIES, Scenario

_DPT_CHOICES = np.array([1, 2, 4, 8])
#: Per category (order of CATEGORIES): devices-per-trainer probabilities for 1, 2, 4, 8.
_DPT_P = np.array([
    [0.15, 0.10, 0.25, 0.50], [0.30, 0.15, 0.20, 0.35], [0.25, 0.15, 0.25, 0.35],
    [0.00, 0.00, 0.20, 0.80], [0.30, 0.20, 0.20, 0.30], [0.70, 0.15, 0.10, 0.05],
    [0.50, 0.20, 0.20, 0.10]])
#: Mean of log2(trainer_count) (exponential), by category: most jobs are small.
_TRAINERS_LOG2_MEAN = np.array([1.5, 1.0, 1.2, 2.5, 1.0, 0.4, 0.6])
#: Per-device batch size range (log-uniform), by category.
_BATCH_LO = np.array([256.0, 16.0, 8.0, 1.0, 4.0, 1024.0, 64.0])
_BATCH_HI = np.array([8192.0, 256.0, 64.0, 8.0, 32.0, 32768.0, 1024.0])
#: Precision probabilities (order of PRECISIONS: fp32, tf32, bf16, fp16, fp8), by category.
_PRECISION_P = np.array([
    [0.35, 0.20, 0.35, 0.10, 0.00], [0.15, 0.15, 0.45, 0.25, 0.00],
    [0.10, 0.15, 0.45, 0.30, 0.00], [0.00, 0.03, 0.75, 0.10, 0.12],
    [0.10, 0.10, 0.50, 0.30, 0.00], [0.55, 0.20, 0.20, 0.05, 0.00],
    [0.50, 0.20, 0.25, 0.05, 0.00]])
#: How strongly a category's home types lean to fast devices (exponent on 16-bit peak).
_HOME_PEAK_EXPONENT = np.array([0.3, 0.5, 0.7, 1.5, 0.5, -0.7, 0.0])
MAX_TRAINERS = 512
_FAMILY_DURATION_SD = 0.6
assert len(_DPT_P) == len(CATEGORIES) == len(_PRECISION_P)
assert _PRECISION_P.shape[1] == len(PRECISIONS)


@dataclass(frozen=True)
class Families:
    """All families, as arrays in creation order (index = position in ``family_id``).

    ``home[f]`` lists the family's preferred hardware (indices into the pool, best first,
    -1 padded); ``fit_base[f, h]`` says its base shape fits type ``h``. ``log_eff`` and
    ``affinity[f, vendor]`` are the hidden effects; ``dur_log_hours`` the log of its median
    attempt duration; ``weight`` its relative attempt rate.
    """

    model_type: np.ndarray
    trainer_count: np.ndarray
    devices_per_trainer: np.ndarray
    batch_size: np.ndarray
    precision: np.ndarray
    tensor_parallel: np.ndarray
    pipeline_parallel: np.ndarray
    weight: np.ndarray
    log_eff: np.ndarray
    affinity: np.ndarray
    arrival_day: np.ndarray
    retire_day: np.ndarray
    home: np.ndarray
    fit_base: np.ndarray
    dur_log_hours: np.ndarray

    def __len__(self) -> int:
        return len(self.model_type)

    def shape(self, idx: np.ndarray | slice = slice(None)) -> JobShape:
        """The base job shape of families ``idx``."""
        return JobShape(self.model_type[idx], self.trainer_count[idx],
                        self.devices_per_trainer[idx], self.batch_size[idx],
                        self.precision[idx], self.tensor_parallel[idx],
                        self.pipeline_parallel[idx])

    def concat(self, other: Families) -> Families:
        return Families(**{f.name: np.concatenate([getattr(self, f.name),
                                                   getattr(other, f.name)])
                           for f in fields(self)})

    def alive(self, day: int) -> np.ndarray:
        return (self.arrival_day <= day) & (day < self.retire_day)


def _pow2_ceil(x: np.ndarray) -> np.ndarray:
    return (2 ** np.ceil(np.log2(np.maximum(x, 1.0)))).astype(np.int64)


def fit_matrix(types: ModelTypes, shape: JobShape, pool: HardwarePool
               ) -> tuple[np.ndarray, np.ndarray]:
    """``(fits[n, T], memory_share[n, T])``: fit of each shape on every type."""
    need = memory_bytes_per_device(types, shape)
    share = need[:, None] / (pool.memory_bytes[None, :] * MEMORY_HEADROOM)
    mp = shape.tensor_parallel * shape.pipeline_parallel
    layout = (shape.devices % mp == 0) & (shape.devices >= mp)
    host = shape.devices_per_trainer[:, None] <= pool.devices_per_host[None, :]
    return (share <= 1.0) & host & layout[:, None], share


def make_families(rng: np.random.Generator, n: int, *, arrival_day: int, types: ModelTypes,
                  pool: HardwarePool, scenario: Scenario) -> Families:
    """Draw ``n`` families arriving on ``arrival_day`` (negative: alive before the start).

    Each base shape is repaired (smaller batch, more trainers) until it fits at least one
    type available on its arrival day; its home types are drawn among the fitting ones,
    weighted by capacity share, by a category's taste for fast devices and by headroom.
    """
    pop = types.popularity / types.popularity.sum()
    mt = rng.choice(len(types), n, p=pop)
    cat = types.category[mt]
    u = rng.uniform(size=n)
    dpt = _DPT_CHOICES[(u[:, None] > np.cumsum(_DPT_P[cat], axis=1)).sum(axis=1).clip(0, 3)]
    trainers = np.clip(np.round(2 ** rng.exponential(_TRAINERS_LOG2_MEAN[cat])), 1,
                       256).astype(np.int64)
    per_device = np.maximum(1, np.round(np.exp(rng.uniform(
        np.log(_BATCH_LO[cat]), np.log(_BATCH_HI[cat]))))).astype(np.int64)
    u = rng.uniform(size=n)
    precision = (u[:, None] > np.cumsum(_PRECISION_P[cat], axis=1)).sum(axis=1).clip(
        0, len(PRECISIONS) - 1)

    # Model parallelism for LLMs sized so the weights shard to a few GB per device.
    llm = cat == CATEGORIES.index("llm")
    need = np.ceil(types.dense_params[mt] * 6.0 / 24e9)
    tp = np.where(llm, np.minimum(dpt, _pow2_ceil(need)), 1).astype(np.int64)
    pp = np.where(llm, np.minimum(_pow2_ceil(need / tp), 16), 1).astype(np.int64)
    trainers = np.maximum(trainers, pp)
    trainers = (np.ceil(trainers / pp) * pp).astype(np.int64)

    avail = pool.available(max(arrival_day, 0))
    for _ in range(16):
        shape = JobShape(mt, trainers, dpt, per_device * dpt, precision, tp, pp)
        ok, _share = fit_matrix(types, shape, pool)
        stuck = ~(ok & avail).any(axis=1)
        if not stuck.any():
            break
        shrink = stuck & (per_device > 1)
        grow = stuck & ~shrink & (trainers * 2 <= MAX_TRAINERS)
        per_device = np.where(shrink, np.maximum(1, per_device // 2), per_device)
        trainers = np.where(grow, trainers * 2, trainers)
    shape = JobShape(mt, trainers, dpt, per_device * dpt, precision, tp, pp)
    fit_base, share = fit_matrix(types, shape, pool)
    placeable = (fit_base & avail).any(axis=1)

    peak16 = pool.peak_flops[:, PRECISIONS.index("bf16")]
    taste = (peak16 / peak16.mean())[None, :] ** _HOME_PEAK_EXPONENT[cat][:, None]
    w = pool.share[None, :] * taste * np.where(share < 0.7, 1.0, 0.3)
    w = np.where(fit_base & avail[None, :], w, 0.0)
    with np.errstate(divide="ignore"):
        keys = np.log(w) + rng.gumbel(size=w.shape)  # Gumbel top-k: weighted, no repeats
    order = np.argsort(-keys, axis=1)
    k_max = scenario.home_types_max
    k = rng.integers(scenario.home_types_min, k_max + 1, n)
    home = order[:, :k_max].astype(np.int64)
    valid = (np.arange(k_max)[None, :] < k[:, None]) \
        & np.take_along_axis(w > 0, home, axis=1)
    home = np.where(valid, home, -1)

    rate = np.minimum(rng.pareto(scenario.family_rate_pareto_alpha, n) + 1.0,
                      scenario.family_rate_cap)
    lifetime = np.ceil(rng.exponential(scenario.family_mean_lifetime_days, n)).astype(np.int64)
    start = max(arrival_day, 0)
    dur = (np.log(scenario.duration_median_hours) + rng.normal(0, _FAMILY_DURATION_SD, n)
           + 0.1 * np.log2(shape.devices))
    return Families(
        model_type=mt, trainer_count=trainers, devices_per_trainer=dpt,
        batch_size=per_device * dpt, precision=precision, tensor_parallel=tp,
        pipeline_parallel=pp,
        # A family that fits nowhere never submits (kept so indices stay stable).
        weight=np.where(placeable, rate, 0.0),
        log_eff=rng.normal(0.0, scenario.family_log_eff_sd, n),
        affinity=rng.normal(0.0, scenario.family_vendor_affinity_sd, (n, len(pool.vendors))),
        arrival_day=np.full(n, arrival_day, dtype=np.int64),
        retire_day=start + np.maximum(lifetime, 1),
        home=home, fit_base=fit_base, dur_log_hours=dur,
    )


def attempt_duration_sd(scenario: Scenario) -> float:
    """Per-attempt log-sd so that family + attempt spread equals ``duration_log_sd``."""
    return float(np.sqrt(max(scenario.duration_log_sd ** 2 - _FAMILY_DURATION_SD ** 2, 0.0)))
