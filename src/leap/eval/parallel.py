"""Run independent evaluation tasks in this process, on local processes, or on a Dask cluster.

A task is a top-level function and one picklable argument (plain data: paths, dates, config
dicts), so the same call runs anywhere; results come back as they finish. Backends:

``serial``
    in this process, in order (``workers=1``, no Dask address): no start-up cost, and state
    a task keeps across its items (the backtest's encoded-day cache) stays warm.
``processes``
    a :class:`concurrent.futures.ProcessPoolExecutor` of ``workers`` processes, started with
    ``spawn`` (forking a process that has run LightGBM's OpenMP threads can deadlock).
``dask``
    a ``distributed`` cluster: ``"local"`` starts a :class:`~dask.distributed.LocalCluster` of
    ``workers`` processes (one task at a time each), ``tcp://HOST:PORT`` connects to a running
    scheduler. Workers must reach the paths in the tasks (a shared file system).

Dask is imported only when asked for, so ``import leap`` stays cheap.

Scaling: a backtest night is one task (one fit, on the threads
:meth:`Parallel.task_threads` gives it), so nights scale with workers until every night has
one; a worker keeps the encoded days of its previous night, so fewer workers on consecutive
nights waste less. One window too big for one machine is the model's own business
(:mod:`leap.model.distributed`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from leap.errors import ConfigError, ParamError
from leap.model.distributed import dask_client

T = TypeVar("T")
R = TypeVar("R")

BACKENDS: tuple[str, ...] = ("serial", "processes", "dask")


@dataclass(frozen=True)
class Parallel:
    """Where tasks run (built once at the edge, e.g. from ``--workers`` and ``--dask``).

    Parameters
    ----------
    workers : int
        Local processes (or LocalCluster workers); 1 with no ``dask`` runs in this process.
    dask : str, optional
        ``"local"`` for a LocalCluster of ``workers`` processes, or a scheduler address
        ``tcp://HOST:PORT``.

    Examples
    --------
    >>> Parallel().backend, Parallel(workers=4).backend, Parallel(dask="local").backend
    ('serial', 'processes', 'dask')
    >>> sorted(Parallel().map(abs, [-2, 1]))
    [(0, 2), (1, 1)]
    """

    workers: int = 1
    dask: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) \
                or self.workers < 1:
            raise ConfigError(f"workers must be a whole number >= 1, got {self.workers!r}")
        if self.dask is not None and self.dask != "local" and "://" not in self.dask:
            raise ParamError(f"{{dask}} must be 'local' or a scheduler address like "
                             f"tcp://10.0.0.5:8786, got {self.dask!r}")

    @property
    def backend(self) -> str:
        if self.dask is not None:
            return "dask"
        return "serial" if self.workers == 1 else "processes"

    def task_threads(self, threads: int) -> int:
        """The threads each task may run where one task alone would run ``threads``: all of
        them in this process; the cores' share of each of ``workers`` local processes; one
        on Dask, whose workers run a task a thread. More would make tasks that run at once
        fight over the cores (LightGBM's threads then wait on each other: many times slower).

        >>> Parallel().task_threads(2), Parallel(workers=2, dask="local").task_threads(2)
        (2, 1)
        """
        if self.backend == "serial":
            return threads
        if self.backend == "dask":
            return 1
        return max(1, min(threads, _cpus() // self.workers))

    def map(self, fn: Callable[[T], R], tasks: Sequence[T]) -> Iterator[tuple[int, R]]:
        """Run ``fn`` on every task; yield ``(index, result)`` as each finishes.

        A task's exception is raised here (the others are cancelled where possible).
        """
        if not tasks:
            return
        if self.backend == "serial":
            for i, task in enumerate(tasks):
                yield i, fn(task)
        elif self.backend == "processes":
            yield from _map_processes(fn, tasks, self.workers)
        else:
            yield from _map_dask(fn, tasks, self.dask or "local", self.workers)


def default_workers(threads_per_task: int = 2) -> int:
    """Local processes that fit this machine when each task runs ``threads_per_task`` threads.

    The model fits with a fixed LightGBM thread count (2), so on a 2-core machine one process
    is best: a second one only oversubscribes the cores.

    Examples
    --------
    >>> default_workers() >= 1
    True
    """
    return max(1, _cpus() // max(1, threads_per_task))


def _cpus() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _map_processes(fn: Callable[[T], R], tasks: Sequence[T],
                   workers: int) -> Iterator[tuple[int, R]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        pending = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    yield i, fut.result()
        finally:
            for fut in pending:
                fut.cancel()


def _map_dask(fn: Callable[[T], R], tasks: Sequence[T], address: str,
              workers: int) -> Iterator[tuple[int, R]]:
    from dask.distributed import as_completed

    with dask_client(address, workers) as client:
        # pure=False: the same task submitted twice (a retry) must run again.
        futures = [client.submit(fn, t, pure=False) for t in tasks]
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in as_completed(futures):
                yield index[fut.key], fut.result()
        finally:
            for fut in futures:
                fut.cancel()
