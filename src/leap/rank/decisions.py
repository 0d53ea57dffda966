"""The decision log: every ranking served, recorded off the request path into DuckDB.

A :class:`DecisionLog` owns one DuckDB file (``<home>/decisions.duckdb``, beside the attempt
store, so serving never holds the store's write lock and ``leap ingest`` / ``leap train`` run
while ``leap serve`` does). Recording a ranking costs the caller one ``put_nowait`` on a
bounded queue (the record as a JSON array: about 25 us); a background thread turns batches
of records (at most one a flush interval) into two tables and inserts them on its own
short-lived connection (opened per flush, so ``leap monitor`` can read the file between
flushes). A full queue drops the record and counts it (``dropped``): recording never delays
or fails a ranking. In a server (``process=True``, what `leap serve` uses) the tables are
built and inserted by a child process at the lowest CPU priority, so a flush costs the
serving process neither the GIL nor a core; stopping, the writer thread writes what is left
itself (:meth:`DecisionLog.close`). Each decision's id is given when it is recorded, and a
batch sent twice (its first write's outcome unknown) is stored once.

Tables
------
``decisions``
    One row per ranking: ``decision_id``, ``decided_at`` (wall clock, UTC), ``launch_at`` (the
    job's ``submitted_at`` when the caller sent one, else ``decided_at``), ``source`` (``http``,
    ``cli``, ``python``), ``attempt_id`` and ``job_id`` (when the job carried them), the job's
    ``family_id``, ``model_type``, ``trainer_count`` and ``devices``, ``candidates`` (JSON list,
    null = every type), ``n_ranked``, ``first_choice``, ``model_version``, ``reason``,
    ``fail_open``, ``objective``, ``risk``, ``latency_ms`` and the whole ``job`` as JSON.
``decision_entries``
    One row per ranked type: ``decision_id``, ``decided_at``, ``position`` (1 = first choice),
    ``hardware``, ``predicted_throughput``, ``throughput_p10``, ``throughput_p90``,
    ``cost_per_hour``, ``value``, ``novelty``.

Retention: rows decided more than ``retention_days`` ago are deleted by the writer (at most
once an hour).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import orjson

from leap.errors import ConfigError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from leap.rank.results import RankResult

log = logging.getLogger("leap.decisions")

DECISIONS_FILE = "decisions.duckdb"
SOURCES: tuple[str, ...] = ("http", "cli", "python")
DEFAULT_RETENTION_DAYS = 90
DEFAULT_MAX_QUEUE = 50_000
#: Seconds between the writer's flushes. Each flush costs tens of milliseconds of CPU (and of
#: the GIL) whatever its size; at 150 rankings/s on `leap serve --workers 2`, 0.5 s left the
#: p99 at 0.5 s and 2 s at 87 ms, with the same CPU per request as no log (see the README).
DEFAULT_FLUSH_INTERVAL_S = 2.0

_DDL = (
    "CREATE TABLE IF NOT EXISTS decisions (decision_id VARCHAR NOT NULL, decided_at "
    "TIMESTAMPTZ NOT NULL, launch_at TIMESTAMPTZ NOT NULL, source VARCHAR, attempt_id VARCHAR, "
    "job_id VARCHAR, family_id VARCHAR, model_type VARCHAR, trainer_count BIGINT, devices "
    "BIGINT, candidates VARCHAR, n_ranked BIGINT NOT NULL, first_choice VARCHAR, model_version "
    "VARCHAR, reason VARCHAR, fail_open BOOLEAN NOT NULL, objective VARCHAR, risk VARCHAR, "
    "latency_ms DOUBLE, job VARCHAR)",
    "CREATE TABLE IF NOT EXISTS decision_entries (decision_id VARCHAR NOT NULL, decided_at "
    "TIMESTAMPTZ NOT NULL, position BIGINT NOT NULL, hardware VARCHAR NOT NULL, "
    "predicted_throughput DOUBLE, throughput_p10 DOUBLE, throughput_p90 DOUBLE, cost_per_hour "
    "DOUBLE, value DOUBLE, novelty VARCHAR)",
)
_DECISION_COLS = ("decision_id", "decided_at", "launch_at", "source", "attempt_id", "job_id",
                  "family_id", "model_type", "trainer_count", "devices", "candidates",
                  "n_ranked", "first_choice", "model_version", "reason", "fail_open",
                  "objective", "risk", "latency_ms", "job")
_ENTRY_COLS = ("decision_id", "decided_at", "position", "hardware", "predicted_throughput",
               "throughput_p10", "throughput_p90", "cost_per_hour", "value", "novelty")


def decisions_path(home: Path) -> Path:
    """Where a workspace keeps its decision log."""
    return Path(home) / DECISIONS_FILE


def is_fail_open(reason: str | None) -> bool:
    """True for a fail-open answer (not for ``no_eligible_type``, which is advice: none fit)."""
    return reason is not None and not reason.startswith("no_eligible_type")


def _job_json(job: Mapping[str, Any]) -> str:
    """The job as a JSON object (values JSON cannot hold as text; about 2 us)."""
    job = job if isinstance(job, dict) else dict(job)
    try:
        return orjson.dumps(job, default=str, option=orjson.OPT_SERIALIZE_NUMPY
                            | orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # e.g. an integer beyond 64 bits
        return orjson.dumps({str(k): str(v) for k, v in job.items()}).decode()


#: What each ranked entry contributes to ``decision_entries``: the columns after the
#: decision's id, time and the entry's position, read off the entry by the same names.
_ENTRY_FIELDS = attrgetter(*_ENTRY_COLS[3:])


class _Pending(NamedTuple):
    """One recorded ranking, as the writer reads it.

    The caller's thread takes its values as a plain tuple of strings, numbers and tuples of
    them (the job as JSON text; :meth:`of`) and queues them as one JSON array
    (:meth:`encoded`), which the garbage collector never tracks. Queued as live
    :class:`RankResult` objects (21 tracked objects a ranking, held for up to a flush
    interval), records were promoted to the oldest generation and made a busy server run
    full collections of 30-140 ms every few seconds: the open loop's p99 of
    ``bench/bench_http.py`` was 110-135 ms with the log against 9 ms without it.
    """

    decision_id: str  # given when recorded, so a batch written twice is stored once
    at: float
    source: str
    job: str  # JSON
    candidates: tuple[str, ...] | None
    model_version: str | None
    reason: str | None
    objective: str
    risk: str
    latency_ms: float
    entries: tuple[tuple[Any, ...], ...]  # _ENTRY_FIELDS of each ranked type, first first

    @staticmethod
    def of(at: float, source: str, job: Mapping[str, Any], candidates: Sequence[str] | None,
           result: RankResult) -> tuple[Any, ...]:
        """The record's values (read back with ``_Pending._make``)."""
        return (uuid.uuid4().hex, at, source, _job_json(job),
                None if candidates is None else tuple(candidates),
                result.model_version, result.reason, result.objective, result.risk,
                result.latency_ms, tuple(map(_ENTRY_FIELDS, result.ranking)))

    @staticmethod
    def encoded(values: tuple[Any, ...]) -> bytes:
        """:meth:`of`'s values as queued: a JSON array (a few microseconds). Bytes are
        never tracked by the garbage collector, and a batch of them goes to the writer
        process joined (:func:`_batch_json`) instead of serialised whole while the writer
        thread holds the GIL."""
        return orjson.dumps(values)


def _ts(value: Any, default: datetime) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, str):
        try:
            ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return default
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return default


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tables(records: Sequence[Sequence[Any]]) -> tuple[pa.Table, pa.Table | None]:
    """The queued records (:meth:`_Pending.of`, or the same as JSON arrays) as the two tables
    (``None``: no entries), the entries built column by column (15 ms for 900 rankings of 20
    types, against 31 ms row by row)."""
    import numpy as np
    import pyarrow as pa

    batch = list(map(_Pending._make, records))
    n = len(batch)
    dec: dict[str, list[Any]] = {c: [] for c in _DECISION_COLS}
    for p in batch:
        job = orjson.loads(p.job)
        at = datetime.fromtimestamp(p.at, UTC)
        trainers = _int(job.get("trainer_count"))
        dpt = _int(job.get("devices_per_trainer")) or 1
        ids = {k: (None if job.get(k) is None else str(job.get(k)))
               for k in ("attempt_id", "job_id", "family_id", "model_type")}
        row = {"decision_id": p.decision_id, "decided_at": at,
               "launch_at": _ts(job.get("submitted_at"), at), "source": p.source, **ids,
               "trainer_count": trainers, "devices": trainers * dpt if trainers else None,
               "candidates": None if p.candidates is None else json.dumps(list(p.candidates)),
               "n_ranked": len(p.entries),
               "first_choice": p.entries[0][0] if p.entries else None,
               "model_version": p.model_version, "reason": p.reason,
               "fail_open": is_fail_open(p.reason), "objective": p.objective, "risk": p.risk,
               "latency_ms": p.latency_ms, "job": p.job}
        for c in _DECISION_COLS:
            dec[c].append(row[c])
    decisions = pa.table(dec)
    counts = np.fromiter((len(p.entries) for p in batch), dtype=np.int64, count=n)
    total = int(counts.sum())
    if total == 0:
        return decisions, None
    owner = pa.array(np.repeat(np.arange(n), counts))
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    fields = list(zip(*(e for p in batch for e in p.entries), strict=True))
    entries = pa.table({
        "decision_id": decisions.column("decision_id").take(owner),
        "decided_at": decisions.column("decided_at").take(owner),
        "position": pa.array(np.arange(total) - starts + 1),
        **{c: pa.array(v, type=pa.string() if c in ("hardware", "novelty") else pa.float64())
           for c, v in zip(_ENTRY_COLS[3:], fields, strict=True)}})
    return decisions, entries


def create_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Create the decision tables on ``con`` when missing."""
    for ddl in _DDL:
        con.execute(ddl)


class DecisionLog:
    """Record rankings into a DuckDB file from a background thread (bounded, lossy when full).

    Parameters
    ----------
    path : Path
        The DuckDB file (created on the first flush).
    retention_days : float
        Decisions older than this are deleted by the writer (``None``: kept forever).
    max_queue : int
        Records waiting for the writer at most; beyond, new records are dropped and counted.
    flush_interval_s : float
        The writer flushes at most once per interval (what arrives meanwhile is one batch).
    process : bool
        Write from a child process at the lowest CPU priority instead of this process's
        writer thread (for a server: see :func:`_writer_process`). The thread only hands
        each batch over as JSON and waits for the child's answer.

    Examples
    --------
    Not run here (it needs a workspace)::

        log = DecisionLog(decisions_path(ws.home)); ranker.decision_sink = log.sink("python")
        ... ranker.rank(job) ...; log.close()   # flushes what is queued
    """

    def __init__(self, path: Path, *, retention_days: float | None = DEFAULT_RETENTION_DAYS,
                 max_queue: int = DEFAULT_MAX_QUEUE,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
                 max_batch: int = 5_000, process: bool = False) -> None:
        if retention_days is not None and not retention_days > 0:
            raise ConfigError(f"decision retention must be a positive number of days, got "
                              f"{retention_days!r}")
        if not (isinstance(max_queue, int) and max_queue >= 1):
            raise ConfigError(f"decision queue size must be a whole number >= 1, got "
                              f"{max_queue!r}")
        self.path = Path(path)
        self.retention_days = retention_days
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=max_queue)  # _Pending.encoded
        self._pending: list[bytes] = []  # taken from the queue, not yet written
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._count_lock = threading.Lock()
        self._store = _Store(self.path, retention_days)
        self._process = process
        self._child: _Child | None = None
        self._give_up_at = float("inf")  # set by close()
        self.recorded = 0       # handed over by rankers
        self.written = 0        # rows committed to `decisions`
        self.dropped = 0        # refused because the queue was full
        self.write_errors = 0   # flushes that failed (records kept and retried)
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="leap-decision-log", daemon=True)
        self._thread.start()

    # The caller's side (must stay cheap) -------------------------------------------------
    def record(self, job: Mapping[str, Any], candidates: Sequence[str] | None,
               result: RankResult, source: str = "python") -> bool:
        """Queue one ranking; False (and counted in :attr:`dropped`) when the queue is full."""
        try:
            self._queue.put_nowait(_Pending.encoded(
                _Pending.of(time.time(), source, job, candidates, result)))
        except queue.Full:
            with self._count_lock:
                self.dropped += 1
            return False
        with self._count_lock:
            self.recorded += 1
        return True

    def sink(self, source: str = "python") -> Callable[[Mapping[str, Any], Sequence[str] | None,
                                                        RankResult], None]:
        """A :data:`~leap.rank.ranker.DecisionSink` that records with ``source``."""
        if source not in SOURCES:
            raise ConfigError(f"decision source must be one of {', '.join(SOURCES)}, got "
                              f"{source!r}")

        def record(job: Mapping[str, Any], candidates: Sequence[str] | None,
                   result: RankResult) -> None:
            self.record(job, candidates, result, source)

        return record

    @property
    def queued(self) -> int:
        """Records accepted and not yet written (in the queue or in the writer's hands)."""
        return self.recorded - self.written

    def stats(self) -> dict[str, Any]:
        return {"path": str(self.path), "recorded": self.recorded, "written": self.written,
                "dropped": self.dropped, "queued": self.queued,
                "write_errors": self.write_errors, "last_error": self.last_error}

    # The writer's side -------------------------------------------------------------------
    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        target = self.recorded
        with self._idle:
            while self.written < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._idle.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the writer, within about ``timeout_s``.

        Stopping, the writer thread writes what is left itself, not through the child: at
        the lowest priority a child can be starved of CPU on a busy host for longer than a
        shutdown waits (seen in CI, with every core busy). A child still busy with a batch
        after a third of ``timeout_s`` is stopped, and the thread writes that batch too (the
        file stores a decision once, whichever write committed it). Rows the file cannot
        take by then stay unwritten and counted in ``write_errors``.
        """
        start = time.monotonic()
        self._give_up_at = start + 0.8 * timeout_s
        self._stop.set()
        self._thread.join(timeout_s / 3)
        child = self._child
        if self._thread.is_alive() and child is not None:
            child.proc.kill()  # the writer's read of its answer ends: the batch is kept
        self._thread.join(max(0.0, start + timeout_s - time.monotonic()))
        if not self._thread.is_alive():  # else the writer still uses the child: it ends
            self._stop_child(timeout_s)  # when this process closes the pipe on exit

    def _run(self) -> None:
        while True:
            stopping = self._stop.is_set()
            batch = self._take(0.0 if stopping else self.flush_interval_s)
            started = time.monotonic()
            if batch:
                self._write(batch)
            with self._idle:
                self._idle.notify_all()
            if batch and not stopping:
                # At most one flush per interval: a flush costs tens of milliseconds of CPU
                # whatever its size (open the file, insert, commit, close), so flushing each
                # time a record arrives took most of a core under steady traffic. Stopping
                # cuts the wait short.
                self._stop.wait(max(0.0, self.flush_interval_s - (time.monotonic() - started)))
            if stopping and self._queue.empty() and not self._pending:
                return
            if stopping and self._pending and time.monotonic() > self._give_up_at:
                return  # the file stays unwritable: give up at shutdown, counted in errors

    def _take(self, wait_s: float) -> list[bytes]:
        batch = self._pending
        self._pending = []
        if not batch:
            try:
                batch.append(self._queue.get(timeout=wait_s) if wait_s > 0 else
                             self._queue.get_nowait())
            except queue.Empty:
                return []
        # The rest under one hold of the queue's lock (queue.Queue's own attributes), not one
        # get a record: a thousand gets took 0.5-0.6 ms of the GIL, one hold 0.03 ms.
        q = self._queue
        with q.mutex:
            n = max(0, min(len(q.queue), self.max_batch - len(batch)))
            batch.extend(q.queue.popleft() for _ in range(n))
            if n:
                q.not_full.notify_all()
        return batch

    def _write(self, batch: list[bytes]) -> None:
        try:
            if self._process and not self._stop.is_set():
                self._write_in_child(batch)
            else:  # stopping: this thread writes what is left (see close)
                self._store.write(orjson.loads(_batch_json(batch)))
        except Exception as exc:  # e.g. another process holds the file (leap monitor):
            # keep the batch and retry on the next flush; never lose it silently.
            self.write_errors += 1
            self.last_error = str(exc) if isinstance(exc, _ChildFailed) else _describe(exc)
            log.warning("decision log write failed (will retry): %s", self.last_error)
            self._pending = batch
            # Stopping, retry soon: another process's writer may hold the file for its own
            # last flush (`leap serve --workers N` stops them all at once).
            time.sleep(0.1 if self._stop.is_set() else self.flush_interval_s)
            return
        self.written += len(batch)

    def _write_in_child(self, batch: list[bytes]) -> None:
        if self._child is None or self._child.proc.poll() is not None:
            self._stop_child(5.0)
            self._child = _start_child(self.path, self.retention_days)
        try:
            _send(self._child.stdin, _batch_json(batch))
            failure = _receive(self._child.stdout).decode()  # the GIL is free meanwhile
        except (EOFError, OSError, ValueError) as exc:
            self._stop_child(5.0)
            raise RuntimeError(f"the decision writer process stopped ({exc})") from None
        if failure:
            raise _ChildFailed(failure)

    def _stop_child(self, timeout_s: float) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        with contextlib.suppress(OSError):
            child.stdin.close()  # the child's next read ends it
        try:
            child.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
        child.stdout.close()


def _batch_json(batch: Sequence[bytes]) -> bytes:
    """Queued records (:meth:`_Pending.encoded`) as one JSON array."""
    return b"[" + b",".join(batch) + b"]"


class _ChildFailed(Exception):
    """The writer process's report of a failed write (its text is the error's)."""


def _describe(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"


class _Store:
    """The decision file's writes: rows inserted one batch a connection, and rows older than
    ``retention_days`` deleted at most once an hour."""

    def __init__(self, path: Path, retention_days: float | None) -> None:
        self.path = path
        self.retention_days = retention_days
        self._last_purge = -float("inf")

    def write(self, records: Sequence[Sequence[Any]]) -> None:
        """Insert the records (:meth:`_Pending.of`) in one transaction, but those whose
        ``decision_id`` the file holds already: a batch whose write may have committed
        before its writer was stopped (a child killed at shutdown, one that died before
        answering) is sent again, and stored once."""
        import duckdb
        import pyarrow as pa
        import pyarrow.compute as pc

        decisions, entries = _tables(records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One DuckDB thread: a flush of 500 rankings took 33-36 ms of CPU, 36-42 with two.
        con = duckdb.connect(str(self.path), config={"threads": 1})
        try:
            con.execute("SET TimeZone = 'UTC'")
            create_tables(con)
            con.begin()
            con.register("__leap_dec", decisions)
            # Rows are appended in time order, so the time bound reads only the newest ones.
            since = pc.min(decisions.column("decided_at")).as_py()
            held = [r[0] for r in con.execute(
                "SELECT decision_id FROM decisions WHERE decided_at >= $since AND decision_id "
                "IN (SELECT decision_id FROM __leap_dec)", {"since": since}).fetchall()]
            if held:
                keep = pc.invert(pc.is_in(decisions.column("decision_id"),
                                          value_set=pa.array(held)))
                decisions = decisions.filter(keep)
                con.register("__leap_dec", decisions)
                if entries is not None:
                    entries = entries.filter(pc.invert(pc.is_in(
                        entries.column("decision_id"), value_set=pa.array(held))))
                    entries = entries if entries.num_rows else None
            con.execute(f"INSERT INTO decisions ({', '.join(_DECISION_COLS)}) SELECT "
                        f"{', '.join(_DECISION_COLS)} FROM __leap_dec")
            if entries is not None:
                con.register("__leap_ent", entries)
                con.execute(f"INSERT INTO decision_entries ({', '.join(_ENTRY_COLS)}) "
                            f"SELECT {', '.join(_ENTRY_COLS)} FROM __leap_ent")
            self._purge(con)
            con.commit()
        finally:
            con.close()

    def _purge(self, con: duckdb.DuckDBPyConnection) -> None:
        now = time.monotonic()
        if self.retention_days is None or now - self._last_purge < 3600.0:
            return
        self._last_purge = now
        cutoff = datetime.now(UTC) - timedelta(days=self.retention_days)
        for table in ("decisions", "decision_entries"):
            con.execute(f"DELETE FROM {table} WHERE decided_at < $c", {"c": cutoff})


class _Child(NamedTuple):
    proc: subprocess.Popen[bytes]
    stdin: IO[bytes]
    stdout: IO[bytes]


def _start_child(path: Path, retention_days: float | None) -> _Child:
    # A fresh interpreter that imports this module alone (multiprocessing's spawn would
    # import the parent's main script again, running it where it has no main guard).
    proc = subprocess.Popen(
        [sys.executable, "-c", "from leap.rank.decisions import _writer_process; "
         "_writer_process()", str(path), "" if retention_days is None else repr(retention_days)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    return _Child(proc, proc.stdin, proc.stdout)


def _send(stream: IO[bytes], data: bytes) -> None:
    stream.write(len(data).to_bytes(4, "big") + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> bytes:
    head = stream.read(4)
    size = int.from_bytes(head, "big") if len(head) == 4 else -1
    data = stream.read(size) if size >= 0 else b""
    if size < 0 or len(data) != size:
        raise EOFError("the pipe closed")
    return data


def _writer_process() -> None:
    """The writer child's loop (``sys.argv``: the file and the retention in days, or empty):
    it writes each batch its parent sends on stdin (a JSON array of records, length-prefixed)
    and answers on stdout with an empty message, or the error's text when the write failed.

    A flush holds the GIL for as long as it builds Python objects, and a flush's DuckDB work
    (about 45 ms, mostly opening and closing the file) takes a core. In the serving process,
    either delayed the requests that arrived meanwhile: with the writer on a thread of
    `leap serve`, the open loop of `bench/bench_http.py` (500 req/s) had a p99 of 45-55 ms at
    normal priority and 24-39 ms at the lowest, against 11 ms with a writer that wrote
    nothing (2026-12-05). Here, at the lowest priority, the server joins each batch's
    records (each encoded as it was queued) and waits on a pipe: p99 14-18 ms (19-33 ms when
    the writer thread encoded the whole batch), against 8-9 ms without the log; see
    docs/measurements.md.
    """
    with contextlib.suppress(AttributeError, OSError):  # not available: normal priority
        os.nice(19)
    path, retention = sys.argv[1], sys.argv[2]
    store = _Store(Path(path), float(retention) if retention else None)
    source, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not break the answers' framing
    while True:
        try:
            data = _receive(source)
        except EOFError:
            return  # the parent closed the pipe (or went away)
        try:
            store.write(orjson.loads(data))
            failure = ""
        except Exception as exc:  # reported to the parent, which keeps the batch and retries
            failure = _describe(exc)
        try:
            _send(answers, failure.encode())
        except OSError:
            return


def read_decisions(path: Path, since: datetime | None = None,
                   days: float | None = None) -> tuple[Any, Any]:
    """Both tables of a decision log as pandas frames (empty frames when there is no log):
    every decision, or those whose ``launch_at`` is at or after ``since``, or within ``days``
    days of the log's latest ``launch_at``, with their entries."""
    import pandas as pd

    with _reading(path) as con:
        if con is None:
            return (pd.DataFrame(columns=list(_DECISION_COLS)),
                    pd.DataFrame(columns=list(_ENTRY_COLS)))
        where, params = "", dict[str, Any]()
        if since is not None:
            where, params = " WHERE launch_at >= $since", {"since": since}
        elif days is not None:
            where = (" WHERE launch_at >= (SELECT max(launch_at) FROM decisions)"
                     " - to_microseconds(CAST($us AS BIGINT))")
            params = {"us": int(days * 86_400e6)}
        dec = con.execute(f"SELECT * FROM decisions{where} ORDER BY decided_at", params).df()
        ent = con.execute("SELECT * FROM decision_entries" + (
            f" WHERE decision_id IN (SELECT decision_id FROM decisions{where})" if where
            else "") + " ORDER BY decided_at, position", params).df()
    return dec, ent


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[duckdb.DuckDBPyConnection | None]:
    """A read-only connection to the log, or None when it has no decisions table yet."""
    if not Path(path).exists():
        yield None
        return
    con = _connect_read(Path(path))
    try:
        tables = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        yield con if "decisions" in tables else None
    finally:
        con.close()


def _connect_read(path: Path, attempts: int = 50) -> duckdb.DuckDBPyConnection:
    """A read-only connection, retrying while the server's writer holds the file (it holds it
    only for the length of one flush)."""
    import duckdb

    from leap.errors import DataError

    for i in range(attempts):
        try:
            con = duckdb.connect(str(path), read_only=True)
            con.execute("SET TimeZone = 'UTC'")
            # A long read (the server's live figures) must not draw DuckDB's progress bar
            # into the server's log.
            con.execute("SET enable_progress_bar = false")
            return con
        except duckdb.Error as exc:
            if "lock" not in str(exc).lower() or i == attempts - 1:
                raise DataError(f"cannot read decision log {path}: "
                                f"{str(exc).splitlines()[0]}") from None
            time.sleep(0.1)
    raise AssertionError("unreachable")
