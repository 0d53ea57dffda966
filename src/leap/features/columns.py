"""Job rows as named NumPy arrays: the one input type of the feature code.

Training builds it from a frame of stored attempts (hundreds of thousands of rows); serving
builds it from a job request and its candidate types (about 20 rows). Both then go through
the same :func:`leap.features.encode.encode`; only this thin adapter differs, and it does no
arithmetic, so the features cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from leap.data.schema import JOB_COLUMNS

#: Up to this many rows, lookups use plain dicts and Python loops (pandas' fixed cost per call
#: dominates). Measured on the reference model (encode CPU per job, requests ranked in one
#: pass as ``leap serve`` ranks those that arrive together): at 128, 1.14 ms a job in passes
#: of 16 (320 rows, and about 1,300 pair-model rows) and 0.57 ms in passes of 64; at 2,048,
#: 0.52 and 0.46 ms; a batch of 100,000 rows, encoded 32,768 at a time, is as fast either way.
SMALL = 2048
#: Rows :func:`stack` gathers at a time for a large matrix.
STACK_BLOCK_ROWS = 4096


class Columns:
    """Named columns of equal length ``n``.

    Examples
    --------
    >>> cols = Columns.from_request({"family_id": "f", "trainer_count": 2}, ["T4", "L4"])
    >>> len(cols), cols.num("trainer_count").tolist(), cols.obj("hardware").tolist()
    (2, [2.0, 2.0], ['T4', 'L4'])
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], n: int, one_job: bool = False,
                 memo: dict[str, Any] | None = None) -> None:
        self._arrays = dict(arrays)
        self.n = n
        # Every row the same job on its own type (a request's rows, and rows taken from
        # them): rows differ in ``hardware`` alone, which :meth:`codes` reads, and what
        # depends on the job alone is computed once for all of them (:meth:`per_job`).
        self.one_job = one_job
        self._memo = (memo if memo is not None else {}) if one_job else None
        # What num() and obj() returned for a few rows, read-only: one request's encode
        # asks for about 100 columns, 40 of them again. (A block of training rows is not
        # cached: its copies would add to a night's peak.)
        self._num: dict[str, np.ndarray] | None = {} if n <= SMALL else None
        self._obj: dict[str, np.ndarray] | None = {} if n <= SMALL else None

    def __len__(self) -> int:
        return self.n

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> Columns:
        """Every column of ``frame``; time zone aware times as UTC ``datetime64`` (no feature
        reads them, and an array of Timestamp objects cost most of a window's conversion)."""
        return cls({c: _values(frame[c]) for c in frame.columns}, len(frame))

    @classmethod
    def from_request(cls, job: Mapping[str, Any], hardware: Sequence[str]) -> Columns:
        """One job on each of ``hardware``; only launch-time fields are kept.

        Numbers become typed arrays (int64 / float64), which spares :meth:`num` a conversion
        on the serving path; strings stay objects. A missing value (``None``, NaN, ``pd.NA``)
        leaves its column out, which reads the same as a column of missing values.
        """
        n = len(hardware)
        arrays: dict[str, np.ndarray] = {}
        for c in JOB_COLUMNS:
            v = job.get(c)
            if v is None or (not isinstance(v, str) and pd.isna(v)):
                continue
            if isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_):
                arrays[c] = np.full(n, v, dtype=np.int64)
            elif isinstance(v, float | np.floating):
                arrays[c] = np.full(n, v, dtype=np.float64)
            else:
                arr = np.empty(n, dtype=object)
                arr[:] = [v] * n
                arrays[c] = arr
        arrays["hardware"] = np.asarray(list(hardware), dtype=object)
        return cls(arrays, n, one_job=True)

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """The rows of ``parts`` one after another. A column some parts lack is missing in
        their rows: NaN in a numeric column, None in any other.

        >>> c = Columns.concat([Columns.from_request({"family_id": "f", "batch_size": 8},
        ...                                          ["T4"]),
        ...                     Columns.from_request({"family_id": "g"}, ["L4", "A10"])])
        >>> c.num("batch_size").tolist(), c.obj("family_id").tolist()
        ([8.0, nan, nan], ['f', 'g', 'g'])
        """
        names = list(dict.fromkeys(c for p in parts for c in p._arrays))
        arrays: dict[str, np.ndarray] = {}
        for c in names:
            have = [p._arrays[c] for p in parts if c in p._arrays]
            numeric = all(a.dtype.kind in "fiu" for a in have)
            arrays[c] = np.concatenate([
                p._arrays[c] if c in p._arrays else
                np.full(p.n, np.nan) if numeric else np.full(p.n, None, dtype=object)
                for p in parts])
        return cls(arrays, sum(p.n for p in parts))

    def take(self, rows: np.ndarray) -> Columns:
        """The rows at positions ``rows`` (repeats allowed), every column."""
        return Columns({c: a[rows] for c, a in self._arrays.items()}, len(rows), self.one_job,
                       self._memo)

    def with_hardware(self, hardware: np.ndarray) -> Columns:
        """The same rows on the types in ``hardware`` (one per row)."""
        return self.replace({"hardware": np.asarray(hardware, dtype=object)})

    def replace(self, arrays: Mapping[str, np.ndarray]) -> Columns:
        """The same rows with the columns in ``arrays`` (one value per row) replaced."""
        same_job = self.one_job and set(arrays) <= {"hardware"}
        return Columns({**self._arrays, **arrays}, self.n, same_job,
                       self._memo if same_job else None)

    def per_job(self, key: str, make: Callable[[Columns], np.ndarray]) -> np.ndarray:
        """``make(self)``: per-row values of the job alone (never of its types). One job's
        rows (a request's, and every :meth:`take` or :meth:`with_hardware` of them) compute
        them once under ``key`` and repeat the first row's; other rows compute them every
        time.

        >>> cols = Columns.from_request({"family_id": "f", "batch_size": 8}, ["T4", "L4"])
        >>> calls = []
        >>> def batch(c):
        ...     calls.append(len(c))
        ...     return c.num("batch_size") * 2
        >>> cols.per_job("b", batch).tolist(), cols.take([1]).per_job("b", batch).tolist(), calls
        ([16.0, 16.0], [16.0], [2])
        """
        if self._memo is None or not self.n:
            return make(self)
        if key not in self._memo:
            # On these rows, not a one-row copy: their columns are read already (cached).
            self._memo[key] = make(self)[:1]
        return self._memo[key][np.zeros(self.n, dtype=np.intp)]

    def codes(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's index among the distinct combinations of the columns ``names`` (absent
        columns read as missing), and the first row of each combination.

        >>> Columns.from_frame(pd.DataFrame({"a": [1, 2, 1], "b": ["x", "y", "x"]})).codes(
        ...     ["a", "b", "c"])
        (array([0, 1, 0]), array([0, 1]))
        """
        if self.one_job:  # one job's rows: only their types can differ
            names = [c for c in names if c == "hardware"]
        present = [self._arrays[c] for c in names if c in self._arrays]
        if not present:
            code = np.zeros(self.n, dtype=np.int64)
        elif self.one_job:
            code = factorize(present[0])[0]
        elif self.n <= SMALL:
            seen: dict[tuple[Any, ...], int] = {}
            code = np.array([seen.setdefault(k, len(seen)) for k in zip(*present, strict=True)],
                            dtype=np.int64)
        else:
            code = _combined_codes(present)
        first = np.full(int(code.max()) + 1 if self.n else 0, self.n, dtype=np.int64)
        np.minimum.at(first, code, np.arange(self.n))
        return code, first

    def num(self, name: str) -> np.ndarray:
        """float64 values; missing or non-numeric entries are NaN (read-only for a few rows)."""
        if self._num is not None and name in self._num:
            return self._num[name]
        arr = self._arrays.get(name)
        if arr is None:
            out = np.full(self.n, np.nan)
        elif arr.dtype.kind in "fiub":
            out = arr.astype(np.float64)
        else:
            out = pd.to_numeric(pd.Series(arr, dtype=object), errors="coerce").to_numpy(
                dtype=np.float64, na_value=np.nan)
        if self._num is not None:
            out.flags.writeable = False
            self._num[name] = out
        return out

    def obj(self, name: str) -> np.ndarray:
        """Values as an object array, None where missing or absent (read-only for a few
        rows)."""
        if self._obj is not None and name in self._obj:
            return self._obj[name]
        arr = self._arrays.get(name)
        if arr is None:
            out = np.full(self.n, None, dtype=object)
        else:
            out = np.array(arr, dtype=object)
            # A request's texts are never missing: no pandas call for them.
            if arr.dtype.kind == "O" and not (self.n <= SMALL and set(map(type, out)) == {str}):
                out[pd.isna(out)] = None
        if self._obj is not None:
            out.flags.writeable = False
            self._obj[name] = out
        return out

    def text(self, name: str) -> np.ndarray:
        """Values as strings (for keys); missing becomes ``"None"``, as in history."""
        if self.n <= SMALL:
            return np.array(["None" if v is None or v != v else str(v)
                             for v in self.obj(name)], dtype=object)
        return key_texts(pd.Series(self.obj(name), dtype=object))


#: The size of the combined code at which :func:`_combined_codes` numbers it afresh, so that
#: the next column's product stays within int64.
_CODE_LIMIT = 2 ** 62


def _combined_codes(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Each row's index among the distinct combinations of ``arrays`` in order of first
    appearance, missing values (NaN, None) one value per column: what a pandas group-by with
    ``dropna=False, sort=False`` numbers its groups, without building a frame of the columns
    (which turned a block's text columns into Arrow strings first: 75 ms against 50 on
    100,000 rows of 19 columns).

    >>> _combined_codes([np.array([1.0, np.nan, 1.0, np.nan]),
    ...                  np.array(["a", None, "a", None], dtype=object)]).tolist()
    [0, 1, 0, 1]
    """
    code = np.zeros(len(arrays[0]), dtype=np.int64)
    size = 1
    for values in arrays:
        part, distinct = pd.factorize(values, use_na_sentinel=False)
        k = max(len(distinct), 1)
        if size * k >= _CODE_LIMIT:  # keep the combined code within int64: number it afresh
            code, seen = pd.factorize(code)
            size = len(seen)
        code = code * k + part
        size *= k
    return pd.factorize(code)[0].astype(np.int64, copy=False)


def factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's index among the distinct values in order of first appearance, and those
    values (as :func:`pandas.factorize`, which costs tens of microseconds on a few rows).

    >>> codes, uniques = factorize(np.array(["b", "a", "b"], dtype=object))
    >>> codes.tolist(), uniques.tolist()
    ([0, 1, 0], ['b', 'a'])
    """
    if len(values) > SMALL:
        codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
        return codes.astype(np.int64, copy=False), np.asarray(uniques, dtype=object)
    seen: dict[Any, int] = {}
    codes = np.array([seen.setdefault(v, len(seen)) for v in values], dtype=np.int64)
    return codes, np.array(list(seen), dtype=object)


def vocab_codes(values: Sequence[Any] | np.ndarray, vocab: Sequence[str]) -> np.ndarray:
    """Each value's position in ``vocab`` as a float, NaN for a value outside it or not a
    string (looked up once per distinct value).

    >>> vocab_codes(np.array(["b", None, "z", "b"], dtype=object), ["a", "b"]).tolist()
    [1.0, nan, nan, 1.0]
    >>> vocab_codes(np.array(["b", "b"], dtype=object), ["a", "b"]).tolist()
    [1.0, 1.0]
    """
    values = np.asarray(values, dtype=object)
    if 0 < len(values) <= SMALL and len(one := set(values)) == 1:  # a request's job column
        v = one.pop()
        return np.full(len(values), vocab_positions(vocab).get(v, np.nan)
                       if isinstance(v, str) else np.nan)
    pos = vocab_positions(vocab)
    codes, distinct = factorize(values)
    per = np.array([pos.get(v, np.nan) if isinstance(v, str) else np.nan for v in distinct],
                   dtype=np.float64)
    return per[codes] if len(per) else np.full(len(codes), np.nan)


_VOCAB_POSITIONS: dict[int, tuple[Sequence[str], dict[str, float]]] = {}


def vocab_positions(vocab: Sequence[str]) -> dict[str, float]:
    """Each value of ``vocab`` to its position (as a float), built once per vocabulary
    object: a model's vocabularies are read on every request. Vocabularies are never
    changed in place."""
    hit = _VOCAB_POSITIONS.get(id(vocab))
    if hit is not None and hit[0] is vocab:
        return hit[1]
    pos = {v: float(i) for i, v in enumerate(vocab)}
    if len(_VOCAB_POSITIONS) > 256:  # vocabularies of models long gone
        _VOCAB_POSITIONS.clear()
    _VOCAB_POSITIONS[id(vocab)] = (vocab, pos)
    return pos


def nan_to(values: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """``values`` with NaN replaced by ``fill``; infinities are kept (``np.nan_to_num``
    replaces them too, at five times the cost on a request's few rows).

    >>> nan_to(np.array([1.0, np.nan, np.inf]), -1.0).tolist()
    [1.0, -1.0, inf]
    """
    return np.where(np.isnan(values), fill, values)


def stack(columns: Mapping[str, np.ndarray], names: Sequence[str], n: int) -> np.ndarray:
    """The float64 matrix of ``columns[name]`` for each of ``names``, one column each (what
    ``np.column_stack`` gives, without its per-column copies into 2-D views).

    >>> stack({"a": np.array([1.0, 2.0]), "b": np.array([3, 4])}, ["b", "a"], 2).tolist()
    [[3.0, 1.0], [4.0, 2.0]]
    """
    out = np.empty((n, len(names)))
    if n <= STACK_BLOCK_ROWS:
        for j, name in enumerate(names):
            out[:, j] = columns[name]
        return out
    # Many rows: each block of rows is gathered column by column into a small buffer (rows
    # of it contiguous) and copied in transposed; writing each column of the whole matrix
    # straight away strides across every row (32,768 rows x 96 features: 34 ms, blocked 8).
    block = np.empty((len(names), STACK_BLOCK_ROWS))
    for start in range(0, n, STACK_BLOCK_ROWS):
        stop = min(start + STACK_BLOCK_ROWS, n)
        part = block[:, :stop - start]
        for j, name in enumerate(names):
            values = columns[name]
            part[j] = values[start:stop] if np.ndim(values) else values
        out[start:stop] = part.T
    return out


def _values(col: pd.Series) -> np.ndarray:
    if isinstance(col.dtype, pd.DatetimeTZDtype):
        return col.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    return col.to_numpy()


def positions(index: pd.Index, values: np.ndarray | Sequence[str]) -> np.ndarray:
    """The position of each of ``values`` (texts) in ``index``, -1 where absent. The texts
    stay Python strings: handed over as an array, pandas first turns them into its Arrow
    strings, which made a lookup 2-3 times as long (a 4x fleet's day spent 0.1 s a day on
    it).

    >>> positions(pd.Index(["a", "b"], dtype=object), np.array(["b", "c"], dtype=object))
    array([ 1, -1])
    """
    return index.get_indexer(pd.Index(values, dtype=object))


def key_column(values: pd.Series) -> np.ndarray:
    """A column of key texts with no missing values as an object array (an object column's
    values are texts already: pandas' own string columns cost a conversion each call).

    >>> key_column(pd.Series(["a", "b"], dtype=object)).tolist(), key_column(pd.Series([4]))
    (['a', 'b'], array(['4'], dtype=object))
    """
    if values.dtype == object:
        return values.to_numpy()
    return values.astype(str).to_numpy(dtype=object)


def key_texts(values: pd.Series) -> np.ndarray:
    """Key strings of a column: missing values (None, NaN) become ``"None"``.

    (``astype(str)`` alone keeps NaN missing under pandas 3.)
    """
    return values.astype(object).where(values.notna(), "None").astype(str).to_numpy(
        dtype=object)
