"""Independent native-heavy tasks spread over a few threads, results in order.

Two uses. Boosters grown side by side on one thread each finish sooner than the same
boosters one after the other on two threads, where there are several of them (a cascade's
13 specialists on a fleet four times the default: 106 s -> 91 s for the whole fit): a
booster's Dataset construction and its rounds' bookkeeping do not use both threads. Their
native calls release the GIL, and a fit with ``deterministic`` set gives the same trees
whatever its thread count, so the models do not depend on how the fits were spread
(:func:`run_each`). And a training window's days are encoded two at a time
(:func:`map_in_order`): NumPy's sorts, gathers and scans release the GIL too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

A = TypeVar("A")
T = TypeVar("T")


def run_each(tasks: Sequence[Callable[[int], T]], threads: int) -> list[T]:
    """Each of ``tasks`` called with the threads it may use; their results in order.

    With ``threads`` >= 2 and several tasks, ``threads`` tasks run at once on one thread
    each; otherwise one after the other, each with ``threads``. The first error raised
    by a task is raised here, once the tasks already running have finished (the others
    never start).

    >>> run_each([lambda t: ("a", t), lambda t: ("b", t)], 2)
    [('a', 1), ('b', 1)]
    >>> run_each([lambda t: t * 10], 2)
    [20]
    """
    if threads < 2 or len(tasks) < 2:
        return [task(max(threads, 1)) for task in tasks]
    pool = ThreadPoolExecutor(max_workers=min(threads, len(tasks)))
    try:
        futures = [pool.submit(task, 1) for task in tasks]
        return [f.result() for f in futures]
    finally:  # after an error, the tasks not started yet never start
        pool.shutdown(wait=True, cancel_futures=True)


def map_in_order(fn: Callable[[A], T], items: Iterable[A], threads: int) -> Iterator[T]:
    """``fn`` of each of ``items``, yielded in order; with ``threads`` >= 2, that many are
    computed at once, and an item starts only once the result ``threads`` places before
    it was taken (so at most ``threads`` results wait, besides the one the caller holds).

    >>> list(map_in_order(lambda x: x * x, range(5), 2))
    [0, 1, 4, 9, 16]
    """
    if threads < 2:
        yield from map(fn, items)
        return
    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        pending: deque[Future[T]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # also when the caller stops early or a task failed: nothing new starts
        pool.shutdown(wait=True, cancel_futures=True)

