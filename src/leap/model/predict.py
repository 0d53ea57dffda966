"""Batch prediction: score a file of jobs with a published artifact (``leap predict``)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from leap.data.jobs import MODEL_CONFIG, check_jobs_frame
from leap.data.readers import check_text_file, file_format, printable
from leap.data.schema import JOB_BOUNDS, JOB_COLUMNS
from leap.errors import DataError
from leap.features.columns import Columns
from leap.features.encode import (
    NOVELTY_GROUPS,
    REQUEST_COLUMNS,
    jobs_frame,
)
from leap.model.artifact import Artifact

#: Blocks of a batch's distinct rows encoded at once (:func:`leap.features.encode.encode`).
#: Measured on 2 cores, 100,000 rows: encode 1.24 -> 1.05 s with two (the GIL bounds it).
BATCH_THREADS = min(2, os.cpu_count() or 1)


def read_jobs(path: Path) -> pd.DataFrame:
    """Read job rows from CSV, Parquet or JSON Lines (by name ending, as ingest reads:
    :func:`leap.data.readers.file_format`).

    Job columns are typed as stored attempts; any other column (``attempt_id``, your own
    keys) is kept as read, so predictions can be joined back.
    """
    if not path.is_file():
        raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    fmt = file_format(path)
    if fmt != "parquet":
        check_text_file(path, "CSV" if fmt == "csv" else "JSON")
    configs: list[Any] | None = None
    try:
        if fmt == "csv":
            table = pacsv.read_csv(path)
        elif fmt == "parquet":
            table = pq.read_table(path)
        elif '"model_config"' in (text := _text(path)):
            # Model definitions vary in keys and types from row to row: read them as Python
            # objects, not as one inferred Arrow struct.
            table, configs = _json_jobs_with_configs(path, text)
        else:
            table = pajson.read_json(path)
    except (OSError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"{path}: cannot read jobs: {printable(str(exc))}") from None
    for name in table.column_names:
        if name in JOB_BOUNDS and pa.types.is_boolean(table.schema.field(name).type):
            raise DataError(f"{path}: job field '{name}' must be a number, got true/false "
                            "values")
    typed = jobs_frame(table.to_pylist())
    extra = [c for c in table.column_names if c not in typed.columns]
    out = pd.concat([table.select(extra).to_pandas(), typed], axis=1) if extra else typed
    if configs is not None:
        out[MODEL_CONFIG] = pd.Series(configs, index=out.index, dtype=object)
    return out


def _text(path: Path) -> str:
    """The text of a JSON Lines file (decompressed when its name ends in ``.gz``)."""
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text("utf-8")


def _json_jobs_with_configs(path: Path, text: str) -> tuple[pa.Table, list[Any]]:
    """Jobs of a JSON Lines file (``path``, read as ``text``) without their ``model_config``
    objects, and those objects."""
    records: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{path}:{n}: not valid JSON ({exc})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{n}: expected a JSON object (a job), got "
                            f"{type(rec).__name__}")
        records.append(rec)
    configs = [rec.pop(MODEL_CONFIG, None) for rec in records]
    return pa.Table.from_pylist(records), configs


def candidate_rows(jobs: pd.DataFrame, candidates: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The (job, hardware) rows to score: a job with a ``hardware`` value on that type, any
    other on every candidate in name order. Each row's job (its row number in ``jobs``) and
    type, in job order.

    >>> job, hardware = candidate_rows(pd.DataFrame({"hardware": [None, "T4"]}), ["L4", "A10"])
    >>> job.tolist(), hardware.tolist()
    ([0, 0, 1], ['A10', 'L4', 'T4'])
    """
    n = len(jobs)
    given = jobs["hardware"].to_numpy(dtype=object, na_value=None) \
        if "hardware" in jobs.columns else np.full(n, None, dtype=object)
    fixed = np.array([h is not None for h in given.tolist()], dtype=bool)
    names = np.array(sorted(candidates), dtype=object)
    per = np.where(fixed, 1, len(names))
    job = np.repeat(np.arange(n), per)
    on_candidate = ~fixed[job]
    within = np.arange(len(job)) - np.repeat(np.cumsum(per) - per, per)
    hardware = given[job]
    hardware[on_candidate] = names[within[on_candidate]]
    return job, hardware


def batch_columns(jobs: pd.DataFrame, job: np.ndarray, hardware: np.ndarray) -> Columns:
    """The job columns of ``jobs`` at rows ``job`` on ``hardware`` (:func:`candidate_rows`),
    numbered by job: what each job's rows share is computed once a job."""
    present = [c for c in jobs.columns if c in JOB_COLUMNS]
    return Columns.from_frame(jobs[present]).take(job).numbered(job, len(jobs)) \
        .with_hardware(hardware)


def predict_frame(artifact: Artifact, jobs: pd.DataFrame,
                  candidates: list[str] | None = None) -> pd.DataFrame:
    """Predicted samples/s for every (job, hardware) row; unknown hardware is an error.

    Columns: ``job`` (row number in ``jobs``), the columns of ``jobs`` that are not job
    features (passed through), the job's key fields, ``hardware``, ``predicted_throughput``
    and its 80% interval ``throughput_p10`` / ``throughput_p90``, and ``novelty`` (what
    history the family had on the type).
    """
    return predict_checked(artifact, check_jobs_frame(jobs), candidates)


def predict_checked(artifact: Artifact, jobs: pd.DataFrame,
                    candidates: list[str] | None = None) -> pd.DataFrame:
    """:func:`predict_frame` of jobs checked already (by :func:`check_jobs_frame`, or record
    by record as :func:`leap.rank.requests.jobs_request` checks a request's)."""
    jobs = jobs.reset_index(drop=True)
    names = artifact.catalog.resolve(candidates)
    missing = [c for c in REQUEST_COLUMNS if c not in jobs.columns and c != "hardware"]
    if missing:
        raise DataError(f"jobs lack required column(s): {', '.join(missing)}")
    job, hardware = candidate_rows(jobs, names)
    if "hardware" in jobs.columns:
        for hw in jobs["hardware"].dropna().unique():
            artifact.catalog[str(hw)]  # raises with a did-you-mean
    pred, lo, hi, group = artifact.predict_interval(batch_columns(jobs, job, hardware),
                                                    BATCH_THREADS)
    keep = ["family_id", "model_type", "trainer_count", "batch_size"]
    passthrough = [c for c in jobs.columns
                   if c not in keep and c not in JOB_COLUMNS and c not in ("job", "hardware")]
    out = jobs[passthrough + keep].take(job).reset_index(drop=True)
    out.insert(0, "job", job)
    return out.assign(
        hardware=pd.Series(hardware), predicted_throughput=np.exp(pred),
        throughput_p10=np.exp(lo), throughput_p90=np.exp(hi),
        novelty=np.array(NOVELTY_GROUPS, dtype=object)[group])


def predict_file(artifact: Artifact, path: Path,
                 candidates: list[str] | None = None) -> pd.DataFrame:
    return predict_frame(artifact, read_jobs(path), candidates)
