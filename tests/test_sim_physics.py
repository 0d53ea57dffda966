"""Physical properties of the throughput model: roofline, batch, precision, memory, scale."""

from __future__ import annotations

import numpy as np
import pytest

from leap.catalog import Catalog
from leap.data.schema import PRECISIONS
from leap.sim.models import make_model_types
from leap.sim.physics import (
    HardwarePool,
    JobShape,
    fits,
    ideal_samples_per_s,
    memory_bytes_per_device,
    model_flops_utilization,
)
from leap.sim.scenario import CATEGORIES, Scenario

SC = Scenario.load()
POOL = HardwarePool.from_catalog(Catalog.default(), SC)
TYPES = make_model_types(np.random.default_rng(7), 660, dict(SC.category_share))


def hw(name: str, n: int = 1) -> np.ndarray:
    return np.full(n, POOL.names.index(name))


def of(cat: str) -> np.ndarray:
    return np.flatnonzero(TYPES.category == CATEGORIES.index(cat))


def shape(mt: np.ndarray, *, trainers: int = 1, dpt: int = 1, per_device: int = 32,
          precision: str = "bf16", tp: int = 1, pp: int = 1) -> JobShape:
    n = len(mt)
    return JobShape(mt, np.full(n, trainers), np.full(n, dpt), np.full(n, per_device * dpt),
                    np.full(n, PRECISIONS.index(precision)), np.full(n, tp), np.full(n, pp))


def test_model_types_have_public_summaries_by_category() -> None:
    assert len(TYPES) == 660
    assert set(TYPES.category.tolist()) == set(range(len(CATEGORIES)))
    llm = of("llm")
    assert TYPES.num_params[llm].min() >= 1e8 and TYPES.num_params[llm].max() <= 1e11
    assert np.isfinite(TYPES.seq_len[llm]).all() and (TYPES.seq_len[llm] >= 2048).all()
    rec = of("recommendation")
    assert (TYPES.embedding_params[rec] > TYPES.dense_params[rec]).mean() > 0.5
    assert np.isnan(TYPES.seq_len[rec]).all()
    assert (TYPES.num_sparse_features[rec] >= 20).all()
    # Transformers: about 6 FLOPs per parameter per token.
    lang = of("language")
    ratio = TYPES.flops_per_sample[lang] / (6 * TYPES.num_params[lang] * TYPES.seq_len[lang])
    assert 0.5 < np.median(ratio) < 1.5
    assert ((TYPES.eff_cap > 0.2) & (TYPES.eff_cap < 0.65)).all()


def test_faster_devices_are_faster_for_compute_bound_llms() -> None:
    mt = of("llm")[:20]
    s = shape(mt, dpt=8, per_device=1, tp=8)
    a100 = ideal_samples_per_s(TYPES, s, POOL, hw("A100-SXM4-80GB", len(mt)))
    h100 = ideal_samples_per_s(TYPES, s, POOL, hw("H100-SXM", len(mt)))
    ok = np.isfinite(a100) & np.isfinite(h100)
    assert ok.sum() >= 10
    assert (h100[ok] > 1.5 * a100[ok]).all()


def test_lower_precision_is_faster_on_tensor_cores() -> None:
    mt = of("language")[:30]
    h = hw("A100-SXM4-80GB", len(mt))
    fp32 = ideal_samples_per_s(TYPES, shape(mt, precision="fp32"), POOL, h)
    tf32 = ideal_samples_per_s(TYPES, shape(mt, precision="tf32"), POOL, h)
    bf16 = ideal_samples_per_s(TYPES, shape(mt, precision="bf16"), POOL, h)
    ok = np.isfinite(fp32)
    assert (fp32[ok] <= tf32[ok] + 1e-9).all() and (tf32[ok] <= bf16[ok] + 1e-9).all()
    assert np.median(bf16[ok] / fp32[ok]) > 3


def test_bf16_falls_back_to_fp32_on_volta() -> None:
    v100 = POOL.names.index("V100-SXM2-32GB")
    assert POOL.peak_flops[v100, PRECISIONS.index("bf16")] == \
        POOL.peak_flops[v100, PRECISIONS.index("fp32")]
    assert POOL.peak_flops[v100, PRECISIONS.index("fp16")] > \
        5 * POOL.peak_flops[v100, PRECISIONS.index("fp32")]


def test_small_batches_underuse_the_device() -> None:
    mt = of("vision")[:30]
    h = hw("H100-SXM", len(mt))
    small = ideal_samples_per_s(TYPES, shape(mt, per_device=2), POOL, h)
    big = ideal_samples_per_s(TYPES, shape(mt, per_device=64), POOL, h)
    ok = np.isfinite(small) & np.isfinite(big)
    assert (big[ok] > small[ok]).all()


def biggest(cat: str, n: int) -> np.ndarray:
    """The ``n`` model types of ``cat`` with the most dense parameters (comm-heavy)."""
    mt = of(cat)
    return mt[np.argsort(-TYPES.dense_params[mt])[:n]]


def test_more_trainers_add_throughput_but_never_superlinearly() -> None:
    mt = biggest("language", 20)
    h = hw("A100-SXM4-80GB", len(mt))
    one = ideal_samples_per_s(TYPES, shape(mt, trainers=1, dpt=8, per_device=4), POOL, h)
    many = ideal_samples_per_s(TYPES, shape(mt, trainers=16, dpt=8, per_device=4), POOL, h)
    ok = np.isfinite(one) & np.isfinite(many)
    assert ok.sum() >= 10
    per_device_gain = many[ok] / one[ok] / 16
    assert (many[ok] > one[ok]).all()
    assert (per_device_gain <= 1.0 + 1e-9).all()
    assert np.median(per_device_gain) < 0.95


def test_slow_interconnect_costs_more_for_big_gradients() -> None:
    # Same device count, one host (NVLink) vs eight hosts (the network), for big models.
    mt = biggest("language", 20)
    h = hw("A100-SXM4-80GB", len(mt))
    intra = ideal_samples_per_s(TYPES, shape(mt, trainers=1, dpt=8, per_device=4), POOL, h)
    inter = ideal_samples_per_s(TYPES, shape(mt, trainers=8, dpt=1, per_device=4), POOL, h)
    ok = np.isfinite(intra) & np.isfinite(inter)
    assert ok.sum() >= 10
    assert np.median(inter[ok] / intra[ok]) < 0.9


def test_out_of_memory_when_the_model_does_not_fit() -> None:
    big = of("llm")[np.argmax(TYPES.num_params[of("llm")])]
    s = shape(np.array([big]), per_device=4)
    assert not fits(TYPES, s, POOL, hw("T4"))[0]
    assert np.isnan(ideal_samples_per_s(TYPES, s, POOL, hw("T4")))[0]
    # Sharding over tensor and pipeline parallelism makes it fit a big-memory device.
    sharded = shape(np.array([big]), trainers=8, dpt=8, per_device=1, tp=8, pp=8)
    assert memory_bytes_per_device(TYPES, sharded)[0] < memory_bytes_per_device(TYPES, s)[0]
    assert fits(TYPES, sharded, POOL, hw("H100-SXM"))[0]


def test_host_size_limits_devices_per_trainer() -> None:
    mt = of("vision")[:1]
    s = shape(mt, dpt=8, per_device=8)
    assert not fits(TYPES, s, POOL, hw("GH200"))[0]        # one device per host
    assert not fits(TYPES, s, POOL, hw("TPU-v4"))[0]       # four per host
    assert fits(TYPES, s, POOL, hw("A100-SXM4-80GB"))[0]


@pytest.mark.parametrize("name", ["H100-SXM", "T4", "MI300X", "TPU-v5e"])
def test_utilization_never_exceeds_the_peak(name: str) -> None:
    mt = np.arange(len(TYPES))
    s = shape(mt, per_device=16)
    h = hw(name, len(mt))
    sps = ideal_samples_per_s(TYPES, s, POOL, h)
    mfu = model_flops_utilization(TYPES, s, POOL, h, sps)
    ok = np.isfinite(mfu)
    assert ok.sum() > 100
    assert (mfu[ok] <= TYPES.eff_cap[mt][ok] + 1e-9).all()
