"""Analytic throughput estimates from a job's shape and a hardware type's spec sheet.

These are the learner's own first-principles features (roofline compute time, weight
streaming time, gradient all-reduce time, memory fit). They are deliberately simple and
independent of the simulator's hidden truth: the model learns the corrections.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from leap.catalog import SPEC_COLUMNS, Catalog
from leap.features.columns import SMALL, Columns, factorize

#: Bytes of weights + gradients + optimizer state per parameter (mixed-precision Adam).
TRAIN_BYTES_PER_PARAM = 16.0
#: 16-bit gradients are all-reduced; ring all-reduce moves ~2x the buffer.
ALLREDUCE_BYTES_PER_PARAM = 4.0

#: Activation bytes of one sample per transformer layer and per unit of sequence x width, at
#: 16-bit precision: the ``s h (34 + 5 a s / h)`` bytes per layer of Korthikanti et al. 2022,
#: "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198, eq. 1),
#: without the attention-score term.
ACTIVATION_BYTES = 34.0

#: Which peak each precision runs at: 0 fp32, 1 tf32, 2 bf16, 3 another 16-bit or 8-bit
#: format (and an unknown precision), at the 16-bit rate.
PEAK_KIND = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3, "fp8": 3}


def hardware_specs(catalog: Catalog, hardware: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row arrays of every :data:`~leap.catalog.SPEC_COLUMNS` figure (vectorised lookup)."""
    if len(hardware) <= SMALL:  # the catalog's per-name rows: no factorizing a request's types
        matrix = catalog.spec_matrix(hardware)
    else:
        codes, uniques = factorize(hardware)
        matrix = catalog.spec_matrix(list(uniques))[codes]
    return {name: matrix[:, i] for i, name in enumerate(SPEC_COLUMNS)}


def peak_flops(precision: np.ndarray, specs: dict[str, np.ndarray]) -> np.ndarray:
    """Peak dense FLOP/s per device for each row's precision on each row's hardware."""
    bf16 = specs["peak_bf16_tflops"] * 1e12
    fp32 = specs["peak_fp32_tflops"] * 1e12
    # TF32 tensor cores run at about half the 16-bit rate where they exist (NVIDIA Ampere on,
    # the same generations that brought bf16); never below fp32. bf16 on a type without bf16
    # tensor cores (V100, T4) runs at the fp32 rate.
    old = specs["bf16_native"] == 0.0

    def rate(kind: int) -> np.ndarray:
        if kind == 0:
            return fp32
        if kind == 1:
            return np.where(old, fp32, np.maximum(bf16 / 2.0, fp32))
        return np.where(old, fp32, bf16) if kind == 2 else bf16

    if len(precision) <= SMALL:
        distinct = set(precision)
        if len(distinct) <= 1:  # one precision (every row of a request): its rate alone
            return rate(PEAK_KIND.get(distinct.pop(), 3) if distinct else 3)
        kind = np.array([PEAK_KIND.get(p, 3) for p in precision], dtype=np.int64)
    else:  # looked up once per distinct precision
        codes, names = factorize(np.asarray(precision, dtype=object))
        kind = np.array([PEAK_KIND.get(p, 3) for p in names], dtype=np.int64)[codes]
    return np.choose(kind, [rate(k) for k in range(4)])


def activation_bytes(jobs: Columns) -> np.ndarray:
    """Activation bytes one sample writes in a step and reads back in the backward pass,
    ``ACTIVATION_BYTES x seq_len x hidden_dim x num_layers`` (a missing ``seq_len`` counts as
    1, as for a model without a sequence; NaN without ``hidden_dim`` or ``num_layers``)."""
    return ACTIVATION_BYTES * np.fmax(jobs.num("seq_len"), 1.0) * jobs.num("hidden_dim") \
        * jobs.num("num_layers")


def estimates(jobs: Columns | pd.DataFrame, catalog: Catalog) -> dict[str, np.ndarray]:
    """Physics features for each row of ``jobs`` on the hardware named in its ``hardware`` column.

    Returns a dict of float64 arrays (NaN where an input is missing), all per row:
    ``log_compute_sps`` (log samples/s if compute bound at peak), ``log_weight_stream_sps``
    (log samples/s if each step must stream the weights once), ``log_comm_s`` (log seconds of
    one gradient all-reduce), ``comm_to_compute`` (ratio of the two step times),
    ``mem_fit`` (training bytes per device over device memory: > 1 does not fit) and
    ``log_phys_sps``, the combined estimate used as the baseline for history residuals.

    Examples
    --------
    >>> import pandas as pd
    >>> from leap.catalog import SPEC_COLUMNS, Catalog
    >>> jobs = pd.DataFrame({"hardware": ["H100-SXM"], "trainer_count": [1], "batch_size": [32],
    ...                      "devices_per_trainer": [8], "flops_per_sample": [1e12],
    ...                      "num_params": [1e8], "precision": ["bf16"]})
    >>> round(float(estimates(jobs, Catalog.default())["mem_fit"][0]), 3)
    0.02
    """
    cols = jobs if isinstance(jobs, Columns) else Columns.from_frame(jobs)
    return estimates_on_specs(cols, catalog)[0]


def estimates_on_specs(cols: Columns, catalog: Catalog
                       ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """:func:`estimates`, with what it read on the way: each row's spec figures
    (:func:`hardware_specs`) and its peak FLOP/s (:func:`peak_flops`), which the pair model's
    rows read too."""
    specs = hardware_specs(catalog, cols.obj("hardware"))
    mem_gb = specs["memory_gb"]
    mem_bw = specs["mem_bw_gb_per_s"] * 1e9
    intra_bw = specs["intra_node_bw_gb_per_s"] * 1e9
    inter_bw = specs["inter_node_bw_gbit_per_s"] * 1e9 / 8.0

    def filled(name: str) -> np.ndarray:
        return np.fmax(cols.num(name), 1.0)  # a missing value (NaN) reads as 1

    trainers = filled("trainer_count")
    devices = trainers * filled("devices_per_trainer")
    batch = filled("batch_size")
    flops = cols.num("flops_per_sample")
    params = cols.num("num_params")
    shard = filled("tensor_parallel") * filled("pipeline_parallel")
    peak = peak_flops(cols.obj("precision"), specs)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        compute_step_s = batch * flops / peak
        weight_step_s = 2.0 * params / shard / mem_bw
        link_bw = np.where(trainers > 1, inter_bw, intra_bw)
        multi = (devices > 1).astype(np.float64)
        comm_s = multi * ALLREDUCE_BYTES_PER_PARAM * params / shard / link_bw
        step_s = np.fmax(compute_step_s, weight_step_s) + 0.5 * comm_s
        log_compute = np.log(devices * batch / compute_step_s)
        log_stream = np.log(devices * batch / weight_step_s)
        log_phys = np.log(devices * batch / step_s)
        mem_fit = params * TRAIN_BYTES_PER_PARAM / shard / (mem_gb * 1e9)
        comm_ratio = comm_s / np.fmax(compute_step_s, weight_step_s)
        log_comm = np.log(comm_s)
    # Without FLOPs the estimate is a pure hardware-speed proxy (devices x geometric mean of
    # peak FLOP/s and memory bandwidth, in arbitrary units): history residuals over it still
    # transfer a family's level across hardware, as spec-ratio scaling does. Not the weight
    # streaming time alone, though the parameter count gives it: that is a bound (a step
    # streams the weights at least once), linear in the batch, and where the batch follows
    # each type's memory (public tables run the largest batch that fits) it carried the
    # batch ratio, not the speed ratio: 2-3x off on Lambda PyTorch's Transformer-XL rows.
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_proxy = np.log(devices) + 0.5 * np.log(peak / 1e12) + 0.5 * np.log(mem_bw / 1e9)
    log_phys = np.where(np.isfinite(log_compute), log_phys, log_proxy)
    return {
        "log_compute_sps": _finite(log_compute),
        "log_weight_stream_sps": _finite(log_stream),
        "log_comm_s": _finite(log_comm),
        "comm_to_compute": _finite(comm_ratio),
        "mem_fit": _finite(mem_fit),
        "log_phys_sps": _finite(log_phys),
        "log_devices": np.log(devices),
    }, specs, peak


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, np.nan)
