"""Reading attempt files: the one file-format rule (by name ending), text checks with
messages that point at the bad line, and the CSV, Parquet and JSON Lines readers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from leap.data.schema import (
    ALL_COLUMNS,
    REQUIRED,
)
from leap.errors import DataError, did_you_mean

#: File name endings of attempt and job files (:func:`read_attempts_file`,
#: :func:`leap.model.predict.read_jobs`), and the format each one means (``.json`` is read as
#: JSON Lines, one object a line).
FORMATS: dict[str, str] = {
    ".csv": "csv", ".csv.gz": "csv",
    ".parquet": "parquet", ".pq": "parquet",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".jsonl.gz": "jsonl",
    ".ndjson.gz": "jsonl", ".json.gz": "jsonl",
}


_ENGINE: dict[int, duckdb.DuckDBPyConnection] = {}


def cursor() -> duckdb.DuckDBPyConnection:
    """A fresh connection to a private in-memory DuckDB, kept for the life of the process.

    Opening a database costs ~50-90 ms and a cursor ~1 ms; the simulator validates a day at a
    time, so the saving matters. Keyed by pid so a forked child never shares its parent's.
    """
    pid = os.getpid()
    if pid not in _ENGINE:
        _ENGINE.clear()
        _ENGINE[pid] = duckdb.connect(":memory:")
    con = _ENGINE[pid].cursor()
    # Text timestamps without an offset are UTC; typed results come back in UTC.
    con.execute("SET TimeZone = 'UTC'")
    return con


# Reading ----------------------------------------------------------------------------------
def file_format(path: Path) -> str:
    """The format of ``path`` from its name: ``"csv"``, ``"parquet"`` or ``"jsonl"``.

    Raises
    ------
    DataError
        For any other ending.

    Examples
    --------
    >>> file_format(Path("day1.csv.gz"))
    'csv'
    """
    name = path.name.lower()
    for ending in sorted(FORMATS, key=len, reverse=True):
        if name.endswith(ending):
            return FORMATS[ending]
    raise DataError(f"{path}: unsupported file type; name it {', '.join(FORMATS)} to say "
                    "which format it is (.jsonl, .ndjson, .json: JSON Lines)")


def _skip(_row: Any) -> str:
    return "skip"


def printable(text: str, limit: int = 200) -> str:
    """``text`` safe to show on a terminal: control characters and undecodable bytes as '?'."""
    out = "".join(ch if ch.isprintable() and ch != "\ufffd" else "?" for ch in text[:limit])
    return out + ("..." if len(text) > limit else "")


def check_text_file(path: Path, what: str) -> None:
    """Refuse a file that is not UTF-8 text (binary data named ``.csv``, say) in one line.

    Streams the whole file (decompressing ``.gz``) through an incremental UTF-8 decoder, so
    the parser never sees bytes it would echo to the terminal.

    Raises
    ------
    DataError
        Naming the file, the byte offset and the fix; never the bytes themselves.
    """
    import codecs
    import gzip

    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            while chunk := f.read(1 << 20):
                if b"\x00" in chunk:
                    at = offset + chunk.index(b"\x00")
                    raise DataError(f"{path}: not a {what} text file (a NUL byte at byte {at:,}: "
                                    "binary data); export it as UTF-8 text")
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as exc:
                    raise DataError(f"{path}: not a {what} text file (invalid UTF-8 near byte "
                                    f"{offset + exc.start:,}); export it as UTF-8 text") from None
                offset += len(chunk)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a {what} text file (it ends inside a UTF-8 character); "
                        "export it as UTF-8 text") from None
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read: {printable(str(exc))}") from None


def _read_csv(path: Path) -> pa.Table:
    shown: list[str] = []
    count = [0]

    def on_invalid_row(row: Any) -> str:
        count[0] += 1
        if len(shown) < 3:  # describe the first few, count them all
            where = f"line {row.number}" if row.number is not None else "a line"
            shown.append(f"{where} has {row.actual_columns} fields, the header "
                         f"{row.expected_columns} ({printable(row.text, 60)!r})")
        return "skip"

    # The header first: every column is then read as text. Typing happens per row in
    # validate(), so one bad cell quarantines its row instead of failing the whole file (as
    # pyarrow's type inference would when a later block disagrees with the first).
    with pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 16),
                        parse_options=pacsv.ParseOptions(invalid_row_handler=_skip)) as head:
        names = head.schema.names
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(use_threads=False),
        parse_options=pacsv.ParseOptions(invalid_row_handler=on_invalid_row),
        # Only the empty cell is null: 'NA' could be a real id, 'nan' is a bad throughput.
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=True, null_values=[""], quoted_strings_can_be_null=True),
    )
    if count[0]:
        raise DataError(f"{path}: {count[0]} malformed CSV line(s) with the wrong number of "
                        f"fields: {'; '.join(shown)}; fix or remove them and ingest again")
    return table


def _read_jsonl(path: Path) -> pa.Table:
    # Each line as a JSON object, then every known field as text (->>), so a field whose type
    # changes from line to line is a per-row problem, not a failed read.
    con = cursor()
    try:
        src = f"read_ndjson_objects('{str(path).replace(chr(39), chr(39) * 2)}')"
        keys = [r[0] for r in con.execute(
            f"SELECT DISTINCT unnest(json_keys(json)) FROM {src}").fetchall()]
        present = [c for c in ALL_COLUMNS if c in keys]
        unknown = sorted(k for k in keys if k not in ALL_COLUMNS)
        if not keys:
            return pa.table({})
        cols = [f"json ->> '$.{c}' AS \"{c}\"" for c in present]
        # Unknown fields are reported, not read: null columns keep their names for the report.
        cols += [f"NULL::VARCHAR AS \"{k.replace(chr(34), chr(34) * 2)}\"" for k in unknown]
        table = con.sql(f"SELECT {', '.join(cols)} FROM {src}").to_arrow_table()
    finally:
        con.close()
    return table


def read_attempts_file(path: Path) -> pa.Table:
    """Read an attempts file (CSV, Parquet or JSON Lines, by name) as an Arrow table.

    CSV and JSON Lines columns come back as text (typed later, per row, by :func:`validate`);
    Parquet keeps its types. Extra columns are kept (``validate`` reports them).

    Parameters
    ----------
    path : Path
        ``.csv``, ``.csv.gz``, ``.parquet``/``.pq``, ``.jsonl``/``.ndjson`` (optionally ``.gz``).

    Returns
    -------
    pyarrow.Table

    Raises
    ------
    DataError
        When the file is missing or unreadable, not in the format its name says, has
        malformed lines, a repeated column name, or lacks a required column.

    Examples
    --------
    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "a.csv"
    >>> _ = p.write_text("attempt_id,family_id\\n1,f\\n")
    >>> read_attempts_file(p)
    Traceback (most recent call last):
    ...
    leap.errors.DataError: ...a.csv: missing required column(s) 'model_type', ...
    """
    path = Path(path)
    fmt = file_format(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if fmt in ("csv", "jsonl"):
        check_text_file(path, {"csv": "CSV", "jsonl": "JSON Lines"}[fmt])
    try:
        if fmt == "csv":
            table = _read_csv(path)
        elif fmt == "parquet":
            table = pq.read_table(path)
        else:
            table = _read_jsonl(path)
    except (pa.ArrowException, OSError, duckdb.Error, UnicodeDecodeError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = {"csv": "CSV", "parquet": "Parquet", "jsonl": "JSON Lines"}[fmt]
        raise DataError(f"{path}: cannot read as {what}: {printable(detail)}") from None
    check_columns(table, origin=str(path))
    return table


def check_columns(table: pa.Table, *, origin: str) -> None:
    """Refuse a table with a repeated column name or without every required column.

    Raises
    ------
    DataError
        Naming ``origin``, the missing columns and, for near misses, the likely intended name.
    """
    names = table.column_names
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise DataError(f"{origin}: column '{n}' appears more than once; keep one")
        seen.add(n)
    missing = [c for c in REQUIRED if c not in seen]
    if missing:
        extra = [n for n in names if n not in ALL_COLUMNS]
        hints = "".join(did_you_mean(m, extra).replace("; did you mean", f"; for '{m}' did "
                                                        "you mean") for m in missing)
        raise DataError(
            f"{origin}: missing required column(s) {', '.join(repr(m) for m in missing)}"
            f"{hints}; an attempts file needs {', '.join(REQUIRED)}")
