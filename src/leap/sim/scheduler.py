"""The capacity-limited baseline scheduler of the reference fleet, with optional advice.

Each day every type offers a budget of device-hours. Attempts, in submission order, take
the first of their preferences (advice first when given, then the family's home types) that
is eligible and still has room; then any other eligible type with room (at random, weighted
by the room left); else a random eligible type over capacity. Vectorised by rounds: round
``k`` serves every waiting attempt's ``k``-th choice, earliest first, so a late attempt's
first choice can beat an early attempt's second: a documented simplification of a strictly
sequential queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from leap.errors import CatalogError, DataError, did_you_mean

if TYPE_CHECKING:
    from leap.sim.fleet import Fleet, JobsLike

#: ``Placement.choice`` values.
CHOICES: tuple[str, ...] = ("advice", "home", "other", "over_capacity")
_ADVICE, _HOME, _OTHER, _OVER = range(4)
_RANDOM_PASSES = 3


@dataclass(frozen=True)
class Assignment:
    """Integer result of :func:`assign` (one entry per row, in the rows' order)."""

    hardware: np.ndarray        # pool index
    choice: np.ndarray          # index into CHOICES (before advice is told apart from home)
    rank: np.ndarray            # position in the preference list, -1 if not from it
    remaining: np.ndarray       # device-hours left per type


def _group_cumsum(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stable sort by key; running sum of values within each key. Returns (order, sums)."""
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    total = np.cumsum(v)
    start = np.r_[True, k[1:] != k[:-1]] if len(k) else np.zeros(0, dtype=bool)
    base = np.maximum.accumulate(np.where(start, total - v, 0.0)) if len(k) else total
    return order, total - base


def _accept(cand: np.ndarray, demand: np.ndarray, room: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Earliest-first acceptance of rows on their candidate type within ``room``.

    A few passes so that one huge request does not block every later small one on its type
    (a request larger than the room left is refused outright).
    """
    room = room.copy()
    accepted = np.zeros(len(cand), dtype=bool)
    pending = np.arange(len(cand))
    for _ in range(3):
        pending = pending[demand[pending] <= room[cand[pending]]]
        if len(pending) == 0:
            break
        c, d = cand[pending], demand[pending]
        order, sums = _group_cumsum(c, d)
        ok = np.empty(len(pending), dtype=bool)
        ok[order] = sums <= room[c[order]]
        accepted[pending[ok]] = True
        room -= np.bincount(c[ok], d[ok], minlength=len(room))
        pending = pending[~ok]
    return accepted, room


def _pick(rng: np.random.Generator, weights: np.ndarray) -> np.ndarray:
    """One column per row, with probability proportional to the row's weights."""
    cdf = np.cumsum(weights, axis=1)
    u = rng.uniform(size=len(weights)) * cdf[:, -1]
    return np.minimum((cdf <= u[:, None]).sum(axis=1), weights.shape[1] - 1)


def assign(pref: np.ndarray, eligible: np.ndarray, demand: np.ndarray, capacity: np.ndarray,
           fallback_weight: np.ndarray, rng: np.random.Generator) -> Assignment:
    """Place rows (in submission order) on hardware types under a device-hour budget.

    Parameters
    ----------
    pref : ndarray of int, shape (n, k)
        Preference lists (pool indices, best first, -1 padded).
    eligible : ndarray of bool, shape (n, T)
        Types each row may run on.
    demand : ndarray of float, shape (n,)
        Device-hours each row books.
    capacity : ndarray of float, shape (T,)
        Device-hours each type offers.
    fallback_weight : ndarray of float, shape (T,)
        Weights of the over-capacity fallback (e.g. each type's pool share).
    rng : numpy.random.Generator
        Random choices among "other" types.

    Returns
    -------
    Assignment

    Examples
    --------
    >>> pref = np.array([[0, 1], [0, 1], [0, -1]])
    >>> ok = np.array([[True, True], [True, True], [False, True]])
    >>> a = assign(pref, ok, np.array([1.0, 1.0, 1.0]), np.array([1.0, 1.0]),
    ...            np.array([1.0, 1.0]), np.random.default_rng(0))
    >>> a.hardware.tolist(), a.choice.tolist()
    ([0, 1, 1], [1, 1, 3])
    """
    n, t = eligible.shape
    room = capacity.astype(np.float64).copy()
    hw = np.full(n, -1, dtype=np.int64)
    choice = np.full(n, _OVER, dtype=np.int64)
    rank = np.full(n, -1, dtype=np.int64)
    rows_all = np.arange(n)
    for k in range(pref.shape[1]):
        rows = rows_all[(hw < 0) & (pref[:, k] >= 0)]
        cand = pref[rows, k]
        keep = eligible[rows, cand]
        rows, cand = rows[keep], cand[keep]
        ok, room = _accept(cand, demand[rows], room)
        hw[rows[ok]] = cand[ok]
        choice[rows[ok]] = _HOME
        rank[rows[ok]] = k
    for _ in range(_RANDOM_PASSES):
        rows = rows_all[hw < 0]
        w = eligible[rows] * np.maximum(room, 0.0)[None, :]
        has = w.sum(axis=1) > 0
        rows, w = rows[has], w[has]
        if len(rows) == 0:
            break
        cand = _pick(rng, w)
        ok, room = _accept(cand, demand[rows], room)
        hw[rows[ok]] = cand[ok]
        choice[rows[ok]] = _OTHER
    rows = rows_all[hw < 0]
    w = eligible[rows] * fallback_weight[None, :]
    has = w.sum(axis=1) > 0
    if has.any():
        hw[rows[has]] = _pick(rng, w[has])
    # Nothing eligible at all: the job goes to its first preference (and will likely fail).
    none = rows[~has]
    first = pref[none, 0] if pref.shape[1] else np.full(len(none), -1)
    hw[none] = np.where(first >= 0, first, int(np.argmax(fallback_weight)))
    room -= np.bincount(hw[rows], demand[rows], minlength=t)
    return Assignment(hardware=hw, choice=choice, rank=rank, remaining=room)


@dataclass(frozen=True)
class Placement:
    """Where :class:`CapacityScheduler` put each job (arrays in the jobs' order).

    Attributes
    ----------
    hardware : ndarray of str
        The type each job runs on.
    choice : ndarray of str
        ``advice`` (an advised type), ``home`` (one of the family's usual types),
        ``other`` (another eligible type with room) or ``over_capacity``.
    advice_rank : ndarray of int
        Position of the chosen type in the job's advice list; -1 when not advised.
    within_capacity : ndarray of bool
        False for over-capacity placements.
    """

    hardware: np.ndarray
    choice: np.ndarray
    advice_rank: np.ndarray
    within_capacity: np.ndarray


def schedule_day(fleet: Fleet, fam: np.ndarray, devices: np.ndarray, day: int,
                 advice: np.ndarray | None = None) -> Assignment:
    """The baseline scheduler for one simulated day; rows must be in submission order.

    ``advice`` is an int array ``(n, a)`` of pool indices (-1 padded) tried before the home
    types. Deterministic: the random stream is the fleet's scheduler stream of ``day``, so
    replaying a stored day without advice reproduces its placements.
    """
    from leap.sim.fleet import S_SCHEDULER, day_rng

    f = fleet.families
    eligible = f.fit_base[fam] & fleet.pool.available(day)[None, :]
    home = f.home[fam]
    pref = home if advice is None else np.concatenate([advice, home], axis=1)
    demand = fleet.requested_device_hours(fam, devices)
    share = np.where(fleet.pool.available(day), fleet.pool.share, 0.0)
    out = assign(pref, eligible, demand, fleet.capacity_device_hours(day), share,
                 day_rng(fleet.seed, S_SCHEDULER, day))
    if advice is None:
        return out
    from_advice = (out.rank >= 0) & (out.rank < advice.shape[1])
    return Assignment(hardware=out.hardware,
                      choice=np.where(from_advice, _ADVICE, out.choice),
                      rank=np.where(out.rank >= advice.shape[1],
                                    out.rank - advice.shape[1], out.rank),
                      remaining=out.remaining)


class CapacityScheduler:
    """Replay the fleet's baseline scheduler on attempt rows, with or without advice.

    Parameters
    ----------
    fleet : Fleet
        The simulated fleet (e.g. ``Fleet.from_store(store)``).

    Examples
    --------
    Not run here (it needs a workspace)::

        placements = CapacityScheduler(fleet).place(day_attempts, advice=rankings)

    >>> CHOICES
    ('advice', 'home', 'other', 'over_capacity')
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def place(self, jobs: JobsLike, *, advice: Sequence[Sequence[str]] | None = None
              ) -> Placement:
        """Place ``jobs`` (attempt rows with ``submitted_at``) day by day.

        Rows are served in ``submitted_at`` order (ties keep the input order), so passing a
        whole stored day without advice reproduces its ``hardware`` column. Each day's
        budget is the fleet's full daily capacity: replay whole days (not a sample of one)
        for a faithful with/without-advice comparison.

        Parameters
        ----------
        jobs : pyarrow.Table or pandas.DataFrame
            Attempt-like rows: ``family_id``, ``trainer_count``, ``batch_size``,
            ``submitted_at`` (optional shape columns as in :meth:`Fleet.job_shape`).
        advice : sequence of sequences of str, optional
            One preference list per job (e.g. LEAP's ranking, best first; may be empty).
            The first advised type that is eligible and has room is taken.

        Returns
        -------
        Placement
        """
        from leap.sim.fleet import _column, _to_utc_us

        fleet = self.fleet
        at = _column(jobs, "submitted_at", required=True)
        day = fleet.day_of(at)  # first: grows the fleet so the jobs' families exist
        fam, shape = fleet.job_shape(jobs)
        n = len(fam)
        adv = None if advice is None else self._advice_matrix(advice, n)
        order = np.lexsort((np.arange(n), _to_utc_us(at)))
        hw = np.empty(n, dtype=np.int64)
        choice = np.empty(n, dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)
        for d in np.unique(day):
            rows = order[day[order] == d]
            out = schedule_day(fleet, fam[rows], shape.devices[rows], int(d),
                               None if adv is None else adv[rows])
            hw[rows], choice[rows] = out.hardware, out.choice
            rank[rows] = np.where(out.choice == _ADVICE, out.rank, -1)
        names = np.asarray(fleet.pool.names, dtype=object)
        return Placement(hardware=names[hw], choice=np.asarray(CHOICES, dtype=object)[choice],
                         advice_rank=rank, within_capacity=choice != _OVER)

    def _advice_matrix(self, advice: Sequence[Sequence[str]], n: int) -> np.ndarray:
        if len(advice) != n:
            raise DataError(f"got {len(advice)} advice lists for {n} jobs; pass one list per "
                            "job (an empty list for no advice)")
        width = max((len(a) for a in advice), default=0)
        out = np.full((n, width), -1, dtype=np.int64)
        index = {name: i for i, name in enumerate(self.fleet.pool.names)}
        for i, names in enumerate(advice):  # per job, but lists are short and built by callers
            for j, name in enumerate(names):
                if name not in index:
                    raise CatalogError(f"advice for job {i} names unknown hardware '{name}'"
                                       f"{did_you_mean(name, index)}")
                out[i, j] = index[name]
        return out


def pool_table(fleet: Fleet, day: int) -> pa.Table:
    """Each type's device-hour budget on ``day`` (for reports)."""
    return pa.table({"hardware": list(fleet.pool.names),
                     "capacity_device_hours": fleet.capacity_device_hours(day),
                     "share": fleet.pool.share})
