"""The attempt store: one embedded DuckDB file with the attempts, the quarantine and ingest log."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import duckdb
import pyarrow as pa

from leap.data.schema import (
    ATTEMPTS_SCHEMA,
    STATUSES,
    conform_attempts,
    conform_quarantine,
)
from leap.errors import DataError, did_you_mean

#: Bump when the table layout changes; a store written by another layout is refused.
STORE_SCHEMA_VERSION = "1"

_DUCK_TYPES: dict[pa.DataType, str] = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
}


def _ident(name: str) -> str:
    """Quote an SQL identifier (column names come from user files)."""
    return '"' + name.replace('"', '""') + '"'


def _duck_type(t: pa.DataType) -> str:
    return _DUCK_TYPES[t]


ATTEMPT_COLUMNS: tuple[str, ...] = tuple(ATTEMPTS_SCHEMA.names)
_COLS_SQL = ", ".join(_ident(c) for c in ATTEMPT_COLUMNS)

_DDL = [
    "CREATE TABLE IF NOT EXISTS attempts ("
    + ", ".join(f"{_ident(f.name)} {_duck_type(f.type)}" for f in ATTEMPTS_SCHEMA)
    + ", batch_id BIGINT NOT NULL, ingested_at TIMESTAMPTZ NOT NULL)",
    "CREATE TABLE IF NOT EXISTS quarantine (batch_id BIGINT NOT NULL, source VARCHAR, "
    "row_number BIGINT, reason VARCHAR NOT NULL, record VARCHAR, "
    "quarantined_at TIMESTAMPTZ NOT NULL)",
    "CREATE TABLE IF NOT EXISTS batches (batch_id BIGINT NOT NULL, source VARCHAR NOT NULL, "
    "ingested_at TIMESTAMPTZ NOT NULL, rows_in BIGINT NOT NULL, added BIGINT NOT NULL, "
    "already_stored BIGINT NOT NULL, quarantined BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
    # Files ingested, so `leap ingest --incremental` reads each one once (additive: a store
    # written before it simply has no row here).
    "CREATE TABLE IF NOT EXISTS ingested_files (path VARCHAR PRIMARY KEY, size_bytes BIGINT "
    "NOT NULL, mtime_ns BIGINT NOT NULL, rows_read BIGINT NOT NULL, batch_id BIGINT NOT NULL, "
    "ingested_at TIMESTAMPTZ NOT NULL)",
]


@dataclass(frozen=True)
class BatchResult:
    """What one :meth:`Store.add_batch` (or :meth:`Batch.add`) call did.

    ``quarantined`` counts the invalid rows handed in; ``quarantine_new`` how many of them were
    not already in the quarantine table (re-ingesting a file adds nothing there either).
    """

    batch_id: int
    added: int
    already_stored: int
    quarantined: int
    quarantine_new: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _utc(ts: datetime) -> datetime:
    # Naive datetimes are UTC by the project convention (spec: "naive = UTC").
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def time_conditions(start: datetime | None, end: datetime | None
                    ) -> tuple[list[str], dict[str, datetime]]:
    """SQL conditions and parameters for ``start <= submitted_at < end`` (None: unbounded).

    >>> time_conditions(None, datetime(2026, 1, 2, tzinfo=UTC))[0]
    ['submitted_at < $end']
    """
    conds: list[str] = []
    params: dict[str, datetime] = {}
    if start is not None:
        conds.append("submitted_at >= $start")
        params["start"] = _utc(start)
    if end is not None:
        conds.append("submitted_at < $end")
        params["end"] = _utc(end)
    return conds, params


def read_attempts(con: duckdb.DuckDBPyConnection, source: str, start: datetime | None,
                  end: datetime | None, columns: Sequence[str] | None = None,
                  where: Sequence[str] = ()) -> pa.Table:
    """Attempts of the relation ``source`` with ``start <= submitted_at < end``, ordered by
    time then id and typed as :data:`ATTEMPTS_SCHEMA`: the one query behind
    :meth:`Store.attempts` and :class:`leap.data.export.ParquetAttempts`. ``where`` adds
    conditions (e.g. partition pruning)."""
    cols = list(columns) if columns is not None else list(ATTEMPT_COLUMNS)
    for c in cols:
        if c not in ATTEMPT_COLUMNS:
            raise DataError(f"unknown attempt column '{c}'{did_you_mean(c, ATTEMPT_COLUMNS)}")
    conds, params = time_conditions(start, end)
    conds = [*where, *conds]
    sql = (f"SELECT {', '.join(_ident(c) for c in cols)} FROM {source}"
           + (f" WHERE {' AND '.join(conds)}" if conds else "")
           + " ORDER BY submitted_at, attempt_id")
    table = con.sql(sql, params=params).to_arrow_table()
    schema = pa.schema([ATTEMPTS_SCHEMA.field(c) for c in cols])
    if not table.schema.equals(schema):
        table = table.cast(schema)
    # DuckDB's memory backs the table it returns, a batch of rows at a time, and one column
    # kept (a text column a DataFrame wraps) keeps its batch's every column. One copy into
    # Arrow's own memory lets DuckDB hand its back: on a fleet four times the default,
    # training's attempts then held 0.5 GiB less.
    return table.combine_chunks()


#: Reads of at least this many attempts hand DuckDB's cached memory back at once
#: (:meth:`Store.release_memory`): after a training window of 3.1 million attempts it held
#: 0.9 GiB more than the table it returned, for as long as the store stayed open.
RELEASE_ROWS = 500_000


class Batch:
    """One open write transaction on a :class:`Store` (see :meth:`Store.batch`)."""

    def __init__(self, store: Store, batch_id: int, ingested_at: datetime) -> None:
        self._store = store
        self.batch_id = batch_id
        self.ingested_at = ingested_at

    def record_file(self, path: str, size_bytes: int, mtime_ns: int, rows_read: int) -> None:
        """Remember that the file at ``path`` (this size and modification time) was ingested
        in this batch (see :meth:`Store.ingested_files`)."""
        self._store.con.execute(
            "INSERT OR REPLACE INTO ingested_files VALUES ($p, $s, $m, $r, $b, $t)",
            {"p": path, "s": size_bytes, "m": mtime_ns, "r": rows_read, "b": self.batch_id,
             "t": self.ingested_at})

    def add(self, good: pa.Table, quarantined: pa.Table, *, source: str) -> BatchResult:
        """Insert valid rows not already stored, and quarantined rows not already quarantined.

        Parameters
        ----------
        good : pyarrow.Table
            Validated rows (cast to ``ATTEMPTS_SCHEMA``) with unique ``attempt_id``.
        quarantined : pyarrow.Table
            Rows in :data:`QUARANTINE_SCHEMA`; a null ``source`` becomes ``source``.
        source : str
            Where the rows came from (a file path, or e.g. ``"simulate seed=1"``).

        Returns
        -------
        BatchResult
            Counts of rows added, already stored and quarantined.
        """
        con = self._store.con
        good = conform_attempts(good)
        quarantined = conform_quarantine(quarantined)
        now = self.ingested_at
        con.register("__leap_good", good)
        con.register("__leap_bad", quarantined)
        try:
            # The anti-join below keeps ids unique only if `good` itself has no repeats.
            (dups,) = con.execute("SELECT count(*) - count(DISTINCT attempt_id) FROM "
                                  "__leap_good").fetchall()
            if dups[0]:
                raise DataError(f"{source}: {dups[0]} repeated attempt_id(s) among the rows to "
                                "store; validate them with leap.data.ingest.validate first")
            # Anti-join on the key: re-ingesting the same rows adds nothing.
            (row,) = con.execute(
                f"INSERT INTO attempts ({_COLS_SQL}, batch_id, ingested_at) "
                f"SELECT {_COLS_SQL}, $bid, $now FROM __leap_good g "
                "WHERE NOT EXISTS (SELECT 1 FROM attempts a WHERE a.attempt_id = g.attempt_id)",
                {"bid": self.batch_id, "now": now},
            ).fetchall()
            added = int(row[0])
            (row,) = con.execute(
                "INSERT INTO quarantine SELECT $bid, coalesce(b.source, $src), b.row_number, "
                "b.reason, b.record, $now FROM __leap_bad b WHERE NOT EXISTS (SELECT 1 FROM "
                "quarantine q WHERE q.reason = b.reason AND q.record IS NOT DISTINCT FROM "
                "b.record)",
                {"bid": self.batch_id, "src": source, "now": now},
            ).fetchall()
            quarantine_new = int(row[0])
        finally:
            con.unregister("__leap_good")
            con.unregister("__leap_bad")
        result = BatchResult(batch_id=self.batch_id, added=added,
                             already_stored=good.num_rows - added,
                             quarantined=quarantined.num_rows, quarantine_new=quarantine_new)
        con.execute("INSERT INTO batches VALUES ($bid, $src, $now, $n, $a, $s, $q)",
                    {"bid": self.batch_id, "src": source, "now": now,
                     "n": good.num_rows + quarantined.num_rows, "a": result.added,
                     "s": result.already_stored, "q": result.quarantined})
        return result


class Store:
    """The attempt store: a DuckDB file with tables ``attempts``, ``quarantine``, ``batches``
    and ``meta``.

    Table ``attempts`` has the columns of :data:`leap.data.schema.ATTEMPTS_SCHEMA` in order,
    then ``batch_id`` and ``ingested_at``. ``submitted_at`` is ``TIMESTAMPTZ`` and the
    connection's time zone is UTC. Only one process may hold a store open for writing.

    Parameters
    ----------
    path : Path
        The DuckDB file; created (with its parent directories) unless ``read_only``.
    read_only : bool
        Open without taking the write lock; the file must exist.

    Examples
    --------
    >>> import tempfile
    >>> with Store(Path(tempfile.mkdtemp()) / "leap.duckdb") as store:
    ...     store.count()
    0
    """

    con: duckdb.DuckDBPyConnection

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.exists():
            raise DataError(f"no attempt store at {self.path}; ingest attempts first "
                            "(leap ingest FILE, or leap simulate)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            msg = str(exc).splitlines()[0]
            if "lock" in msg.lower():
                raise DataError(f"attempt store {self.path} is in use by another leap process; "
                                f"wait for it to finish ({msg})") from None
            raise DataError(f"cannot open attempt store {self.path}: {msg}") from None
        try:
            # TIMESTAMPTZ values come back as UTC, whatever the machine's zone is.
            self.con.execute("SET TimeZone = 'UTC'")
            if read_only:
                self._check_schema()
            else:
                self._create_schema()
        except BaseException:
            self.con.close()
            raise

    # Life cycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (a no-op when already closed)."""
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _create_schema(self) -> None:
        self.con.begin()
        try:
            for ddl in _DDL:
                self.con.execute(ddl)
            self.con.execute("INSERT INTO meta VALUES ('store_schema_version', $v) "
                             "ON CONFLICT DO NOTHING", {"v": STORE_SCHEMA_VERSION})
            self.con.commit()
        except BaseException:
            self.con.rollback()
            raise
        self._check_schema()

    def _check_schema(self) -> None:
        tables = {r[0] for r in self.con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        if not {"attempts", "quarantine", "batches", "meta"} <= tables:
            raise DataError(f"{self.path} is not a leap attempt store (tables found: "
                            f"{', '.join(sorted(tables)) or 'none'}); use another workspace")
        version = self.get_meta("store_schema_version")
        cols = [r[0] for r in self.con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'attempts' "
            "ORDER BY ordinal_position").fetchall()]
        if version != STORE_SCHEMA_VERSION or tuple(cols[:len(ATTEMPT_COLUMNS)]) != \
                ATTEMPT_COLUMNS:
            raise DataError(f"attempt store {self.path} has layout version {version}, this "
                            f"leap needs {STORE_SCHEMA_VERSION}; re-ingest into a new workspace")

    def _writable(self) -> None:
        if self.read_only:
            raise DataError(f"attempt store {self.path} is open read-only; open it with "
                            "read_only=False to write")

    # Writing ------------------------------------------------------------------------------
    @contextmanager
    def batch(self) -> Iterator[Batch]:
        """One atomic write: everything added inside commits together or not at all.

        An exception (or a killed process) inside the block leaves the store as before.

        Examples
        --------
        >>> import tempfile
        >>> from leap.data.schema import ATTEMPTS_SCHEMA, QUARANTINE_SCHEMA
        >>> with Store(Path(tempfile.mkdtemp()) / "s.duckdb") as store:
        ...     with store.batch() as b:
        ...         r = b.add(ATTEMPTS_SCHEMA.empty_table(), QUARANTINE_SCHEMA.empty_table(),
        ...                   source="nothing")
        ...     r.added
        0
        """
        self._writable()
        self.con.begin()
        try:
            (row,) = self.con.execute(
                "SELECT coalesce(max(batch_id), 0) + 1 FROM batches").fetchall()
            batch = Batch(self, int(row[0]), datetime.now(UTC))
            yield batch
            self.con.commit()
        except BaseException:
            self.con.rollback()
            raise

    def add_batch(self, good: pa.Table, quarantined: pa.Table, *, source: str) -> BatchResult:
        """Add validated and quarantined rows in ONE transaction.

        Rows of ``good`` whose ``attempt_id`` is already stored are skipped and counted as
        ``already_stored``. See :meth:`Batch.add` for the parameters.

        Examples
        --------
        >>> import tempfile
        >>> from leap.data.schema import ATTEMPTS_SCHEMA, QUARANTINE_SCHEMA
        >>> with Store(Path(tempfile.mkdtemp()) / "s.duckdb") as store:
        ...     store.add_batch(ATTEMPTS_SCHEMA.empty_table(), QUARANTINE_SCHEMA.empty_table(),
        ...                     source="x").added
        0
        """
        with self.batch() as b:
            return b.add(good, quarantined, source=source)

    def set_meta(self, key: str, value: str) -> None:
        """Record a small key/value pair (e.g. the simulator's scenario and seed)."""
        self._writable()
        self.con.execute("INSERT OR REPLACE INTO meta VALUES ($k, $v)", {"k": key, "v": value})

    def get_meta(self, key: str) -> str | None:
        """The value recorded under ``key``, or None."""
        rows = self.con.execute("SELECT value FROM meta WHERE key = $k", {"k": key}).fetchall()
        return str(rows[0][0]) if rows else None

    # Reading ------------------------------------------------------------------------------
    def ingested_files(self) -> dict[str, tuple[int, int]]:
        """Files ingested so far: absolute path -> (size in bytes, modification time in ns)."""
        tables = {r[0] for r in self.con.execute(
            "SELECT table_name FROM information_schema.tables").fetchall()}
        if "ingested_files" not in tables:  # a store from before the table, opened read-only
            return {}
        return {str(p): (int(s), int(m)) for p, s, m in self.con.execute(
            "SELECT path, size_bytes, mtime_ns FROM ingested_files").fetchall()}

    def count(self) -> int:
        """Number of stored attempts."""
        (row,) = self.con.execute("SELECT count(*) FROM attempts").fetchall()
        return int(row[0])

    def quarantine_count(self) -> int:
        """Number of rows in the quarantine table."""
        (row,) = self.con.execute("SELECT count(*) FROM quarantine").fetchall()
        return int(row[0])

    def time_range(self, until: datetime | None = None) -> tuple[datetime, datetime] | None:
        """First and last ``submitted_at`` (UTC-aware), or None for an empty store.

        With ``until``, only attempts submitted at or before it count (a row from the future
        must not move the last day).
        """
        where, params = ("", []) if until is None else (" WHERE submitted_at <= ?",
                                                        [_utc(until)])
        (row,) = self.con.execute("SELECT min(submitted_at), max(submitted_at) FROM attempts"
                                  + where, params).fetchall()
        if row[0] is None:
            return None
        return _utc(row[0]), _utc(row[1])

    def attempts(self, start: datetime | None = None, end: datetime | None = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
        """Stored attempts with ``start <= submitted_at < end``, ordered by time then id.

        Parameters
        ----------
        start, end : datetime, optional
            Window bounds (naive means UTC); None leaves that side open.
        columns : sequence of str, optional
            Subset of ``ATTEMPTS_SCHEMA`` columns, in the order wanted; default all.

        Returns
        -------
        pyarrow.Table
            Typed as the matching fields of ``ATTEMPTS_SCHEMA``.

        Examples
        --------
        >>> import tempfile
        >>> with Store(Path(tempfile.mkdtemp()) / "s.duckdb") as store:
        ...     store.attempts(columns=["attempt_id", "throughput"]).column_names
        ['attempt_id', 'throughput']
        """
        table = read_attempts(self.con, "attempts", start, end, columns)
        if table.num_rows >= RELEASE_ROWS:
            self.release_memory()
        return table

    def release_memory(self) -> None:
        """Hand back what DuckDB keeps after a query: the table blocks it cached and its
        allocator's free memory, up to its memory limit (80% of RAM) otherwise. Lowering the
        limit for a moment evicts and flushes them; the limit is then reset (leap never
        sets it)."""
        self.con.execute("SET memory_limit = '32MB'")
        self.con.execute("RESET memory_limit")

    def quarantined(self, limit: int | None = None) -> pa.Table:
        """Quarantined rows, newest batch first: batch_id, source, row_number, reason, record."""
        sql = ("SELECT batch_id, source, row_number, reason, record, quarantined_at "
               "FROM quarantine ORDER BY batch_id DESC, source, row_number")
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return self.con.sql(sql).to_arrow_table()

    def stats(self) -> dict[str, Any]:
        """A JSON-ready summary of the store: what ``leap stats --json`` prints.

        Keys: ``path``, ``attempts``, ``first_submitted_at``, ``last_submitted_at``,
        ``days``, ``per_day`` (list of ``{"date", "attempts"}``), ``per_hardware``,
        ``per_status`` (every status, zeros included), ``succeeded_share``, ``families``,
        ``model_types``, ``quarantined``, ``quarantine_reasons`` (top 20), ``batches``,
        ``last_ingested_at``.
        """
        q = self.con.execute
        (row,) = q("SELECT count(*), min(submitted_at), max(submitted_at), "
                "count(DISTINCT family_id), count(DISTINCT model_type), "
                "count(DISTINCT CAST(submitted_at AS DATE)), max(ingested_at) "
                "FROM attempts").fetchall()
        n, first, last, families, model_types, days, last_ingest = row
        per_day = [{"date": d.isoformat(), "attempts": int(c)} for d, c in q(
            "SELECT CAST(submitted_at AS DATE) AS d, count(*) FROM attempts "
            "GROUP BY d ORDER BY d").fetchall()]
        per_hw = {str(h): int(c) for h, c in q(
            "SELECT hardware, count(*) AS c FROM attempts GROUP BY hardware "
            "ORDER BY c DESC, hardware").fetchall()}
        per_status = dict.fromkeys(STATUSES, 0)
        per_status.update({str(s): int(c) for s, c in q(
            "SELECT status, count(*) FROM attempts GROUP BY status").fetchall()})
        (qrow,) = q("SELECT count(*) FROM quarantine").fetchall()
        reasons = {str(r): int(c) for r, c in q(
            "SELECT reason, count(*) AS c FROM quarantine GROUP BY reason "
            "ORDER BY c DESC, reason LIMIT 20").fetchall()}
        (brow,) = q("SELECT count(DISTINCT batch_id) FROM batches").fetchall()
        return {
            "path": str(self.path),
            "attempts": int(n),
            "first_submitted_at": _utc(first).isoformat() if first else None,
            "last_submitted_at": _utc(last).isoformat() if last else None,
            "days": int(days),
            "per_day": per_day,
            "per_hardware": per_hw,
            "per_status": per_status,
            "succeeded_share": (per_status["succeeded"] / n) if n else None,
            "families": int(families),
            "model_types": int(model_types),
            "quarantined": int(qrow[0]),
            "quarantine_reasons": reasons,
            "batches": int(brow[0]),
            "last_ingested_at": _utc(last_ingest).isoformat() if last_ingest else None,
        }
