"""The attempt record: required and optional columns, their types and allowed values."""

from __future__ import annotations

import pyarrow as pa

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
