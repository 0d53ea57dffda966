"""Tasks on a few threads: results in order, errors raised, nothing started after one."""

from __future__ import annotations

import threading
import time

import pytest

from leap.threads import map_in_order, run_each


def test_run_each_gives_each_task_one_thread_and_keeps_the_order() -> None:
    names: set[str] = set()

    def task(i: int, threads: int) -> tuple[int, int]:
        names.add(threading.current_thread().name)
        time.sleep(0.01 * (5 - i))  # later tasks finish first
        return i, threads

    assert run_each([lambda t, i=i: task(i, t) for i in range(5)], 2) == \
        [(i, 1) for i in range(5)]
    assert len(names) == 2
    assert run_each([lambda t, i=i: task(i, t) for i in range(3)], 1) == \
        [(0, 1), (1, 1), (2, 1)]


def test_a_failing_task_raises_and_later_tasks_never_start() -> None:
    started: list[int] = []

    def task(i: int, threads: int) -> int:
        started.append(i)
        if i == 0:
            raise ValueError("task 0 failed")
        time.sleep(0.05)
        return i

    with pytest.raises(ValueError, match="task 0 failed"):
        run_each([lambda t, i=i: task(i, t) for i in range(20)], 2)
    assert len(started) < 20


def test_map_in_order_holds_at_most_threads_results() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def work(x: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return x * 2

    out = []
    for r in map_in_order(work, range(12), 2):
        time.sleep(0.02)  # a slow consumer: no more work starts meanwhile
        out.append(r)
    assert out == [2 * x for x in range(12)]
    assert most <= 2
    with pytest.raises(ZeroDivisionError, match="division"):
        list(map_in_order(lambda x: 1 // (x - 3), range(8), 2))
