"""The compiled kernels of a request's encode (leap.features._native) against their
definition, the NumPy code of leap.features.pair_rows and leap.features.transfer."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leap.catalog import Catalog
from leap.data.schema import PRECISIONS
from leap.features import pair_rows, transfer
from leap.features.columns import Columns

CAT = Catalog.default()
TYPES = sorted(CAT)
VOCAB = {"vendor": sorted({CAT[n].vendor for n in CAT}), "precision": list(PRECISIONS),
         "model_category": ["language", "vision"]}


@pytest.fixture(autouse=True)
def _fresh_check() -> Iterator[None]:
    """Each test decides afresh whether the kernels serve (the check is cached per process)."""
    pair_rows.native_kernels.cache_clear()
    transfer.transfer_kernels.cache_clear()
    yield
    pair_rows.native_kernels.cache_clear()
    transfer.transfer_kernels.cache_clear()


def _built() -> Any:
    if pair_rows._native is None:
        pytest.skip("leap was installed without its compiled kernels")
    return pair_rows._native


def test_the_kernels_are_built_and_serve_where_a_c_compiler_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the install leaves the kernels out")
    monkeypatch.delenv(pair_rows.NATIVE_ENV, raising=False)
    assert pair_rows._native is not None, "pip install -e . should have built them"
    assert pair_rows.native_kernels() is pair_rows._native
    assert transfer.transfer_kernels() is pair_rows._native


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), values)


_JOB = st.fixed_dictionaries({
    "trainer_count": _maybe(st.integers(-1, 64)),
    "devices_per_trainer": _maybe(st.integers(0, 16)),
    "batch_size": _maybe(st.integers(0, 8192)),
    "flops_per_sample": _maybe(st.sampled_from([0.0, 1e6, 3.3e9, 6e11, 2.5e14])),
    "num_params": _maybe(st.floats(1e3, 1e12)),
    "tensor_parallel": _maybe(st.integers(0, 8)),
    "pipeline_parallel": _maybe(st.integers(1, 4)),
    "embedding_params": _maybe(st.sampled_from([0.0, 1e6, 5e8])),
    "hidden_dim": _maybe(st.integers(0, 16384)),
    "seq_len": _maybe(st.integers(0, 32768)),
    "num_layers": _maybe(st.integers(1, 96)),
    "precision": _maybe(st.sampled_from([*PRECISIONS, "int8"])),
    "model_category": _maybe(st.sampled_from(["language", "vision", "speech"])),
})


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(_JOB, min_size=1, max_size=4), data=st.data())
def test_compiled_rows_equal_the_numpy_rows(jobs: list[dict[str, Any]],
                                            data: st.DataObject) -> None:
    """Every feature of every row, missing and odd values included (a zero batch, no FLOPs,
    a trainer count of -1, an unknown precision), on every default type."""
    native = _built()
    pair_rows.native_kernels()  # sets the physics constants, as first use does
    hardware = data.draw(st.lists(st.sampled_from(TYPES), min_size=len(jobs),
                                  max_size=len(jobs)))
    cols = Columns.concat([Columns.from_request({"family_id": f"f{i}", **job}, [hw])
                           for i, (job, hw) in enumerate(zip(jobs, hardware, strict=True))])
    n = data.draw(st.integers(1, 12))
    job = np.asarray(data.draw(st.lists(st.integers(0, len(jobs) - 1), min_size=n,
                                        max_size=n)))
    hw_a = np.array(data.draw(st.lists(st.sampled_from(TYPES), min_size=n, max_size=n)),
                    dtype=object)
    hw_b = np.array(data.draw(st.lists(st.sampled_from(TYPES), min_size=n, max_size=n)),
                    dtype=object)
    part = st.sampled_from([-1.0, np.nan, 1.0, 2.0, 8.0, 64.0, 1024.0])
    shapes = np.array(data.draw(st.lists(st.tuples(part, part, part), min_size=n,
                                         max_size=n)))
    for want, got in (
            (pair_rows._pair_matrix(cols, hw_a, hw_b, CAT, VOCAB, job, None),
             pair_rows._pair_matrix(cols, hw_a, hw_b, CAT, VOCAB, job, native)),
            (pair_rows._shape_matrix(cols, shapes, CAT, VOCAB, job, None),
             pair_rows._shape_matrix(cols, shapes, CAT, VOCAB, job, native))):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


@settings(max_examples=80, deadline=None)
@given(data=st.data(), n_rows=st.integers(1, 8))
def test_compiled_row_medians_equal_the_numpy_ones(data: st.DataObject, n_rows: int) -> None:
    """Rows in any order, NaN and infinite estimates left out, ties and signed zeros."""
    native = _built()
    m = data.draw(st.integers(0, 30))
    r = np.array(data.draw(st.lists(st.integers(0, n_rows - 1), min_size=m, max_size=m)),
                 dtype=np.intp)
    value = st.one_of(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 1.0]),
                      st.floats(-5.0, 5.0))
    est = np.array(data.draw(st.lists(value, min_size=m, max_size=m)), dtype=np.float64)
    has, med, sd = pair_rows._row_median(r, est, n_rows, None)
    n, got_med, got_sd = np.zeros(n_rows, np.intp), np.empty(n_rows), np.empty(n_rows)
    native.row_median(r, est, n, got_med, got_sd)
    np.testing.assert_array_equal(n > 0, has)
    np.testing.assert_allclose(got_med, med, rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(got_sd, sd, rtol=1e-12, atol=1e-12, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 40), types=st.integers(1, 30),
       pick=st.booleans(), spec_rule=st.booleans())
def test_compiled_transfer_features_equal_the_numpy_ones(seed: int, m: int, types: int,
                                                         pick: bool, spec_rule: bool) -> None:
    """Families that ran on none, one or most types, keys found or not, targets nobody ran
    on, ties in spec distance, types without specs; the features and the types chosen."""
    native = _built()
    x = transfer._probe_inputs(np.random.default_rng(seed), m, types, pick=pick,
                               spec_rule=spec_rule)
    want, got = transfer._core(x, None), transfer._core(x, native)
    assert transfer._same_core(want, got)
    assert got.features.shape == (len(transfer.CORE_FEATURES), m)
    if pick:  # only a type nobody ran on reads its twins, or its vendor's nearest alone
        assert got.pair_use is not None and got.local is not None
        assert (got.pair_use[~x.virt].sum(axis=1) <= transfer.PAIR_NEAREST).all()
        assert not got.local[~x.virt].any()


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 40), types=st.integers(1, 12))
def test_compiled_shape_lookups_equal_the_numpy_ones(seed: int, m: int, types: int) -> None:
    """A family's residual in a row's own shape on each type it ran (or in another layout of
    its devices and global batch), and its shapes nearest to the row's within the shape
    boosters' reach or not: shapes with missing parts, shapes nobody ran, ties."""
    native = _built()
    x = transfer._probe_shapes(np.random.default_rng(seed), m, types)
    assert transfer._same_shapes(x, native)


def test_the_numpy_code_serves_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pair_rows.NATIVE_ENV, "0")
    assert pair_rows.native_kernels() is None
    assert transfer.transfer_kernels() is None


@pytest.fixture
def other(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A copy of the built kernels that the test may change, installed as leap's own."""
    native = _built()
    monkeypatch.delenv(pair_rows.NATIVE_ENV, raising=False)
    copy = SimpleNamespace(**{k: getattr(native, k) for k in dir(native)
                              if not k.startswith("__")})
    monkeypatch.setattr(pair_rows, "_native", copy)
    return copy


def test_kernels_laid_out_for_another_leap_never_serve(other: SimpleNamespace,
                                                      caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    other.PAIR_FEATURES = other.PAIR_FEATURES[1:]
    with caplog.at_level(logging.WARNING, "leap.features"):
        assert pair_rows.native_kernels() is None
    assert "laid out for another leap" in caplog.text


def test_kernels_that_disagree_on_the_probe_never_serve(other: SimpleNamespace,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    """As a build with unsafe math flags would: every NaN check dropped."""
    built = other.pair_rows

    def no_nan(*args: Any) -> None:
        built(*args)
        np.nan_to_num(args[-1], copy=False)

    other.pair_rows = no_nan
    with caplog.at_level(logging.WARNING, "leap.features"):
        assert pair_rows.native_kernels() is None
    assert "disagree with NumPy" in caplog.text


def test_a_transfer_kernel_laid_out_for_another_leap_never_serves(
        other: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    other.TRANSFER_LEVELS = other.TRANSFER_LEVELS[::-1]
    with caplog.at_level(logging.WARNING, "leap.features"):
        assert transfer.transfer_kernels() is None
    assert "transfer features are laid out for another leap" in caplog.text
    assert pair_rows.native_kernels() is other  # the other kernels still serve


def _drop_one_type(args: tuple[Any, ...], result: Any) -> None:
    use = args[-4]
    use[np.flatnonzero(use.any(axis=1))[:1]] = False


def _last_shape_first(args: tuple[Any, ...], result: Any) -> None:
    args[-1][:result] = args[-1][:result][::-1].copy()


def _nudge_a_level(args: tuple[Any, ...], result: Any) -> None:
    args[-1][np.isfinite(args[-1])] += 1e-9


@pytest.mark.parametrize(("kernel", "spoil"), [
    ("transfer_rows", _drop_one_type),       # one type fewer for the pair estimate
    ("nearest_shapes", _last_shape_first),   # the nearest shapes in another order
    ("same_shape", _nudge_a_level)])         # a level off by more than 1e-12
def test_transfer_kernels_that_disagree_on_the_probe_never_serve(
        other: SimpleNamespace, caplog: pytest.LogCaptureFixture, kernel: str,
        spoil: Any) -> None:
    built = getattr(other, kernel)

    def spoiled(*args: Any) -> Any:
        result = built(*args)
        spoil(args, result)
        return result

    setattr(other, kernel, spoiled)
    with caplog.at_level(logging.WARNING, "leap.features"):
        assert transfer.transfer_kernels() is None
    assert "transfer features disagree with NumPy" in caplog.text
