"""The attempt record: required and optional columns, their types and allowed values."""

from __future__ import annotations

import pyarrow as pa

from leap.errors import DataError

STATUSES: tuple[str, ...] = ("succeeded", "failed", "oom", "preempted")

#: Required columns, in store order, with their canonical Arrow types.
REQUIRED: dict[str, pa.DataType] = {
    "attempt_id": pa.string(),
    "family_id": pa.string(),
    "model_type": pa.string(),
    "submitted_at": pa.timestamp("us", tz="UTC"),
    "hardware": pa.string(),
    "trainer_count": pa.int64(),
    "batch_size": pa.int64(),
    "status": pa.string(),
    "throughput": pa.float64(),
}

#: Optional architecture-summary and job-shape columns: features when present, never required.
OPTIONAL: dict[str, pa.DataType] = {
    "model_category": pa.string(),
    "num_params": pa.float64(),
    "flops_per_sample": pa.float64(),
    "embedding_params": pa.float64(),
    "num_layers": pa.float64(),
    "hidden_dim": pa.float64(),
    "seq_len": pa.float64(),
    "num_dense_features": pa.float64(),
    "num_sparse_features": pa.float64(),
    "precision": pa.string(),
    "devices_per_trainer": pa.int64(),
    "data_parallel": pa.int64(),
    "tensor_parallel": pa.int64(),
    "pipeline_parallel": pa.int64(),
    "duration_hours": pa.float64(),
}

ALL_COLUMNS: dict[str, pa.DataType] = {**REQUIRED, **OPTIONAL}

#: Known only once an attempt has run: never a feature, never in a rank request.
OUTCOME_COLUMNS: tuple[str, ...] = ("status", "throughput", "duration_hours")
#: The launch-time description of a job: what a rank request carries (the candidate
#: ``hardware`` is added per row by the ranker; ids and times identify attempts, not jobs).
JOB_COLUMNS: tuple[str, ...] = tuple(
    c for c in ALL_COLUMNS
    if c not in (*OUTCOME_COLUMNS, "attempt_id", "submitted_at", "hardware"))

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")

ATTEMPTS_SCHEMA = pa.schema([pa.field(n, t, nullable=True) for n, t in ALL_COLUMNS.items()])

#: Largest count (trainers, devices per trainer, parallel degrees) a job may state.
MAX_COUNT = 1_000_000
#: Largest per-trainer batch size a job may state.
MAX_BATCH_SIZE = 10**12
#: Largest architecture size (parameters, FLOPs per sample, widths ...) a job may state.
MAX_SIZE = 1e18

#: Inclusive (low, high) bounds of every numeric launch-time field. Every entry point (the
#: CLI, the Python API, HTTP and batch frames) checks jobs against these through
#: :func:`leap.data.jobs.check_job` / :func:`leap.data.jobs.check_jobs_frame`, and the HTTP
#: schema states them; they keep requests physical and every derived number finite.
JOB_BOUNDS: dict[str, tuple[float, float]] = {
    c: ((1, MAX_BATCH_SIZE) if c == "batch_size" else (1, MAX_COUNT))
    if ALL_COLUMNS[c] == pa.int64() else (0, MAX_SIZE)
    for c in JOB_COLUMNS if ALL_COLUMNS[c] != pa.string()
}

#: What :meth:`Store.add_batch` takes as quarantined rows (``source`` may be null: the
#: batch's source is used). ``record`` is the offending row's original values as JSON text.
QUARANTINE_SCHEMA = pa.schema([
    pa.field("source", pa.string()),
    pa.field("row_number", pa.int64()),
    pa.field("reason", pa.string()),
    pa.field("record", pa.string()),
])


def conform_attempts(good: pa.Table) -> pa.Table:
    """Select and cast ``good`` to :data:`ATTEMPTS_SCHEMA`; absent optional columns are null."""
    if good.schema.equals(ATTEMPTS_SCHEMA):
        return good
    missing = [c for c in REQUIRED if c not in good.column_names]
    if missing:
        raise DataError(f"rows to store lack required column(s) {', '.join(missing)}; "
                        "validate them with leap.data.ingest.validate first")
    arrays = []
    for f in ATTEMPTS_SCHEMA:
        if f.name in good.column_names:
            col = good.column(f.name)
            try:
                arrays.append(col.cast(f.type) if col.type != f.type else col)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise DataError(f"column '{f.name}' of the rows to store cannot be cast to "
                                f"{f.type}: {exc}; validate them first") from None
        else:
            arrays.append(pa.nulls(good.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=ATTEMPTS_SCHEMA)


def conform_quarantine(quarantined: pa.Table) -> pa.Table:
    """Select and cast quarantined rows to :data:`QUARANTINE_SCHEMA` (a ``reason`` is
    required)."""
    if quarantined.num_rows == 0 and not quarantined.column_names:
        return QUARANTINE_SCHEMA.empty_table()
    arrays = []
    for f in QUARANTINE_SCHEMA:
        if f.name in quarantined.column_names:
            arrays.append(quarantined.column(f.name).cast(f.type))
        elif f.name == "reason":
            raise DataError("quarantined rows need a 'reason' column")
        else:
            arrays.append(pa.nulls(quarantined.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=QUARANTINE_SCHEMA)
