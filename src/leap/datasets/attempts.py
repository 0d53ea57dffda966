"""The documented mapping of benchmark rows onto leap's attempt record.

Each row of :func:`leap.datasets.load_throughput` becomes one succeeded attempt:

============================  ===============================================================
attempt column                from the benchmark row
============================  ===============================================================
attempt_id                    ``"bench-"`` + the first 20 hex digits of SHA-256 over the row
                              key ``source|table|model|hardware|num_devices|batch_size|
                              precision``: stable across releases and subsets, so importing
                              twice adds nothing
family_id                     ``source/table/model/precision`` (``unstated`` when the source
                              gives none): one benchmark configuration. Hardware, device count
                              and batch size vary *within* a family (Lambda sizes the batch to
                              each GPU's memory, Sia sweeps a grid), exactly like the attempts
                              of a recurring job, so a family's history transfers across
                              hardware. The table (harness/software version) is part of the
                              key because a new container changes throughput of the same model
model_type                    ``model`` (the architecture as the source names it)
model_category                from the task (vision, language, recommendation, speech, llm ...)
submitted_at                  the table's snapshot date (UTC midnight, its commit date) plus a
                              per-row offset in [0, 86400) s taken from the same hash: synthetic
                              but deterministic; there is no real launch time
hardware                      ``hardware`` (all in :func:`leap.datasets.benchmark_catalog`)
trainer_count                 hosts = ``num_nodes`` (1 when unknown) when ``num_devices``
                              divides evenly over them; otherwise (uneven Sia placements) each
                              device is its own trainer
devices_per_trainer           ``num_devices / trainer_count``
batch_size                    per-trainer batch = per-device ``batch_size`` x
                              ``devices_per_trainer``; 1 where the source gives no batch size
                              (Gavel A3C, whose unit is a step, and 6 flagged Lambda v0 rows)
data_parallel                 ``num_devices`` (every source runs plain data parallelism)
tensor_/pipeline_parallel     1
precision                     ``precision`` (fp32 / fp16; missing when not stated)
status, throughput            ``"succeeded"`` and ``throughput_samples_per_s`` (whole job, in
                              the model's own unit: never compare it across models); a zero
                              throughput (the source's mark for a configuration that did not
                              run) becomes ``"failed"`` with a null throughput
num_params, embedding_params,  from :func:`leap.datasets.load_model_architecture` by (source,
flops_per_sample, num_layers,  model), else (``*``, model): public configs and papers, the
hidden_dim, seq_len            reference named on each row; missing for models without a
                              published figure (and everywhere with ``architecture=False``)
other optional columns        missing
============================  ===============================================================

The invariants ``trainer_count * devices_per_trainer == num_devices`` and
``trainer_count * batch_size == global batch`` hold on every row.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pyarrow as pa

from leap.data.schema import ATTEMPTS_SCHEMA, PRECISIONS
from leap.datasets._sources import SOURCES
from leap.datasets.loaders import ARCHITECTURE_COLUMNS, load_model_architecture
from leap.errors import DataError

#: Columns of a benchmark frame that :func:`to_attempts` needs (the outcome is optional).
NEEDED: tuple[str, ...] = ("source", "table", "model", "hardware", "num_devices", "num_nodes",
                           "batch_size", "precision")

_UNSTATED = "unstated"


def _key_strings(df: pd.DataFrame) -> pd.Series:
    parts = [df[c].astype("string").fillna("") for c in
             ("source", "table", "model", "hardware", "num_devices", "batch_size", "precision")]
    out = parts[0]
    for p in parts[1:]:
        out = out + "|" + p
    return out


def family_ids(df: pd.DataFrame) -> pd.Series:
    """The family of each benchmark row: ``source/table/model/precision``.

    Examples
    --------
    >>> row = pd.DataFrame({"source": ["sia"], "table": ["sosp23"], "model": ["YOLOv3"],
    ...                     "precision": ["fp32"]})
    >>> family_ids(row).tolist()
    ['sia/sosp23/YOLOv3/fp32']
    """
    precision = df["precision"].astype("string").fillna(_UNSTATED)
    return (df["source"].astype("string") + "/" + df["table"].astype("string") + "/"
            + df["model"].astype("string") + "/" + precision)


def architecture_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The architecture summary of each benchmark row's model (NaN where none is published).

    Examples
    --------
    >>> rows = pd.DataFrame({"source": ["gavel", "gavel"], "model": ["ResNet-50", "A3C"]})
    >>> architecture_columns(rows)["num_params"].tolist()
    [25557032.0, nan]
    """
    arch = load_model_architecture()
    exact = arch[arch["source"] != "*"].set_index(["source", "model"])
    generic = arch[arch["source"] == "*"].set_index("model")
    keys = pd.MultiIndex.from_arrays([df["source"].astype(object), df["model"].astype(object)])
    out = pd.DataFrame(index=range(len(df)))
    for col in ARCHITECTURE_COLUMNS:
        by_source = exact[col].astype(np.float64).reindex(keys).to_numpy()
        by_model = generic[col].astype(np.float64).reindex(df["model"].astype(object)).to_numpy()
        out[col] = np.where(np.isnan(by_source), by_model, by_source)
    return out


def to_attempts(df: pd.DataFrame, *, architecture: bool = True) -> pa.Table:
    """Map benchmark rows onto :data:`leap.data.schema.ATTEMPTS_SCHEMA` (see module docs).

    Parameters
    ----------
    df : pandas.DataFrame
        Rows of :func:`leap.datasets.load_throughput` (any subset). Without a
        ``throughput_samples_per_s`` column (a predictor's test rows), ``throughput`` is null.
    architecture : bool, default True
        Fill the architecture columns from :func:`architecture_columns`; ``False`` leaves
        them null (the tables as measured, for an ablation).

    Returns
    -------
    pyarrow.Table
        One succeeded attempt per row, in the order of ``df``, with every schema column.

    Examples
    --------
    >>> from leap.datasets import load_throughput
    >>> t = to_attempts(load_throughput("gavel").head(3))
    >>> t.column("status").to_pylist()
    ['succeeded', 'succeeded', 'succeeded']
    """
    missing = [c for c in NEEDED if c not in df.columns]
    if missing:
        raise DataError(f"benchmark rows lack column(s) {', '.join(missing)}; pass rows of "
                        "leap.datasets.load_throughput()")
    unknown = sorted(set(df["source"]) - set(SOURCES))
    if unknown:
        raise DataError(f"benchmark rows name unknown source(s) {unknown}; expected one of "
                        f"{', '.join(SOURCES)}")
    bad_precision = sorted(set(df["precision"].dropna()) - set(PRECISIONS))
    if bad_precision:
        raise DataError(f"column 'precision' has value(s) {bad_precision} outside "
                        f"{', '.join(PRECISIONS)}")
    n = len(df)
    # hashlib (not pandas' hash) so that ids stay identical across library versions; a few
    # thousand rows, so the per-row digest costs milliseconds.
    digests = [hashlib.sha256(k.encode("utf-8")).hexdigest() for k in _key_strings(df)]
    attempt_id = np.array([f"bench-{d[:20]}" for d in digests], dtype=object)
    offset_s = np.array([int(d[20:28], 16) % 86_400 for d in digests], dtype=np.int64)

    snapshot = {(s.name, t.name): t.snapshot for s in SOURCES.values() for t in s.tables}
    pairs = list(zip(df["source"], df["table"], strict=True))
    unknown_tables = sorted({p for p in pairs if p not in snapshot})
    if unknown_tables:
        raise DataError(f"benchmark rows name unknown (source, table) pair(s) {unknown_tables}")
    base = pd.to_datetime(pd.Series([snapshot[p] for p in pairs], dtype=object), utc=True)
    submitted = (base + pd.to_timedelta(offset_s, unit="s")).reset_index(drop=True)

    devices = df["num_devices"].to_numpy(dtype=np.int64)
    if n and (devices < 1).any():
        raise DataError("column 'num_devices' must be >= 1 on every row")
    nodes = pd.to_numeric(df["num_nodes"]).fillna(1).to_numpy(dtype=np.int64)
    nodes = np.clip(nodes, 1, None)
    even = devices % nodes == 0
    trainers = np.where(even, nodes, devices)
    per_trainer = devices // trainers
    per_device_batch = pd.to_numeric(df["batch_size"]).fillna(1).to_numpy(dtype=np.int64)
    if "throughput_samples_per_s" in df.columns:
        throughput = df["throughput_samples_per_s"].to_numpy(dtype=np.float64)
    else:
        throughput = np.full(n, np.nan)
    # A zero is the source's mark for a configuration that did not run: a failed attempt.
    failed = throughput <= 0
    throughput = np.where(failed, np.nan, throughput)
    status = np.where(failed, "failed", "succeeded").astype(object)
    category = (df["model_category"].astype(object).to_numpy()
                if "model_category" in df.columns else np.full(n, None, dtype=object))

    columns: dict[str, pa.Array] = {}
    for field in ATTEMPTS_SCHEMA:
        columns[field.name] = pa.nulls(n, type=field.type)
    ones = np.ones(n, dtype=np.int64)
    columns.update({
        "attempt_id": pa.array(attempt_id, type=pa.string()),
        "family_id": pa.array(family_ids(df).to_numpy(dtype=object), type=pa.string()),
        "model_type": pa.array(df["model"].to_numpy(dtype=object), type=pa.string()),
        "submitted_at": pa.array(submitted.dt.as_unit("us"),
                                 type=pa.timestamp("us", tz="UTC")),
        "hardware": pa.array(df["hardware"].to_numpy(dtype=object), type=pa.string()),
        "trainer_count": pa.array(trainers, type=pa.int64()),
        "batch_size": pa.array(per_device_batch * per_trainer, type=pa.int64()),
        "status": pa.array(status, type=pa.string()),
        "throughput": pa.array(throughput, type=pa.float64(), from_pandas=True),
        "model_category": pa.array(category, type=pa.string(), from_pandas=True),
        "precision": pa.array(df["precision"].astype(object).where(df["precision"].notna(),
                                                                    None).to_numpy(),
                              type=pa.string(), from_pandas=True),
        "devices_per_trainer": pa.array(per_trainer, type=pa.int64()),
        "data_parallel": pa.array(devices, type=pa.int64()),
        "tensor_parallel": pa.array(ones, type=pa.int64()),
        "pipeline_parallel": pa.array(ones, type=pa.int64()),
    })
    if architecture and n:
        arch = architecture_columns(df)
        for col in ARCHITECTURE_COLUMNS:
            columns[col] = pa.array(arch[col].to_numpy(), type=pa.float64(), from_pandas=True)
    return pa.Table.from_pydict(columns, schema=ATTEMPTS_SCHEMA)

