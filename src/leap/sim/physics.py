"""Throughput truth of the reference fleet: roofline, batch efficiency, communication, memory.

Everything here is vectorised over rows (one row = one job shape on one hardware type). The
hidden per-family and per-vendor effects are applied by :mod:`leap.sim.fleet` on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leap.catalog import Catalog
from leap.data.schema import PRECISIONS
from leap.sim.models import ModelTypes
from leap.sim.scenario import CATEGORIES, Scenario

_GB = 1e9
_TERA = 1e12
#: Usable share of device memory (allocator fragmentation, CUDA context, NCCL buffers).
MEMORY_HEADROOM = 0.92
#: Framework workspace per device, bytes.
_WORKSPACE_BYTES = 1.5 * _GB
#: Optimizer state + weights + grads per parameter: bf16/fp16 weights and grads with fp32
#: master weights and Adam moments (2 + 2 + 12), or fp32 everything (4 + 4 + 8).
_STATE_BYTES_PER_PARAM = 16.0
#: With ZeRO-1 (LLMs) only the fp32 master weights and moments (12 bytes) shard over dp.
_ZERO_SHARDED_BYTES = 12.0
#: Sharded embedding tables: fp32 rows plus a row-wise optimizer state.
_EMB_BYTES_PER_PARAM = 4.5
#: Smooth maximum of compute and memory time (p-norm): near a roofline ridge both matter.
_ROOFLINE_P = 3.0
#: Collective latency per hop, seconds (intra-node, inter-node).
_LAT_INTRA_S, _LAT_INTER_S = 8e-6, 3e-5
_BUCKET_BYTES = 25e6
_A2A_LAT_INTRA_S, _A2A_LAT_INTER_S = 2e-6, 8e-6
_OVERSUBSCRIPTION = 0.15

#: Software maturity of each vendor's stack per model category (hidden, global): the order
#: of CATEGORIES. Unknown vendors get _OTHER_VENDOR.
_VENDOR_CATEGORY_FACTOR: dict[str, tuple[float, ...]] = {
    "NVIDIA": (1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00),
    "AMD": (0.80, 0.85, 0.85, 0.92, 0.80, 0.85, 0.70),
    "Intel": (0.65, 0.85, 0.85, 0.85, 0.75, 0.70, 0.60),
    "Google": (0.55, 0.95, 0.95, 1.00, 0.85, 0.70, 0.60),
    "AWS": (0.60, 0.75, 0.80, 0.92, 0.70, 0.70, 0.60),
}
_OTHER_VENDOR = (0.75,) * len(CATEGORIES)
_NO_BF16 = ("Volta", "Turing", "Pascal")
_FP8 = ("Hopper", "Ada", "Blackwell", "CDNA3", "Gaudi3", "Trainium2")


@dataclass(frozen=True)
class HardwarePool:
    """The catalog as arrays (SI units), plus the fleet's availability and capacity shares.

    ``peak_flops[h, p]`` is the dense peak of type ``h`` for precision ``PRECISIONS[p]``:
    bf16 on Volta/Turing falls back to fp32; tf32 runs at half the 16-bit peak on NVIDIA
    Ampere and later, at the fp32 peak elsewhere; fp8 doubles the 16-bit peak where supported.
    """

    names: tuple[str, ...]
    vendors: tuple[str, ...]
    vendor_idx: np.ndarray
    devices_per_host: np.ndarray
    peak_flops: np.ndarray
    memory_bytes: np.ndarray
    mem_bw_bytes_per_s: np.ndarray
    intra_bytes_per_s: np.ndarray
    inter_bytes_per_s: np.ndarray
    cost_per_device_hour: np.ndarray
    vendor_category_factor: np.ndarray
    available_from_day: np.ndarray
    share: np.ndarray

    @classmethod
    def from_catalog(cls, catalog: Catalog, scenario: Scenario) -> HardwarePool:
        """Arrays for every catalog type; shares from ``scenario.capacity_share``."""
        hws = list(catalog.values())
        names = tuple(h.name for h in hws)
        vendors = tuple(sorted({h.vendor for h in hws}))
        peak = np.zeros((len(hws), len(PRECISIONS)))
        for i, h in enumerate(hws):
            bf16 = h.peak_bf16_tflops * _TERA
            fp32 = h.peak_fp32_tflops * _TERA
            old = h.architecture.startswith(_NO_BF16)
            ampere_plus = h.vendor == "NVIDIA" and not old
            fp8 = h.architecture.startswith(_FP8) or h.name.startswith(_FP8)
            # Never slower than fp32 for a lower precision (Gaudi3's fp32 figure is odd).
            peak[i] = (fp32, max(fp32, bf16 / 2) if ampere_plus else fp32,
                       fp32 if old else bf16, bf16, 2 * bf16 if fp8 else bf16)
        available = np.zeros(len(hws), dtype=np.int64)
        if scenario.new_hardware:
            available[names.index(scenario.new_hardware)] = scenario.new_hardware_day
        share = np.array([scenario.capacity_share.get(n, scenario.default_capacity_share)
                          for n in names], dtype=np.float64)
        return cls(
            names=names, vendors=vendors,
            vendor_idx=np.array([vendors.index(h.vendor) for h in hws], dtype=np.int64),
            devices_per_host=np.array([h.devices_per_host for h in hws], dtype=np.int64),
            peak_flops=peak,
            memory_bytes=np.array([h.memory_gb * _GB for h in hws]),
            mem_bw_bytes_per_s=np.array([h.mem_bw_gb_per_s * _GB for h in hws]),
            intra_bytes_per_s=np.array([h.intra_node_bw_gb_per_s * _GB for h in hws]),
            # Gbit/s per device -> bytes/s.
            inter_bytes_per_s=np.array([h.inter_node_bw_gbit_per_s * _GB / 8 for h in hws]),
            cost_per_device_hour=np.array([h.cost_per_device_hour for h in hws]),
            vendor_category_factor=np.array(
                [_VENDOR_CATEGORY_FACTOR.get(h.vendor, _OTHER_VENDOR) for h in hws]),
            available_from_day=available, share=share,
        )

    def available(self, day: int | np.ndarray) -> np.ndarray:
        """Bool ``[T]`` (scalar day) or ``[n, T]`` (array of days): type takes jobs that day."""
        d = np.asarray(day)
        return d[..., None] >= self.available_from_day if d.ndim else \
            int(d) >= self.available_from_day


@dataclass(frozen=True)
class JobShape:
    """Per-row job shape (equal-length arrays): the public knobs of an attempt."""

    model_type: np.ndarray        # index into ModelTypes
    trainer_count: np.ndarray
    devices_per_trainer: np.ndarray
    batch_size: np.ndarray        # per trainer, samples
    precision: np.ndarray         # index into PRECISIONS
    tensor_parallel: np.ndarray
    pipeline_parallel: np.ndarray

    def take(self, idx: np.ndarray) -> JobShape:
        return JobShape(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))

    @property
    def devices(self) -> np.ndarray:
        return self.trainer_count * self.devices_per_trainer

    @property
    def data_parallel(self) -> np.ndarray:
        mp = self.tensor_parallel * self.pipeline_parallel
        return np.maximum(self.devices // np.maximum(mp, 1), 1)


def memory_bytes_per_device(types: ModelTypes, job: JobShape) -> np.ndarray:
    """Peak memory one device needs for the job (states + sharded tables + activations)."""
    t = job.model_type
    mp = (job.tensor_parallel * job.pipeline_parallel).astype(np.float64)
    dp = job.data_parallel.astype(np.float64)
    dense_shard = types.dense_params[t] / mp
    state = np.where(types.zero_sharded[t],
                     dense_shard * (_STATE_BYTES_PER_PARAM - _ZERO_SHARDED_BYTES
                                    + _ZERO_SHARDED_BYTES / dp),
                     dense_shard * _STATE_BYTES_PER_PARAM)
    emb = types.sharded_emb_params[t] * _EMB_BYTES_PER_PARAM / job.devices
    per_device_samples = job.batch_size / job.devices_per_trainer
    act = types.act_bytes_per_sample[t] * per_device_samples
    return state + emb + act + _WORKSPACE_BYTES


def fits(types: ModelTypes, job: JobShape, pool: HardwarePool, hw: np.ndarray) -> np.ndarray:
    """Bool per row: the job can run on type ``hw`` (memory, host size, a valid layout)."""
    mp = job.tensor_parallel * job.pipeline_parallel
    layout = (job.devices % np.maximum(mp, 1) == 0) & (job.devices >= mp) \
        & (job.devices_per_trainer <= pool.devices_per_host[hw])
    need = memory_bytes_per_device(types, job)
    return layout & (need <= pool.memory_bytes[hw] * MEMORY_HEADROOM)


def ideal_samples_per_s(types: ModelTypes, job: JobShape, pool: HardwarePool,
                        hw: np.ndarray) -> np.ndarray:
    """Median samples/s of the whole job before hidden family/vendor effects.

    NaN where the job does not fit (see :func:`fits`).

    The step time of one device is a smooth roofline of compute and memory time divided by
    the batch efficiency ``b / (b + b_half)``, plus pipeline bubbles and a fixed per-step
    overhead; tensor-parallel and all-to-all traffic add to it, and the data-parallel
    gradient all-reduce adds only what does not overlap with compute. A host's input
    pipeline caps the rate of each trainer.
    """
    t = job.model_type
    f = types
    devices = job.devices.astype(np.float64)
    mp = (job.tensor_parallel * job.pipeline_parallel).astype(np.float64)
    dp = job.data_parallel.astype(np.float64)
    tp = job.tensor_parallel.astype(np.float64)
    pp = job.pipeline_parallel.astype(np.float64)
    global_batch = job.batch_size.astype(np.float64) * job.trainer_count
    per_device = global_batch / devices
    per_rank = global_batch / dp
    peak = pool.peak_flops[hw, job.precision] * f.eff_cap[t]
    compute_s = f.flops_per_sample[t] * per_device / peak
    # Weights, grads and optimizer state stream through memory once per step.
    weight_bytes = f.dense_params[t] / mp * 20.0
    memory_s = (f.bytes_per_sample[t] * per_device + weight_bytes) / pool.mem_bw_bytes_per_s[hw]
    core = (compute_s ** _ROOFLINE_P + memory_s ** _ROOFLINE_P) ** (1 / _ROOFLINE_P)
    # Small per-device batches leave the device underused; the half-saturation batch grows
    # with the device's speed and shrinks with the work per sample.
    b_half = peak * f.saturation_s[t] / f.flops_per_sample[t]
    core = core * (per_device + b_half) / per_device
    micro = np.clip(per_rank, 1.0, 4.0 * pp)
    core = core * (1.0 + (pp - 1.0) / micro) + f.overhead_s[t]

    multi = job.trainer_count > 1
    intra = pool.intra_bytes_per_s[hw]
    # The fabric is oversubscribed: the more hosts talk at once, the less each one gets.
    inter = pool.inter_bytes_per_s[hw] / (1.0 + _OVERSUBSCRIPTION * np.log2(
        np.maximum(job.trainer_count, 1)))
    act_bytes = per_rank * f.seq_len_or_one[t] * f.hidden_dim[t] * 2.0
    tp_s = np.where(tp > 1, 4.0 * f.num_layers[t] / pp * act_bytes * 2 * (tp - 1) / tp / intra,
                    0.0)
    pp_s = np.where(pp > 1, 2.0 * act_bytes / np.where(multi, inter, intra), 0.0)
    grad_bytes = f.dense_params[t] / mp * np.where(job.precision <= 1, 4.0, 2.0)
    dp_bw = np.where(multi, inter, intra)
    hops = np.log2(np.maximum(dp, 1.0))
    buckets = np.ceil(grad_bytes / _BUCKET_BYTES)
    dp_s = np.where(dp > 1, 2 * (dp - 1) / dp * grad_bytes / dp_bw
                    + 2 * hops * buckets * np.where(multi, _LAT_INTER_S, _LAT_INTRA_S), 0.0)
    exposed_dp = np.maximum(0.0, dp_s - f.overlap[t] * core)
    # All-to-all of pooled embeddings: bandwidth, plus one message per peer device.
    a2a_s = np.where((devices > 1) & (f.a2a_bytes_per_sample[t] > 0),
                     per_device * f.a2a_bytes_per_sample[t] * (devices - 1) / devices / dp_bw
                     + (devices - 1) * np.where(multi, _A2A_LAT_INTER_S, _A2A_LAT_INTRA_S),
                     0.0)
    step_s = core + tp_s + pp_s + exposed_dp + a2a_s
    sps = global_batch / step_s
    # The input pipeline (read, decode, shuffle) of one host bounds each trainer.
    host_cap = f.host_samples_per_s[t] * job.trainer_count
    sps = 1.0 / (1.0 / sps ** 4 + 1.0 / host_cap ** 4) ** 0.25
    return np.where(fits(types, job, pool, hw), sps, np.nan)


def model_flops_utilization(types: ModelTypes, job: JobShape, pool: HardwarePool,
                            hw: np.ndarray, samples_per_s: np.ndarray) -> np.ndarray:
    """Achieved share of the devices' dense peak at ``samples_per_s`` (for reports)."""
    peak = pool.peak_flops[hw, job.precision] * job.devices
    return samples_per_s * types.flops_per_sample[job.model_type] / peak
