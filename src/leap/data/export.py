"""The store's attempts as a Parquet export, one directory a day, and reading them back.

A run over several machines (``leap train --dask``) cannot share the store: a DuckDB file
lives on one machine and admits one writer. The store is exported once, to a directory every
worker reaches (a shared file system), in the Hive layout ``date=YYYY-MM-DD/data_0.parquet``;
each worker then reads just the days it needs with DuckDB through :class:`ParquetAttempts`,
which answers :meth:`~ParquetAttempts.attempts` exactly as :meth:`Store.attempts` does (same
rows, order and types), so features built from either are the same.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa

from leap.data.schema import ATTEMPTS_SCHEMA
from leap.data.store import (
    ATTEMPT_COLUMNS,
    Store,
    _ident,
    _utc,
    read_attempts,
    time_conditions,
)
from leap.errors import DataError

#: Written last into an export directory; an export is complete only when it is there.
MARKER = "_leap_export.json"


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    rows: int
    days: int
    start: datetime | None
    end: datetime | None


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def export_parquet(store: Store, directory: Path, start: datetime | None = None,
                   end: datetime | None = None) -> ExportResult:
    """Write the attempts with ``start <= submitted_at < end`` to ``directory``.

    ``directory`` must be empty, absent, or an earlier export (which is replaced whole); any
    other content is refused rather than deleted.

    >>> import tempfile
    >>> tmp = Path(tempfile.mkdtemp())
    >>> with Store(tmp / "s.duckdb") as store:
    ...     export_parquet(store, tmp / "export").rows
    0
    """
    directory = Path(directory)
    if directory.exists():
        if not directory.is_dir():
            raise DataError(f"{directory}: export target is a file, not a directory")
        if any(directory.iterdir()) and not (directory / MARKER).exists():
            raise DataError(f"{directory}: not empty and not a leap export; choose an empty "
                            "directory (nothing in it is deleted)")
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    conds, params = time_conditions(start, end)
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    cols = ", ".join(_ident(c) for c in ATTEMPT_COLUMNS)
    (rows, days), = store.con.execute(
        f"SELECT count(*), count(DISTINCT CAST(submitted_at AS DATE)) FROM attempts{where}",
        params).fetchall()
    if rows:
        store.con.execute(
            f"COPY (SELECT {cols}, strftime(submitted_at, '%Y-%m-%d') AS date FROM attempts"
            f"{where} ORDER BY submitted_at, attempt_id) TO {_sql_str(str(directory))} "
            "(FORMAT PARQUET, PARTITION_BY (date), OVERWRITE_OR_IGNORE)", params)
    (directory / MARKER).write_text(json.dumps({
        "rows": int(rows), "days": int(days),
        "start": _utc(start).isoformat() if start else None,
        "end": _utc(end).isoformat() if end else None}))
    return ExportResult(directory, int(rows), int(days), start, end)


class ParquetAttempts:
    """Attempts read from an export (:func:`export_parquet`), as the store would give them.

    Only the day directories a query needs are opened.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        if not (self.directory / MARKER).exists():
            raise DataError(f"{self.directory}: not a complete leap export (no {MARKER}); "
                            "export the store first")

    def attempts(self, start: datetime | None = None, end: datetime | None = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
        """Attempts with ``start <= submitted_at < end``, ordered by time then id."""
        files = sorted(str(p) for p in self.directory.glob("date=*/*.parquet")
                       if _day_in(p.parent.name[5:], start, end))
        if not files:
            cols = list(columns) if columns is not None else list(ATTEMPT_COLUMNS)
            return pa.schema([ATTEMPTS_SCHEMA.field(c) for c in cols]).empty_table()
        with duckdb.connect() as con:
            con.execute("SET TimeZone = 'UTC'")
            source = f"read_parquet([{', '.join(_sql_str(f) for f in files)}])"
            return read_attempts(con, source, start, end, columns)


def _day_in(day: str, start: datetime | None, end: datetime | None) -> bool:
    """Whether the UTC day ``YYYY-MM-DD`` can hold attempts of ``[start, end)``."""
    try:
        d = datetime.fromisoformat(day).replace(tzinfo=UTC)
    except ValueError:
        return False
    return (start is None or d + timedelta(days=1) > _utc(start)) and (
        end is None or d < _utc(end))
