"""Validating attempt rows: schema types, names against the catalog, plausibility limits;
every rejected row keeps its reason (the quarantine)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from leap.catalog import Catalog
from leap.data.readers import check_columns, cursor
from leap.data.schema import (
    ALL_COLUMNS,
    ATTEMPTS_SCHEMA,
    MAX_BATCH_SIZE,
    MAX_COUNT,
    PRECISIONS,
    QUARANTINE_SCHEMA,
    REQUIRED,
    STATUSES,
)
from leap.errors import ConfigError, did_you_mean

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
    con = cursor()
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
                   "accepted; limit earliest)"))]
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
                               "(limit max_count)")))
    cases.append((f"t.batch_size > {int(limits.max_batch_size)}",
                   _lit(f"implausible batch_size: more than {int(limits.max_batch_size):,} "
                        "(limit max_batch_size)")))
    cases.append((f"t.throughput > {float(limits.max_throughput)!r}",
                  _lit(f"implausible throughput: above {limits.max_throughput:g} samples/s "
                       "(limit max_throughput)")))
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
                      f"{_lit('x; check throughput and flops_per_sample, or the limit ')} || "
                      "'max_utilization)'"))
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
                     reasons=count_reasons(quarantined))


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


def count_reasons(bad: pa.Table) -> dict[str, int]:
    if bad.num_rows == 0:
        return {}
    counts = pc.value_counts(bad.column("reason")).to_pylist()
    pairs = sorted(((str(d["values"]), int(d["counts"])) for d in counts),
                   key=lambda p: (-p[1], p[0]))
    return dict(pairs)
