"""Read attempt files (CSV, Parquet, JSON Lines), validate each row with a reason, store them."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from leap.catalog import Catalog
from leap.data.schema import (
    ALL_COLUMNS,
    ATTEMPTS_SCHEMA,
    MAX_BATCH_SIZE,
    MAX_COUNT,
    PRECISIONS,
    REQUIRED,
    STATUSES,
)
from leap.data.store import QUARANTINE_SCHEMA, Store
from leap.errors import ConfigError, DataError, did_you_mean

#: File name endings read by :func:`read_attempts_file`, and the format each one means.
FORMATS: dict[str, str] = {
    ".csv": "csv", ".csv.gz": "csv",
    ".parquet": "parquet", ".pq": "parquet",
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".jsonl.gz": "jsonl", ".ndjson.gz": "jsonl",
}

#: Optional numeric columns and the smallest value each may take.
OPTIONAL_MINIMUM: dict[str, int] = {
    "num_params": 0, "flops_per_sample": 0, "embedding_params": 0, "num_layers": 0,
    "hidden_dim": 0, "seq_len": 0, "num_dense_features": 0, "num_sparse_features": 0,
    "duration_hours": 0, "devices_per_trainer": 1, "data_parallel": 1, "tensor_parallel": 1,
    "pipeline_parallel": 1,
}

#: Count columns held to :attr:`IngestLimits.max_count`.
COUNT_COLUMNS: tuple[str, ...] = ("trainer_count", "devices_per_trainer", "data_parallel",
                                  "tensor_parallel", "pipeline_parallel")


@dataclass(frozen=True)
class IngestLimits:
    """Plausibility rules: rows that break them are quarantined with the rule as reason.

    Built at the edge (``leap ingest`` options) and passed down; the defaults hold for any
    real fleet.

    Attributes
    ----------
    earliest : datetime
        ``submitted_at`` before it is implausible (default 2000-01-01 UTC).
    now : datetime, optional
        The wall clock of the ingest; with it, ``submitted_at`` after ``now + max_future``
        is implausible. ``None`` (a simulation, a replay) checks no upper bound.
    max_future : timedelta
        Clock skew allowed past ``now`` (default 1 day).
    max_throughput : float
        Absolute ceiling on samples/s of one attempt (default 1e11).
    max_utilization : float
        Ceiling on the model-FLOP utilization a throughput implies when
        ``flops_per_sample`` is known: ``throughput x flops_per_sample / (devices x peak
        FLOP/s)``, with the type's largest catalog peak (default 10: far above any real
        run, and loose enough for rough FLOP counts: the reference fleet's own attempts reach
        5x with the FLOP counts its jobs report, so 2x would quarantine real rows).
    max_count : int
        Largest ``trainer_count``, ``devices_per_trainer`` and parallel degree.
    max_batch_size : int
        Largest per-trainer ``batch_size``.

    Examples
    --------
    >>> IngestLimits(now=datetime(2026, 2, 1, tzinfo=UTC)).latest
    datetime.datetime(2026, 2, 2, 0, 0, tzinfo=datetime.timezone.utc)
    """

    earliest: datetime = datetime(2000, 1, 1, tzinfo=UTC)
    now: datetime | None = None
    max_future: timedelta = timedelta(days=1)
    max_throughput: float = 1e11
    max_utilization: float = 10.0
    max_count: int = MAX_COUNT
    max_batch_size: int = MAX_BATCH_SIZE

    def __post_init__(self) -> None:
        for name in ("earliest", "now"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, datetime) or v.tzinfo is None):
                raise ConfigError(f"IngestLimits.{name} must be a UTC-aware datetime, got {v!r}")
        for name in ("max_throughput", "max_utilization", "max_count", "max_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    0 < v < math.inf):
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        if self.max_future < timedelta(0):
            raise ConfigError(f"max_future must not be negative, got {self.max_future}")

    @property
    def latest(self) -> datetime | None:
        """The latest plausible ``submitted_at`` (None: no upper bound)."""
        return None if self.now is None else self.now + self.max_future


#: Beyond this many distinct unknown names in one input, the rest get no did-you-mean hint
#: (difflib per name would dominate the run time on a pathological file).
_MAX_SUGGESTIONS = 2000
_ROW = "__leap_row"
_EXAMPLE_TS = "2024-05-01T12:00:00Z"
_KIND = {pa.string(): "a string", pa.int64(): "an integer", pa.float64(): "a number",
         pa.timestamp("us", tz="UTC"): f"an ISO-8601 timestamp such as {_EXAMPLE_TS} "
                                       "(no offset means UTC)"}


_ENGINE: dict[int, duckdb.DuckDBPyConnection] = {}


def _cursor() -> duckdb.DuckDBPyConnection:
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
    raise DataError(f"{path}: unsupported file type; name it .csv, .csv.gz, .parquet, .pq, "
                    ".jsonl or .ndjson (JSON Lines) to say which format it is")


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
    con = _cursor()
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


# Validation -------------------------------------------------------------------------------
def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _typed(col: str, source: pa.DataType, target: pa.DataType) -> tuple[str, str, str]:
    """SQL for (typed value, is-missing, is-ill-typed) of raw column ``col``."""
    r = f"raw.{_q(col)}"
    text = f"NULLIF(trim(CAST({r} AS VARCHAR)), '')"
    numeric = pa.types.is_integer(source) or pa.types.is_floating(source) or \
        pa.types.is_decimal(source)
    if target == pa.string():
        val = f"lower({text})" if col in ("status", "precision") else text
        return val, f"({text}) IS NULL", "FALSE"
    if target == pa.int64():
        if pa.types.is_integer(source):
            val = f"TRY_CAST({r} AS BIGINT)"
            return val, f"{r} IS NULL", f"({r} IS NOT NULL AND {val} IS NULL)"
        # Whole numbers written as 4.0 or "4" are fine; 4.5, "four" and NaN are not.
        d = f"CAST({r} AS DOUBLE)" if numeric else f"TRY_CAST({text} AS DOUBLE)"
        ok = f"coalesce(isfinite({d}) AND {d} = round({d}) AND abs({d}) < 9e15, FALSE)"
        present = f"{r} IS NOT NULL" if numeric else f"({text}) IS NOT NULL"
        return (f"CASE WHEN {ok} THEN CAST({d} AS BIGINT) END", f"NOT ({present})",
                f"({present} AND NOT {ok})")
    if target == pa.float64():
        if numeric:
            return f"CAST({r} AS DOUBLE)", f"{r} IS NULL", "FALSE"
        val = f"TRY_CAST({text} AS DOUBLE)"
        return val, f"({text}) IS NULL", f"(({text}) IS NOT NULL AND {val} IS NULL)"
    # Timestamps: ISO-8601 text (Z, an offset, or none meaning UTC) or a typed timestamp/date.
    if pa.types.is_timestamp(source) or pa.types.is_date(source):
        return f"CAST({r} AS TIMESTAMPTZ)", f"{r} IS NULL", "FALSE"
    if numeric or pa.types.is_boolean(source):
        return "NULL::TIMESTAMPTZ", f"{r} IS NULL", f"{r} IS NOT NULL"
    val = f"TRY_CAST({text} AS TIMESTAMPTZ)"
    return val, f"({text}) IS NULL", f"(({text}) IS NOT NULL AND {val} IS NULL)"


def _name_check(con: duckdb.DuckDBPyConnection, col: str, expr: str, known: Sequence[str],
                what: str, fix: str) -> tuple[str, str]:
    """SQL (condition, message) for a value of ``col`` that is not one of ``known``.

    Suggestions are computed in Python for the distinct unknown values only (a handful, not
    one per row) and inlined as a CASE; the SQL stays a projection, so row order is kept.
    """
    values = [r[0] for r in con.execute(
        f"SELECT DISTINCT {expr} AS v FROM (SELECT DISTINCT raw.{_q(col)} FROM raw) raw "
        "WHERE v IS NOT NULL").fetchall()]
    known_set = set(known)
    hints: list[tuple[str, str]] = []
    for v in sorted(str(v) for v in values if v not in known_set)[:_MAX_SUGGESTIONS]:
        hint = did_you_mean(v, known)
        if hint:  # "unknown hardware 'H10O'; did you mean 'H100-SXM'? Fix the name or ..."
            hints.append((v, f"{what} '{v}'{hint} {fix[0].upper()}{fix[1:]}"))
    t = f"t.{_q(col)}"
    generic = f"{_lit(what + ' ' + chr(39))} || {t} || {_lit(chr(39) + '; ' + fix)}"
    message = generic if not hints else (
        f"CASE {t} " + " ".join(f"WHEN {_lit(v)} THEN {_lit(m)}" for v, m in hints)
        + f" ELSE {generic} END")
    if not known:  # e.g. a user catalog that disables every type
        return "TRUE", message
    return f"{t} NOT IN ({', '.join(_lit(k) for k in known)})", message


@dataclass
class Validated:
    """The outcome of :func:`validate`.

    Attributes
    ----------
    good : pyarrow.Table
        Valid rows cast to ``ATTEMPTS_SCHEMA`` (absent optional columns are null), input order,
        unique ``attempt_id``.
    quarantined : pyarrow.Table
        Invalid rows in :data:`leap.data.store.QUARANTINE_SCHEMA`: source, 1-based row number
        (header excluded), reason, the original values as JSON text.
    unknown_columns : list of str
        Input columns that are not in the schema (ignored).
    reasons : dict
        Reason -> number of rows quarantined for it, most frequent first.
    """

    good: pa.Table
    quarantined: pa.Table
    unknown_columns: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)


def validate(table: pa.Table, catalog: Catalog, *, origin: str,
             limits: IngestLimits | None = None) -> Validated:
    """Check every row of ``table`` against the attempt schema, with one reason per bad row.

    Checks, in this order (a row's reason is the first that fails): each required field
    present and of its type; hardware in ``catalog``; ``trainer_count`` and ``batch_size``
    >= 1; status one of ``STATUSES`` (case-insensitive); throughput finite and > 0 on a
    succeeded attempt and empty otherwise; optional fields of their type and range,
    ``precision`` one of ``PRECISIONS``; the plausibility rules of ``limits`` (submitted_at
    within [earliest, now + max_future], counts and batch size within their maxima,
    throughput below the absolute ceiling and, with ``flops_per_sample``, an implied
    utilization below ``max_utilization``); then a repeated ``attempt_id`` (the first valid
    row is kept). Vectorised in DuckDB over the Arrow table.

    Parameters
    ----------
    table : pyarrow.Table
        Raw rows, any column types (text is parsed); must have every required column.
    catalog : Catalog
        Known hardware names.
    origin : str
        Where the rows came from, recorded with each quarantined row.
    limits : IngestLimits, optional
        Plausibility rules (default :class:`IngestLimits`: no upper bound on time).

    Returns
    -------
    Validated

    Raises
    ------
    DataError
        If a required column is missing or a column name repeats.

    Examples
    --------
    >>> from leap.catalog import Catalog
    >>> rows = pa.table({"attempt_id": ["a1"], "family_id": ["f"], "model_type": ["m"],
    ...     "submitted_at": ["2024-05-01T12:00:00Z"], "hardware": ["H100-SXN"],
    ...     "trainer_count": ["2"], "batch_size": ["64"], "status": ["succeeded"],
    ...     "throughput": ["1500.5"]})
    >>> v = validate(rows, Catalog.default(), origin="example")
    >>> v.good.num_rows, list(v.reasons)
    (0, ["unknown hardware 'H100-SXN'; did you mean 'H100-SXM'? Fix the name or add it to your catalog TOML"])
    """  # noqa: E501
    check_columns(table, origin=origin)
    unknown = [c for c in table.column_names if c not in ALL_COLUMNS]
    present = [c for c in ALL_COLUMNS if c in table.column_names]
    raw = table.select(present).append_column(
        _ROW, pa.array(np.arange(1, table.num_rows + 1, dtype=np.int64)))
    con = _cursor()
    try:
        con.register("raw", raw)
        return _validate_sql(con, raw, catalog, origin, present, unknown,
                             limits or IngestLimits())
    finally:
        con.close()


def _plausibility(catalog: Catalog, limits: IngestLimits, present: list[str]
                  ) -> list[tuple[str, str]]:
    """SQL (condition, message) pairs of the plausibility rules (see :class:`IngestLimits`)."""
    def ts(d: datetime) -> str:
        return f"TIMESTAMPTZ {_lit(d.astimezone(UTC).isoformat())}"

    cases = [(f"t.submitted_at < {ts(limits.earliest)}",
              _lit(f"implausible submitted_at: before {limits.earliest:%Y-%m-%d} (the earliest "
                   "accepted; leap ingest --earliest)"))]
    if limits.latest is not None:
        cases.append((f"t.submitted_at > {ts(limits.latest)}",
                      _lit(f"implausible submitted_at: in the future (after "
                           f"{limits.latest:%Y-%m-%dT%H:%MZ}, the ingest time plus "
                           f"{limits.max_future.total_seconds() / 3600:g} h); fix the clock "
                           "or the time zone")))
    for c in COUNT_COLUMNS:
        if c in present:
            cases.append((f"t.{_q(c)} > {int(limits.max_count)}",
                          _lit(f"implausible {c}: more than {int(limits.max_count):,} "
                               "(leap ingest --max-count)")))
    cases.append((f"t.batch_size > {int(limits.max_batch_size)}",
                   _lit(f"implausible batch_size: more than {int(limits.max_batch_size):,} "
                        "(leap ingest --max-batch-size)")))
    cases.append((f"t.throughput > {float(limits.max_throughput)!r}",
                  _lit(f"implausible throughput: above {limits.max_throughput:g} samples/s "
                       "(leap ingest --max-throughput)")))
    peaks = {n: max(h.peak_bf16_tflops, h.peak_fp32_tflops) * 1e12 for n, h in catalog.items()
             if max(h.peak_bf16_tflops, h.peak_fp32_tflops) > 0}
    if "flops_per_sample" in present and peaks:
        peak = "CASE t.hardware " + " ".join(
            f"WHEN {_lit(n)} THEN {p!r}" for n, p in peaks.items()) + " END"
        devices = "(t.trainer_count * coalesce(t.devices_per_trainer, 1))" \
            if "devices_per_trainer" in present else "t.trainer_count"
        mfu = f"(t.throughput * t.flops_per_sample / ({devices} * {peak}))"
        cases.append((f"t.flops_per_sample > 0 AND {mfu} > {float(limits.max_utilization)!r}",
                      f"'implausible throughput: it implies ' || printf('%.3g', {mfu}) || "
                      f"'x the peak FLOP/s of ' || t.hardware || {_lit(' (more than ')} || "
                      f"{_lit(f'{limits.max_utilization:g}')} || "
                      f"{_lit('x; check throughput and flops_per_sample, or leap ingest ')} || "
                      "'--max-utilization)'"))
    return cases


def _validate_sql(con: duckdb.DuckDBPyConnection, raw: pa.Table, catalog: Catalog, origin: str,
                  present: list[str], unknown: list[str], limits: IngestLimits) -> Validated:
    typed = {c: _typed(c, raw.schema.field(c).type, ALL_COLUMNS[c]) for c in present}
    hw_check = _name_check(con, "hardware", typed["hardware"][0], list(catalog),
                           "unknown hardware", "fix the name or add it to your catalog TOML")
    st_check = _name_check(con, "status", typed["status"][0], STATUSES, "unknown status",
                           f"status must be one of {', '.join(STATUSES)}")

    select = [_ROW]
    for c, (val, missing, ill) in typed.items():
        select += [f"{val} AS {_q(c)}", f"{missing} AS {_q(c + '__m')}",
                   f"{ill} AS {_q(c + '__i')}"]
    cases: list[tuple[str, str]] = []
    for c in REQUIRED:
        if c != "throughput":  # empty unless succeeded: checked with the status below
            cases.append((f"{_q(c + '__m')}", _lit(f"missing required field '{c}'")))
        cases.append((f"{_q(c + '__i')}",
                      _lit(f"ill-typed field '{c}': expected {_KIND[REQUIRED[c]]}")))
    cases += [
        hw_check,
        ("t.trainer_count < 1", _lit("trainer_count must be >= 1 (the number of trainers)")),
        ("t.batch_size < 1", _lit("batch_size must be >= 1 (per-trainer samples per step)")),
        st_check,
        ("t.status = 'succeeded' AND t.throughput IS NULL",
         _lit("missing throughput on a succeeded attempt")),
        ("t.status = 'succeeded' AND NOT (isfinite(t.throughput) AND t.throughput > 0)",
         _lit("throughput must be a finite number > 0 on a succeeded attempt")),
        ("t.status <> 'succeeded' AND t.throughput IS NOT NULL",
         "'throughput must be empty unless status is succeeded (this attempt is ' || "
         "t.status || ')'"),
    ]
    for c, t in ALL_COLUMNS.items():
        if c in REQUIRED or c not in typed:
            continue
        cases.append((f"{_q(c + '__i')}",
                      _lit(f"ill-typed optional field '{c}': expected {_KIND[t]}")))
        if c in OPTIONAL_MINIMUM:
            lo = OPTIONAL_MINIMUM[c]
            cond = f"t.{_q(c)} < {lo}" if t == pa.int64() else \
                f"NOT (isfinite(t.{_q(c)}) AND t.{_q(c)} >= {lo})"
            cases.append((cond, _lit(f"optional field '{c}' must be "
                                     f"{'a finite number ' if t == pa.float64() else ''}"
                                     f">= {lo}")))
        if c == "precision":
            cases.append(_name_check(con, "precision", typed["precision"][0], PRECISIONS,
                                     "unknown precision",
                                     f"precision must be one of {', '.join(PRECISIONS)}"))
    cases += _plausibility(catalog, limits, present)
    reason = "CASE " + " ".join(f"WHEN {w} THEN {m}" for w, m in cases) + " END"
    cols = ", ".join(f"t.{_q(c)}" if c in present else f"NULL::{_duck(t)} AS {_q(c)}"
                     for c, t in ALL_COLUMNS.items())
    # One streamed pass (a projection: DuckDB keeps input order), split in Arrow.
    checked = con.sql(f"SELECT {cols}, t.{_ROW}, {reason} AS reason "
                      f"FROM (SELECT {', '.join(select)} FROM raw) t").to_arrow_table()
    rows = checked.column(_ROW).to_numpy()
    if rows.size > 1 and not bool(np.all(rows[1:] > rows[:-1])):  # O(n) check, not a sort
        checked = checked.take(pc.sort_indices(checked.column(_ROW)))
    ok = pc.is_null(checked.column("reason")).to_numpy(zero_copy_only=False)
    keep = ok
    bad = checked.select([_ROW, "reason"]).filter(pa.array(~ok))
    # A repeated attempt_id: the first valid row is kept, the later valid ones quarantined.
    valid_pos = np.flatnonzero(ok)
    first = _first_occurrences(checked.column("attempt_id").take(pa.array(valid_pos)))
    if first is not None:
        repeats = valid_pos[~first]
        keep = ok.copy()
        keep[repeats] = False
        bad = pa.concat_tables([bad, pa.table({
            _ROW: pa.array(rows[repeats]),
            "reason": pa.array([_DUPLICATE] * len(repeats), pa.string())})])
    good = checked.filter(pa.array(keep)).drop_columns([_ROW, "reason"])
    del checked
    good = good.cast(ATTEMPTS_SCHEMA) if not good.schema.equals(ATTEMPTS_SCHEMA) else good

    con.register("bad", bad)
    record = "to_json(struct_pack(" + ", ".join(
        f"{_q(c)} := raw.{_q(c)}" for c in present) + "))"
    quarantined = con.sql(
        f"SELECT {_lit(origin)} AS source, bad.{_ROW} AS row_number, bad.reason, "
        f"CAST({record} AS VARCHAR) AS record FROM bad JOIN raw USING ({_ROW}) "
        f"ORDER BY bad.{_ROW}").to_arrow_table().cast(QUARANTINE_SCHEMA)
    return Validated(good=good, quarantined=quarantined, unknown_columns=unknown,
                     reasons=_count_reasons(quarantined))


_DUPLICATE = "duplicate attempt_id within the input (the first valid row with it was kept)"


def _first_occurrences(ids: pa.ChunkedArray) -> np.ndarray | None:
    """Boolean mask of the rows that are the first with their id; None if all are distinct."""
    uniq = pc.unique(ids)  # in order of first occurrence
    if len(uniq) == len(ids):
        return None
    code = pc.index_in(ids, value_set=uniq).to_numpy(zero_copy_only=False)
    _, first_pos = np.unique(code, return_index=True)
    mask = np.zeros(len(ids), dtype=bool)
    mask[first_pos] = True
    return mask


def _duck(t: pa.DataType) -> str:
    return {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.float64(): "DOUBLE"}.get(
        t, "TIMESTAMPTZ")


def _count_reasons(bad: pa.Table) -> dict[str, int]:
    if bad.num_rows == 0:
        return {}
    counts = pc.value_counts(bad.column("reason")).to_pylist()
    pairs = sorted(((str(d["values"]), int(d["counts"])) for d in counts),
                   key=lambda p: (-p[1], p[0]))
    return dict(pairs)


# Ingest -----------------------------------------------------------------------------------
@dataclass
class IngestReport:
    """What ingesting one input did. ``rows_read = added + already_stored + quarantined``."""

    source: str
    rows_read: int
    added: int
    already_stored: int
    quarantined: int
    unknown_columns: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    batch_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _report(origin: str, rows: int, v: Validated, r: Any) -> IngestReport:
    return IngestReport(source=origin, rows_read=rows, added=r.added,
                        already_stored=r.already_stored, quarantined=r.quarantined,
                        unknown_columns=list(v.unknown_columns), reasons=dict(v.reasons),
                        batch_id=r.batch_id)


def ingest_table(store: Store, table: pa.Table, catalog: Catalog, *, origin: str,
                 limits: IngestLimits | None = None) -> IngestReport:
    """Validate ``table`` and add it to ``store`` as one atomic batch.

    Parameters
    ----------
    store : Store
        Open for writing.
    table : pyarrow.Table
        Attempt rows (see :func:`validate`).
    catalog : Catalog
        Known hardware.
    origin : str
        Recorded as the batch's source, e.g. ``"simulate seed=1"``.
    limits : IngestLimits, optional
        Plausibility rules (see :func:`validate`).

    Returns
    -------
    IngestReport

    Examples
    --------
    >>> import tempfile
    >>> from leap.catalog import Catalog
    >>> rows = pa.table({"attempt_id": ["a1"], "family_id": ["f"], "model_type": ["m"],
    ...     "submitted_at": ["2024-05-01T12:00:00Z"], "hardware": ["H100-SXM"],
    ...     "trainer_count": [2], "batch_size": [64], "status": ["succeeded"],
    ...     "throughput": [1500.5]})
    >>> with Store(Path(tempfile.mkdtemp()) / "s.duckdb") as store:
    ...     ingest_table(store, rows, Catalog.default(), origin="doc").added
    1
    """
    v = validate(table, catalog, origin=origin, limits=limits)
    r = store.add_batch(v.good, v.quarantined, source=origin)
    return _report(origin, table.num_rows, v, r)


@dataclass
class CheckedFile:
    """One input file, read and validated, not yet stored (see :func:`check_files`)."""

    origin: str
    rows_read: int
    validated: Validated
    size_bytes: int | None = None
    mtime_ns: int | None = None


_GLOB_CHARS = frozenset("*?[")


def expand_inputs(inputs: Sequence[Path | str]) -> list[Path]:
    """Files named by ``inputs``: files as given, directories searched recursively for
    attempt files (e.g. a Hive-partitioned export ``attempts/date=2026-01-12/part-0.parquet``),
    and glob patterns (``exports/**/*.parquet``) expanded; sorted within each input, each file
    once.

    Raises
    ------
    DataError
        For a directory with no attempt file or a pattern that matches nothing.

    Examples
    --------
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / "date=2026-01-02").mkdir(); (d / "date=2026-01-01").mkdir()
    >>> for day in ("01", "02"):
    ...     _ = (d / f"date=2026-01-{day}" / "part-0.parquet").write_bytes(b"")
    >>> [p.parent.name for p in expand_inputs([d])]
    ['date=2026-01-01', 'date=2026-01-02']
    """
    import glob

    out: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and not any(part.startswith((".", "_")) for part in
                                       p.relative_to(path).parts)
                           and _known_format(p))
            if not found:
                raise DataError(f"{path}: no attempt files (.parquet, .csv, .jsonl ...) in this "
                                "directory or below")
            out += found
        elif not path.exists() and _GLOB_CHARS & set(str(item)):
            found = sorted(Path(p) for p in glob.glob(str(item), recursive=True)
                           if Path(p).is_file())
            if not found:
                raise DataError(f"{item}: no file matches this pattern")
            out += found
        else:
            out.append(path)
    return list(dict.fromkeys(out))


def _known_format(path: Path) -> bool:
    try:
        file_format(path)
    except DataError:
        return False
    return True


def new_files(store: Store, paths: Sequence[Path]) -> list[Path]:
    """The files of ``paths`` not ingested before with their current size and modification
    time (what ``leap ingest --incremental`` reads)."""
    seen = store.ingested_files()
    out = []
    for p in paths:
        st = Path(p).stat()
        if seen.get(str(Path(p).resolve())) != (st.st_size, st.st_mtime_ns):
            out.append(p)
    return out


def check_files(paths: Sequence[Path], catalog: Catalog,
                progress: Callable[[str], None] | None = None,
                limits: IngestLimits | None = None) -> list[CheckedFile]:
    """Read and validate every file, writing nothing (the first half of :func:`ingest_files`).

    Raises
    ------
    DataError
        For the first unreadable or malformed file.
    """
    say = progress or (lambda _msg: None)
    for path in paths:  # cheap checks first: a typo in the last name fails before any reading
        file_format(Path(path))
        if not Path(path).is_file():
            raise DataError(f"{path}: no such file")
    checked: list[CheckedFile] = []
    for path in paths:
        say(f"reading {path}")
        st = Path(path).stat()  # before reading: a file rewritten meanwhile is read again
        table = read_attempts_file(Path(path))
        origin = str(Path(path).resolve())
        v = validate(table, catalog, origin=origin, limits=limits)
        say(f"validated {path}: {table.num_rows:,} rows, {v.quarantined.num_rows:,} "
            "quarantined")
        checked.append(CheckedFile(origin, table.num_rows, v, st.st_size, st.st_mtime_ns))
    return checked


def store_checked(store: Store, checked: Sequence[CheckedFile],
                  progress: Callable[[str], None] | None = None) -> list[IngestReport]:
    """Add files from :func:`check_files` to ``store`` in ONE transaction (all or nothing)."""
    say = progress or (lambda _msg: None)
    reports: list[IngestReport] = []
    with store.batch() as batch:
        for i, c in enumerate(checked, 1):
            say(f"writing {c.origin} ({i}/{len(checked)})")
            r = batch.add(c.validated.good, c.validated.quarantined, source=c.origin)
            if c.size_bytes is not None and c.mtime_ns is not None:
                batch.record_file(c.origin, c.size_bytes, c.mtime_ns, c.rows_read)
            reports.append(_report(c.origin, c.rows_read, c.validated, r))
        say("committing")
    say("committed")
    return reports


def ingest_files(store: Store, paths: Sequence[Path], catalog: Catalog,
                 progress: Callable[[str], None] | None = None,
                 limits: IngestLimits | None = None) -> list[IngestReport]:
    """Ingest files as ONE atomic batch: all of them are stored, or none.

    Every file is read and validated first, so an unreadable file or missing column
    anywhere aborts before anything is written; then one transaction adds them in order
    (an ``attempt_id`` seen in an earlier file counts as already stored).

    Parameters
    ----------
    store : Store
        Open for writing.
    paths : sequence of Path
        Files to ingest (see :func:`read_attempts_file`).
    catalog : Catalog
        Known hardware.
    progress : callable, optional
        Called with a short line at each step (read, validated, writing, committed).
    limits : IngestLimits, optional
        Plausibility rules (see :func:`validate`); pass ``now`` to refuse future times.

    Returns
    -------
    list of IngestReport
        One per path, in order.

    Raises
    ------
    DataError
        For the first unreadable or malformed file; the store is untouched.

    Examples
    --------
    >>> import tempfile
    >>> from leap.catalog import Catalog
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a.csv").write_text(
    ...     "attempt_id,family_id,model_type,submitted_at,hardware,trainer_count,batch_size,"
    ...     "status,throughput\\na1,f,m,2024-05-01T12:00:00Z,H100-SXM,1,32,failed,\\n")
    >>> with Store(d / "s.duckdb") as store:
    ...     [r.added for r in ingest_files(store, [d / "a.csv", d / "a.csv"], Catalog.default())]
    [1, 0]
    """
    return store_checked(store, check_files(paths, catalog, progress, limits), progress)
