"""Per-group statistics of any time range of a fixed table's rows, without re-sorting it.

A history snapshot is the same few statistics (count, latest row, medians, a standard
deviation) per group, over a different subset of the same rows each time: a sliding 30-day
range, less some (family, type) pairs. A SQL engine sorts every group's values again for every
median of every snapshot (about 0.3 s per median over the 2.5 million rows of a 4x fleet's
lookback). Here the table's rows are in time order, so a range is a slice; counts, latest rows
and sums are linear passes over the slice; and each value is sorted within its groups once,
when the table is built, so the k-th selected value of every group is found with one gather,
one running count and one binary search (a short range is sorted directly instead). Every
result is exact (a median is the number SQL's ``median`` gives, to the last bit) or summed in
a fixed order, so it is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: A selection of at most this share of the table's rows sorts its own values for a median
#: (cheaper than a pass over every row through the presorted order).
DIRECT_SHARE = 0.25


class SortedGroups:
    """Rows in ``n_groups`` groups (``gid``, 0-based) with each value of ``values`` sorted
    within every group. Every group must hold at least one row of the table.

    Examples
    --------
    >>> g = SortedGroups(np.array([0, 1, 0, 1, 1]), 2,
    ...                  {"v": np.array([3.0, 10.0, 1.0, 30.0, 20.0])})
    >>> s = g.select(0, 4)
    >>> s.count().tolist(), s.median("v").tolist(), s.last_row().tolist()
    ([2, 2], [2.0, 20.0], [2, 3])
    >>> g.select(3, 5).median("v").tolist(), g.select(0, 5, np.arange(5) != 1).count().tolist()
    ([nan, 25.0], [2, 2])
    """

    def __init__(self, gid: np.ndarray, n_groups: int, values: Mapping[str, np.ndarray],
                 value_orders: Mapping[str, np.ndarray] | None = None) -> None:
        sizes = np.bincount(gid, minlength=n_groups)
        if len(sizes) > n_groups or (n_groups and sizes.min() == 0):
            raise ValueError("every group needs at least one row and a gid below n_groups")
        self.n_groups = n_groups
        self.gid = np.asarray(gid).astype(np.min_scalar_type(max(n_groups - 1, 0)))
        self.values = dict(values)
        #: ``bounds[g]:bounds[g + 1]`` are group g's positions in every sorted order.
        self.bounds = np.concatenate(([0], np.cumsum(sizes)))
        index = np.int32 if len(gid) < 2**31 else np.int64
        # Rows in (group, value) order; ties keep row order, so the order is reproducible:
        # the rows in value order (stable), then stably by group. ``value_orders`` may hold
        # the first for some values (tables over the same rows share it).
        self.orders: dict[str, np.ndarray] = {}
        for name, v in self.values.items():
            by_value = value_orders[name] if value_orders is not None and name in value_orders \
                else np.argsort(v, kind="stable")
            self.orders[name] = by_value[np.argsort(self.gid[by_value], kind="stable")].astype(
                index, copy=False)

    def __len__(self) -> int:
        return len(self.gid)

    def select(self, lo: int, hi: int, kept: np.ndarray | None = None) -> Selection:
        """Rows ``lo`` to ``hi`` (exclusive), less those where ``kept`` (a boolean array
        over the table's rows) is false."""
        return Selection(self, lo, hi, kept)


class Selection:
    """One subset of a :class:`SortedGroups` table; each statistic is per group."""

    def __init__(self, groups: SortedGroups, lo: int, hi: int,
                 kept: np.ndarray | None) -> None:
        self.groups = groups
        self.lo, self.hi = lo, hi
        self.kept = None if kept is None else np.asarray(kept[lo:hi], dtype=bool)
        gid = groups.gid[lo:hi]
        #: The selected rows' groups, in row order.
        self.gid = gid if self.kept is None else gid[self.kept]
        self._count: np.ndarray | None = None

    def _rows(self) -> np.ndarray:
        rows = np.arange(self.lo, self.hi)
        return rows if self.kept is None else rows[self.kept]

    def _values(self, name: str) -> np.ndarray:
        v = self.groups.values[name][self.lo:self.hi]
        return v if self.kept is None else v[self.kept]

    def count(self) -> np.ndarray:
        """Selected rows per group."""
        if self._count is None:
            self._count = np.bincount(self.gid, minlength=self.groups.n_groups)
        return self._count

    def last_row(self) -> np.ndarray:
        """The largest selected row number per group, -1 where none is selected (the latest
        row where the table is in time order)."""
        out = np.full(self.groups.n_groups, -1, dtype=np.int64)
        np.maximum.at(out, self.gid, self._rows())
        return out

    def minimum(self, column: np.ndarray) -> np.ndarray:
        """The smallest value of an integer ``column`` (one per table row) over the selected
        rows of each group; the column's largest possible value where none is selected."""
        out = np.full(self.groups.n_groups, np.iinfo(column.dtype).max, dtype=column.dtype)
        values = column[self.lo:self.hi]
        np.minimum.at(out, self.gid, values if self.kept is None else values[self.kept])
        return out

    def std(self, name: str) -> np.ndarray:
        """The sample standard deviation of value ``name`` per group, 0 with fewer than two
        selected rows (two passes in row order: the mean, then the squared deviations)."""
        v, n = self._values(name), self.count()
        size = self.groups.n_groups
        mean = np.bincount(self.gid, weights=v, minlength=size) / np.maximum(n, 1)
        dev = v - mean[self.gid]
        ss = np.bincount(self.gid, weights=dev * dev, minlength=size)
        return np.where(n > 1, np.sqrt(ss / np.maximum(n - 1, 1)), 0.0)

    def median(self, name: str) -> np.ndarray:
        """The median of value ``name`` per group, NaN where none is selected: the middle
        value, or of an even count ``(lo + hi) / 2`` of the two middle ones (what SQL's
        ``median`` gives, to the last bit)."""
        n = self.count()
        out = np.full(self.groups.n_groups, np.nan)
        has = n > 0
        if not has.any():
            return out
        if len(self.gid) <= DIRECT_SHARE * len(self.groups):
            # A short range: sort its own values within their groups.
            v = self._values(name)
            ordered = v[np.lexsort((v, self.gid))]
            start = np.concatenate(([0], np.cumsum(n)))[:-1][has]
            m = n[has]
            lo, hi = ordered[start + (m - 1) // 2], ordered[start + m // 2]
        else:
            # Through the presorted order: the k-th selected row (0-based) of a group is
            # where the running count of selected rows first reaches base + k + 1.
            order, v = self.groups.orders[name], self.groups.values[name]
            picked = (order >= self.lo) & (order < self.hi)
            if self.kept is not None:
                inside = np.zeros(len(self.groups), dtype=bool)
                inside[self.lo:self.hi] = self.kept
                picked &= inside[order]
            running = np.cumsum(picked, dtype=np.int64)
            base = np.concatenate(([0], running))[self.groups.bounds[:-1]][has]
            m = n[has]
            lo = v[order[np.searchsorted(running, base + (m - 1) // 2 + 1)]]
            hi = v[order[np.searchsorted(running, base + m // 2 + 1)]]
        out[has] = (lo + hi) / 2
        return out
