"""Job rows as named arrays: the paths for many rows give what pandas and NumPy give."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leap.features import columns as columns_module
from leap.features.columns import SMALL, STACK_BLOCK_ROWS, Columns, stack

_TEXT = st.sampled_from(["a", "b", "c", None])
_NUMBER = st.sampled_from([0.0, -0.0, 1.0, 4.0, float("nan")])


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(_TEXT, _NUMBER, st.integers(0, 3), _TEXT), min_size=1,
                     max_size=40), repeat=st.integers(1, 3))
def test_codes_of_many_rows_number_groups_as_a_pandas_group_by(
        rows: list[tuple[object, float, int, object]], repeat: int) -> None:
    """Many rows are numbered column by column through pandas' factorize: the groups and
    their numbers are those of a group-by that keeps missing values (``dropna=False``) and
    numbers groups in order of first appearance (``sort=False``); -0.0 and 0.0 are one."""
    many = (rows * (SMALL // len(rows) + 1))[:SMALL + 1 + repeat]
    assert len(many) > SMALL
    cols = list(zip(*many, strict=True))
    arrays = {"t": np.array(cols[0], dtype=object), "x": np.array(cols[1]),
              "i": np.array(cols[2], dtype=np.int64), "u": np.array(cols[3], dtype=object)}
    code, first = Columns(arrays, len(many)).codes(["t", "x", "i", "u", "absent"])
    want = pd.DataFrame(arrays).groupby(["t", "x", "i", "u"], dropna=False,
                                        sort=False).ngroup().to_numpy(np.int64)
    np.testing.assert_array_equal(code, want)
    np.testing.assert_array_equal(first, [int(np.flatnonzero(want == g)[0])
                                          for g in range(want.max() + 1)])


@pytest.mark.parametrize("limit", [2 ** 62, 64])
def test_codes_keep_the_combined_code_within_64_bits(limit: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Many columns of many distinct values each: the combined code is numbered afresh
    before it would overflow (forced after every few columns with a low limit), and the
    groups stay those of a pandas group-by."""
    monkeypatch.setattr(columns_module, "_CODE_LIMIT", limit)
    n = SMALL + 500
    rng = np.random.default_rng(0)
    base = rng.integers(0, 1 << 20, size=(300, 8))
    values = base[rng.integers(0, len(base), size=n)]
    frame = pd.DataFrame(values, columns=[f"c{j}" for j in range(8)])
    code, first = Columns.from_frame(frame).codes(list(frame.columns))
    want = frame.groupby(list(frame.columns), sort=False).ngroup().to_numpy(np.int64)
    np.testing.assert_array_equal(code, want)
    np.testing.assert_array_equal(values, values[first][code])


def test_stack_of_many_rows_is_the_column_stack() -> None:
    """Rows gathered a block at a time give the matrix column_stack gives (ints, booleans and
    a constant included), a last block shorter than the others too."""
    n = 2 * STACK_BLOCK_ROWS + 7
    rng = np.random.default_rng(1)
    cols = {"f": rng.normal(size=n), "i": rng.integers(-5, 5, size=n),
            "b": rng.random(n) > 0.5, "nan": np.where(rng.random(n) > 0.5, np.nan, 1.0),
            "one": 1.0}
    names = ["i", "f", "one", "b", "nan"]
    want = np.column_stack([np.broadcast_to(np.asarray(cols[c], dtype=np.float64), (n,))
                            for c in names])
    got = stack(cols, names, n)
    assert got.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(got, want)
    few = stack({c: v if np.ndim(v) == 0 else v[:5] for c, v in cols.items()}, names, 5)
    np.testing.assert_array_equal(few, want[:5])


#: Jobs a pass of requests draws from: two alike but for the batch, one without it.
_JOBS = [{"family_id": "f", "trainer_count": 2, "batch_size": 64, "precision": "bf16"},
         {"family_id": "f", "trainer_count": 2, "batch_size": 32, "precision": "bf16"},
         {"family_id": "g", "trainer_count": 1, "precision": "bf16"}]
_TYPES = st.lists(st.sampled_from(["T4", "L4", "A10", "H100-SXM"]), min_size=1, max_size=8)


def _requests(picks: list[tuple[int, list[str]]]) -> tuple[Columns, Columns]:
    """A pass of requests (job ``i`` of :data:`_JOBS` on its types, one after another) and
    the same rows as any rows (a replaced job column: no job)."""
    merged = Columns.concat([Columns.from_request(_JOBS[i], types) for i, types in picks])
    return merged, merged.replace({"family_id": merged.obj("family_id")})


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.tuples(st.integers(0, 2), _TYPES), min_size=1, max_size=3),
       rows=st.lists(st.integers(0, 23), max_size=20))
def test_codes_of_requests_rows_are_those_of_any_rows(picks: list[tuple[int, list[str]]],
                                                      rows: list[int]) -> None:
    """Requests' rows (each job on its types) take a shortcut through `codes`: a job's rows
    differ in their types alone. It must number them as the general path numbers the same
    rows, after `take` and `with_hardware` too. Where a named column is missing in some rows
    (a job without it beside one with it), the general path splits each such row off; the
    shortcut keeps a job's rows together, and never joins rows whose values differ."""
    one, general = _requests(picks)
    assert one.jobs == len(picks) and general.job is None
    taken = np.array([r for r in rows if r < len(one)], dtype=np.int64)
    swapped = one.obj("hardware")[::-1].copy()
    names = ["family_id", "trainer_count", "hardware", "batch_size", "seq_len"]
    for a, b in ((one, general), (one.take(taken), general.take(taken)),
                 (one.with_hardware(swapped), general.with_hardware(swapped))):
        assert a.job is not None
        for cols in (names, names[:2], names[2:4], ["hardware"], ["seq_len"]):
            got, want = a.codes(cols), b.codes(cols)
            frame = pd.DataFrame({c: b.obj(c) for c in cols})
            if not frame.isna().any().any():
                assert got[0].tolist() == want[0].tolist()
                assert got[1].tolist() == want[1].tolist()
            # Rows of a code hold the same values; codes come in order of first appearance.
            groups = frame.groupby(list(cols), dropna=False, sort=False).ngroup().to_numpy()
            for code in np.unique(got[0]):
                assert len(set(groups[got[0] == code])) == 1
            assert got[1].tolist() == [int(np.flatnonzero(got[0] == c)[0])
                                       for c in range(len(got[1]))]



def test_codes_of_many_rows_numbered_by_job_are_those_of_any_rows() -> None:
    """A large batch numbered by job (`Columns.by_job`: more jobs than SMALL, several types
    each) takes the jobs' path through `codes` on pandas' factorize: the same numbers as the
    general path, for names with and without the type."""
    rng = np.random.default_rng(2)
    n = 3 * SMALL
    frame = pd.DataFrame({
        "family_id": rng.integers(0, 3000, n).astype(str).astype(object),
        "batch_size": rng.integers(1, 3, n),
        "hardware": rng.choice(np.array(["T4", "L4", "A10"], dtype=object), n)})
    general = Columns.from_frame(frame)
    jobs = general.by_job()
    assert general.job is None and jobs.jobs > SMALL and jobs.by_job() is jobs
    for names in (["family_id", "batch_size", "hardware"], ["batch_size", "hardware"],
                  ["family_id"], ["hardware"], ["seq_len"]):
        got, want = jobs.codes(names), general.codes(names)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()

@settings(max_examples=30, deadline=None)
@given(types=st.lists(st.sampled_from(["T4", "L4", "A10", "H100-SXM", "MI300X"]), min_size=1,
                      max_size=8),
       rows=st.lists(st.integers(0, 7), min_size=1, max_size=12),
       batch=st.sampled_from([None, 0, 64]), precision=st.sampled_from([None, "bf16", "x"]),
       jobs=st.integers(1, 3))
def test_what_requests_rows_compute_once_is_what_any_rows_compute(
        types: list[str], rows: list[int], batch: int | None, precision: str | None,
        jobs: int) -> None:
    """Requests' rows compute the values of their job alone once a job (`Columns.per_job`):
    the compiled kernels' job inputs, the shape and the family's half must be those the
    general path computes on the same rows, after `take` and `with_hardware` too, and a
    replaced job column must not read a value computed before. A pass of ``jobs`` requests:
    the job, the same with a larger batch, and another family with no precision."""
    from leap.features import pair_rows

    native = pair_rows._native
    job = {"family_id": "fam-7", "trainer_count": 2, "batch_size": batch,
           "devices_per_trainer": 4, "precision": precision, "model_category": "vision",
           "num_params": 3e8}
    others = [{**job, "batch_size": 128}, {**job, "family_id": "fam-8", "precision": None}]
    vocab = {"precision": ["bf16", "fp16"], "model_category": ["language", "vision"]}
    parts = [(job, types), *[(o, types[::-1]) for o in others][:jobs - 1]]
    one = Columns.concat([Columns.from_request(j, t) for j, t in parts])
    general = Columns.from_frame(pd.DataFrame([{**j, "hardware": h} for j, t in parts
                                               for h in t]))
    taken = np.array([r % len(one) for r in rows], dtype=np.int64)
    swapped = one.obj("hardware")[::-1].copy()
    for a, b in ((one, general), (one.take(taken), general.take(taken)),
                 (one.with_hardware(swapped), general.with_hardware(swapped)),
                 (one.take(taken[::-1]), general.take(taken[::-1]))):
        np.testing.assert_array_equal(pair_rows.shape_of(a), pair_rows.shape_of(b))
        idx = np.arange(len(a))[::-1]
        np.testing.assert_array_equal(pair_rows.job_folds(a, idx), pair_rows.job_folds(b, idx))
        if native is not None:
            for x, y in zip(pair_rows._job_inputs(native, a, vocab),
                            pair_rows._job_inputs(native, b, vocab), strict=True):
                np.testing.assert_array_equal(x, y)
    one = Columns.from_request(job, types)
    moved = one.replace({"batch_size": np.arange(len(types)) + 1.0})
    assert not moved.one_job
    np.testing.assert_array_equal(pair_rows.shape_of(moved)[:, 2], np.arange(len(types)) + 1.0)
