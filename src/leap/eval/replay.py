"""The impact study's capacity model: one day's placement problem, its replay and its optimum.

The model (deliberately simple):

Work
    Attempt ``j`` recorded on its *home* type ``h`` (the type it ran on) used
    ``devices x duration_hours`` device-hours there. On another type ``t`` it does the same
    work (the same samples), so it runs ``duration_hours x r`` hours with
    ``r = true samples/s on h / true samples/s on t``, and books
    ``demand[j, t] = devices x duration_hours x r`` device-hours. Its cost there is
    ``demand[j, t] x cost_per_device_hour[t]``. So the device-hours a placement books are the
    ones it will really use, and capacity and cost agree. A type the job does not fit (NaN
    true throughput) or may not use is not allowed; an attempt whose home throughput is NaN
    (it failed for lack of memory) stays home.
Budgets
    Each type offers, per day, ``max(capacity, used)`` device-hours: the simulated fleet's
    capacity (:meth:`~leap.sim.fleet.Fleet.capacity_device_hours`) or what history actually
    ran on the type that day when that is more (history is servable by definition). The
    recorded placement (no advice) therefore always fits.
Replay
    Attempts in submission order take the first type of their advice list with room, else
    their home type if it has room. An attempt that finds no room waits for its home type:
    it runs there (at its baseline cost) after the day's budget, in a first-come queue, and
    its completion is delayed by ``queued device-hours up to and including it /
    (budget / 24 h)``. The delay is charged ``delay_cost_weight x devices x
    cost_per_device_hour(home)`` per hour (weight 1: an hour's delay costs as much as an
    hour of the job's devices).
Optimum
    :func:`optimum` solves the linear program min sum ``cost[j, t] x[j, t]`` with
    ``sum_t x[j, t] = 1`` per attempt and ``sum_j demand[j, t] x[j, t] <= budget[t]`` per type,
    plus, per attempt, the option of waiting for home priced at the smallest delay a waiting
    attempt can have (its own device-hours / hourly budget). Every replay's placement is a
    feasible point at no lower cost, so the optimum bounds what any advice can achieve.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from leap.errors import DataError

#: Placement kinds of a replay, in report order.
KINDS: tuple[str, ...] = ("on_advice", "displaced", "home", "waiting")
ON_ADVICE, DISPLACED, HOME, WAITING = range(4)
#: Advice for attempt ``j`` given the room left per type (for availability-aware advice).
AdviceFn = Callable[[int, np.ndarray], Sequence[int]]


@dataclass(frozen=True)
class DayProblem:
    """One day's placement problem (rows in submission order, columns are types).

    Attributes
    ----------
    names : tuple of str
        The types (columns).
    home : ndarray of int, shape (n,)
        Each attempt's recorded type.
    devices : ndarray of float, shape (n,)
    demand : ndarray of float, shape (n, T)
        Device-hours each attempt books on each type; ``inf`` where it may not run.
    price : ndarray of float, shape (T,)
        Cost per device-hour.
    budget : ndarray of float, shape (T,)
        Device-hours each type offers this day.
    """

    names: tuple[str, ...]
    home: np.ndarray
    devices: np.ndarray
    demand: np.ndarray
    price: np.ndarray
    budget: np.ndarray

    def __post_init__(self) -> None:
        n, t = self.demand.shape
        if len(self.names) != t or self.price.shape != (t,) or self.budget.shape != (t,):
            raise DataError(f"day problem: {t} demand columns but {len(self.names)} names, "
                            f"{self.price.shape} prices, {self.budget.shape} budgets")
        if self.home.shape != (n,) or self.devices.shape != (n,):
            raise DataError(f"day problem: {n} demand rows but home {self.home.shape}, "
                            f"devices {self.devices.shape}")
        if n and not np.isfinite(self.demand[np.arange(n), self.home]).all():
            raise DataError("day problem: every attempt must be allowed on its home type")

    @property
    def cost(self) -> np.ndarray:
        """Cost of each attempt on each type (``inf`` where not allowed)."""
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(self.demand), self.demand * self.price[None, :],
                            np.inf)

    @property
    def baseline_cost(self) -> np.ndarray:
        """Each attempt's cost on its home type (the recorded placement)."""
        return self.cost[np.arange(len(self.home)), self.home]

    def min_delay_hours(self) -> np.ndarray:
        """The smallest delay of a waiting attempt: its own device-hours / hourly budget."""
        home_demand = self.demand[np.arange(len(self.home)), self.home]
        return home_demand / (np.maximum(self.budget[self.home], 1e-12) / 24.0)


@dataclass(frozen=True)
class Replay:
    """Where one replay put each attempt (arrays in the problem's row order)."""

    hardware: np.ndarray       # type index
    kind: np.ndarray           # index into KINDS
    delay_hours: np.ndarray    # 0 unless waiting
    used: np.ndarray           # device-hours booked per type within the day's budget


def replay(problem: DayProblem, advice: Sequence[Sequence[int]] | AdviceFn | None = None,
           *, depth: int | None = None) -> Replay:
    """Place the day's attempts in submission order (see the module docstring).

    Parameters
    ----------
    problem : DayProblem
    advice : sequence of sequences of int, or callable, optional
        Each attempt's advice list (type indices, best first), or ``advice(j, room)``
        returning it given the device-hours left per type when attempt ``j`` arrives.
        None: no advice (every attempt tries its home type).
    depth : int, optional
        Only the list's first ``depth`` entries are tried (None: all).

    Returns
    -------
    Replay

    Examples
    --------
    >>> p = DayProblem(("A", "B"), np.array([0, 0]), np.ones(2),
    ...                np.array([[2.0, 1.0], [2.0, 1.0]]), np.array([1.0, 1.5]),
    ...                np.array([4.0, 1.0]))
    >>> r = replay(p, [[1], [1]])
    >>> r.hardware.tolist(), [KINDS[k] for k in r.kind]
    ([1, 0], ['on_advice', 'home'])
    """
    n = len(problem.home)
    room = problem.budget.astype(np.float64).copy()
    queue = np.zeros_like(room)
    used = np.zeros_like(room)
    hw = np.empty(n, dtype=np.int64)
    kind = np.empty(n, dtype=np.int64)
    delay = np.zeros(n)
    demand = problem.demand
    hourly = np.maximum(problem.budget, 1e-12) / 24.0
    # Float sums of the same bookings in another order must still fit the budget.
    tol = 1e-9 * problem.budget + 1e-12
    for j in range(n):
        if advice is None:
            prefs: Sequence[int] = ()
        elif callable(advice):
            prefs = advice(j, room)
        else:
            prefs = advice[j]
        if depth is not None:
            prefs = prefs[:depth]
        placed = False
        for pos, t in enumerate(prefs):
            d = demand[j, t]
            if d <= room[t] + tol[t]:
                room[t] -= d
                used[t] += d
                hw[j], kind[j] = t, (ON_ADVICE if pos == 0 else DISPLACED)
                placed = True
                break
        if placed:
            continue
        h = int(problem.home[j])
        d = demand[j, h]
        hw[j] = h
        if d <= room[h] + tol[h]:
            room[h] -= d
            used[h] += d
            kind[j] = HOME
        else:
            queue[h] += d
            kind[j] = WAITING
            delay[j] = queue[h] / hourly[h]
    return Replay(hardware=hw, kind=kind, delay_hours=delay, used=used)


@dataclass(frozen=True)
class Optimum:
    """The LP optimum of one day: fractional assignment, cost, and what it waits."""

    cost: float                # fleet cost + delay cost
    fleet_cost: float
    delay_cost: float
    share: np.ndarray          # (n, T) fraction of each attempt on each type
    wait_share: np.ndarray     # (n,) fraction of each attempt waiting for home
    status: str


def optimum(problem: DayProblem, *, delay_cost_weight: float = 1.0,
            allow_wait: bool = True) -> Optimum:
    """Minimum-cost fractional assignment under the day's budgets (SciPy ``linprog``/HiGHS).

    Parameters
    ----------
    problem : DayProblem
    delay_cost_weight : float
        Cost of an hour of delay per device-hour of the job's home price.
    allow_wait : bool
        Offer each attempt the option of waiting for home. Without it, every attempt is
        served within the day's budgets (always feasible: the recorded placement fits); that
        optimum is not a bound on replays in which attempts wait, but a stricter target.

    Returns
    -------
    Optimum
        With waiting allowed, a lower bound on the cost of any replay of the problem (see
        the module docstring).

    Raises
    ------
    DataError
        If the solver fails (it should not: waiting at home is always feasible).

    Examples
    --------
    >>> p = DayProblem(("A", "B"), np.array([0, 0]), np.ones(2),
    ...                np.array([[2.0, 1.0], [2.0, 1.0]]), np.array([1.0, 1.5]),
    ...                np.array([4.0, 1.0]))
    >>> round(optimum(p).fleet_cost, 6)  # one attempt on B (1.5), one home (2.0)
    3.5
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n, t = problem.demand.shape
    if n == 0:
        return Optimum(0.0, 0.0, 0.0, np.zeros((0, t)), np.zeros(0), "empty")
    cost = problem.cost
    rows, cols = np.nonzero(np.isfinite(cost))
    base = problem.baseline_cost
    wait_cost = base + delay_cost_weight * problem.devices * problem.price[problem.home] \
        * problem.min_delay_hours()
    m = len(rows)
    c = np.concatenate([cost[rows, cols], wait_cost])
    # Equality: each attempt is placed once (on a type or waiting).
    a_eq = coo_matrix((np.ones(m + n), (np.concatenate([rows, np.arange(n)]),
                                        np.arange(m + n))), shape=(n, m + n)).tocsr()
    # Budgets: device-hours booked on each type (waiting books none of today's budget).
    a_ub = coo_matrix((problem.demand[rows, cols], (cols, np.arange(m))),
                      shape=(t, m + n)).tocsr()
    # Scale to keep HiGHS's tolerances meaningful for costs of very different sizes.
    scale = max(float(np.median(c)), 1e-12)
    upper = np.ones(m + n)
    if not allow_wait:
        upper[m:] = 0.0
    res = linprog(c / scale, A_ub=a_ub, b_ub=problem.budget, A_eq=a_eq, b_eq=np.ones(n),
                  bounds=np.column_stack([np.zeros(m + n), upper]), method="highs")
    if res.status != 0 or res.x is None:
        raise DataError(f"the capacity-aware optimum failed: {res.message}")
    x = np.clip(res.x, 0.0, 1.0)
    share = np.zeros((n, t))
    share[rows, cols] = x[:m]
    wait = x[m:]
    fleet = float((x[:m] * cost[rows, cols]).sum() + (wait * base).sum())
    delay = float((wait * (wait_cost - base)).sum())
    return Optimum(cost=fleet + delay, fleet_cost=fleet, delay_cost=delay, share=share,
                   wait_share=wait, status=str(res.message))
