"""Ranking the ``/v1/rank`` requests that arrive together in one pass.

A server process ranks on its event loop, one request at a time; requests that arrive
meanwhile wait in their sockets. Ranking one job is mostly fixed cost (a few hundred small
NumPy calls and a handful of native model calls whatever the rows), so ranking the waiting
ones together (:meth:`leap.rank.ranker.Ranker.rank_many`: one encoding, one model call)
costs far less than ranking each alone: on the reference model, CPU per job 2.99 ms alone,
1.96 ms in twos, 1.74 ms in fours, 1.60 ms in sixteens (``python bench/bench_rank.py
--passes 1,2,4,16``, 2026-12-04). A request that
arrives alone is ranked alone, at once; under load each batch is whatever queued while the
previous one ran, up to :data:`MAX_BATCH` (the answers are those of ranking each alone: same
order, same predictions; ``latency_ms`` is the job's share of its batch's time).

Each request is validated on its own first (:meth:`Ranker.check_request`), so a bad one gets
its 422 alone; requests with different options (objective, budget, risk) are ranked in
separate passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI reads MAX_BATCH: no asyncio or ranker for every command
    import asyncio

    from leap.rank.ranker import Ranker
    from leap.rank.results import RankResult

#: Most requests ranked in one pass. A longer pass delays the requests that arrive during it,
#: and past :data:`leap.model.cascade.PARALLEL_ROWS` rows a model call starts threads that
#: contend with the other server processes for the cores. 16 jobs x 20 types stay under it:
#: 320 rows for the model, and on the reference fleet 774 pair-model rows and 84 shape-booster
#: rows for one pass of 16 recent jobs (a job alone: a median of 39 and 4, at most 332 and 36).
MAX_BATCH = 16
#: Event-loop turns the batcher lets pass before taking a batch, so that requests read in the
#: same turn (their parsing and validation take a few turns) join it.
GATHER_TURNS = 1


@dataclass
class _Waiting:
    job: Mapping[str, Any]
    candidates: Sequence[str] | None
    options: tuple[str, float | None, str]  # objective, max_cost_per_hour, risk
    free_devices: Mapping[str, float] | None
    answer: asyncio.Future[RankResult] = field(repr=False)


class RankBatcher:
    """Queue of ``/v1/rank`` requests served in batches by one task on the event loop.

    ``on_batch`` (optional) is called with each batch's size (e.g. a Prometheus histogram's
    ``observe``).
    """

    def __init__(self, ranker: Ranker, *, max_batch: int = MAX_BATCH,
                 on_batch: Callable[[int], None] | None = None) -> None:
        self.ranker = ranker
        self.max_batch = max(1, int(max_batch))
        self.on_batch = on_batch
        self._queue: list[_Waiting] = []
        self._task: asyncio.Task[None] | None = None

    async def rank(self, job: Mapping[str, Any], candidates: Sequence[str] | None, *,
                   objective: str, max_cost_per_hour: float | None, risk: str,
                   free_devices: Mapping[str, float] | None) -> RankResult:
        """:meth:`Ranker.rank` of a validated request, ranked with those waiting beside it."""
        import asyncio

        answer: asyncio.Future[RankResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(job, candidates, (objective, max_cost_per_hour, risk),
                                    free_devices, answer))
        if self._task is None:
            self._task = asyncio.create_task(self._serve())
        return await answer

    async def _serve(self) -> None:
        import asyncio

        try:
            while self._queue:
                for _ in range(GATHER_TURNS):
                    await asyncio.sleep(0)
                batch = self._queue[:self.max_batch]
                del self._queue[:self.max_batch]
                if self.on_batch is not None:
                    self.on_batch(len(batch))
                for options in dict.fromkeys(w.options for w in batch):
                    self._rank([w for w in batch if w.options == options], options)
        finally:
            self._task = None

    def _rank(self, group: list[_Waiting], options: tuple[str, float | None, str]) -> None:
        objective, budget, risk = options
        try:
            answers = self.ranker.rank_many(
                [w.job for w in group], [w.candidates for w in group], objective=objective,
                max_cost_per_hour=budget, risk=risk,
                free_devices=[w.free_devices for w in group])
        except Exception as exc:  # rank_many fails open per job; a bug here fails the group
            for w in group:
                if not w.answer.done():
                    w.answer.set_exception(exc)
            return
        for w, answer in zip(group, answers, strict=True):
            if not w.answer.done():  # its caller may have gone (a client that disconnected)
                w.answer.set_result(answer)
