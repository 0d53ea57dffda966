"""Loaders for the compact public measurements and hardware tables shipped with leap."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from leap.catalog import Catalog
from leap.datasets._sources import SOURCES
from leap.errors import ConfigError, DataError, did_you_mean

THROUGHPUT_FILE = "throughput.csv.gz"
CATALOG_FILE = "benchmark_hardware.toml"

#: Columns of :func:`load_throughput`, in order, with their meaning.
COLUMNS: dict[str, str] = {
    "source": "source name, a key of leap.datasets.SOURCES",
    "table": "table within the source: harness/software version (e.g. Lambda 'v0', 'v1', 'v2')",
    "source_commit": "git commit of the source repository the row was copied from",
    "framework": "framework / container / harness",
    "model": "the workload's model, as the source names it",
    "task": "what the model does (image_classification, translation, ...)",
    "model_category": "coarse category from the task: vision, language, recommendation, "
                      "speech, reinforcement_learning, llm",
    "dataset": "the harness's default dataset",
    "precision": "fp32 or fp16 (leap.data.schema.PRECISIONS); missing when not stated",
    "precision_note": "the precision as the source states it",
    "hardware": "accelerator type; in leap.datasets.benchmark_catalog()",
    "num_devices": "accelerators in the job",
    "num_nodes": "hosts (Sia: most common among the merged placements); missing when unknown",
    "batch_size": "per-device batch size in samples; missing for Gavel A3C",
    "global_batch_size": "batch_size x num_devices",
    "throughput_samples_per_s": "whole-job throughput in sample_unit per second (median of the "
                                "raw rows merged); compare only within one model and source",
    "sample_unit": "what one sample is for this model (image, sequence, token, ...)",
    "n_raw_rows": "raw measurements merged into this row",
    "throughput_spread": "max / min throughput among the merged raw rows (1.0 for one row; "
                         "missing for a zero 'did not run' row)",
    "flagged": "true when the source data README flags the row as suspect",
    "quality_flags": "semicolon-separated flags (superlinear_vs_1gpu_suspect(xN), ...); empty if "
                     "none (not 'flags', which is a pandas DataFrame attribute)",
}

#: Columns that carry the measured outcome: a predictor's test rows never include them.
OUTCOME_COLUMNS: tuple[str, ...] = ("throughput_samples_per_s", "n_raw_rows",
                                    "throughput_spread", "flagged", "quality_flags")

_ARROW_TYPES: dict[str, pa.DataType] = {
    **{c: pa.string() for c in COLUMNS},
    "num_devices": pa.int64(),
    "num_nodes": pa.int64(),
    "batch_size": pa.int64(),
    "global_batch_size": pa.int64(),
    "throughput_samples_per_s": pa.float64(),
    "n_raw_rows": pa.int64(),
    "throughput_spread": pa.float64(),
    "flagged": pa.bool_(),
}


def _data_path(name: str) -> Path:
    # The package is installed as plain files (editable or wheel), so the traversable is a path.
    return Path(str(resources.files("leap.datasets").joinpath("data", name)))


def data_checksum() -> str:
    """SHA-256 (first 16 hex digits) of the shipped throughput file: results cite the data."""
    return hashlib.sha256(_data_path(THROUGHPUT_FILE).read_bytes()).hexdigest()[:16]


def load_throughput(source: str | None = None, *, include_flagged: bool = True) -> pd.DataFrame:
    """The public measured training throughput, one row per measured configuration.

    One row per (source, table, model, hardware, num_devices, per-device batch_size,
    precision); see :data:`COLUMNS` for every column and ``leap.datasets.SOURCES`` for where
    each source comes from.

    Parameters
    ----------
    source : str, optional
        Only this source (``"lambda_pytorch"``, ``"lambda_tensorflow"``, ``"gavel"``,
        ``"sia"``, ``"vectorlm"``); ``None`` for all of them.
    include_flagged : bool, default True
        Keep the rows the source data flags as suspect (``flagged`` is true on them).

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`, in order; integer columns that can be missing use the
        nullable ``Int64`` dtype.

    Examples
    --------
    >>> df = load_throughput("gavel", include_flagged=False)
    >>> sorted(df["hardware"].unique())
    ['K80', 'P100', 'V100-SXM2-16GB']
    """
    if source is not None and source not in SOURCES:
        raise ConfigError(f"unknown benchmark source '{source}'{did_you_mean(source, SOURCES)}; "
                          f"choose one of {', '.join(SOURCES)}")
    path = _data_path(THROUGHPUT_FILE)
    try:
        table = pacsv.read_csv(
            path,
            convert_options=pacsv.ConvertOptions(column_types=_ARROW_TYPES,
                                                 strings_can_be_null=False,
                                                 include_columns=list(COLUMNS)),
        )
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"cannot read the shipped benchmark data {path}: {exc}; reinstall leap "
                        "(or rebuild it with tools/build_datasets.py)") from None
    df = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    df["num_devices"] = df["num_devices"].astype("int64")
    df["n_raw_rows"] = df["n_raw_rows"].astype("int64")
    # An empty precision cell means "not stated" (VectorLM): missing, not a precision.
    df["precision"] = df["precision"].mask(df["precision"] == "")
    mask = pd.Series(True, index=df.index)
    if source is not None:
        mask &= df["source"] == source
    if not include_flagged:
        mask &= ~df["flagged"]
    return df[mask].reset_index(drop=True)


#: The architecture columns ``model_architecture.csv`` gives (attempt-schema names).
ARCHITECTURE_COLUMNS: tuple[str, ...] = ("num_params", "embedding_params", "flops_per_sample",
                                         "num_layers", "hidden_dim", "seq_len")


def load_model_architecture() -> pd.DataFrame:
    """The architecture summary of the benchmark models, from public configs and papers.

    One row per (``source``, ``model``); ``source`` ``*`` applies to every source that runs a
    model of that name on the same input (e.g. ResNet-50 on ImageNet). Columns: ``source,
    model``, :data:`ARCHITECTURE_COLUMNS` (blank where no public figure exists),
    ``sample_unit`` (what ``flops_per_sample`` counts: an image, a sequence, a token ...) and
    ``reference`` (where each figure comes from, or how it is derived). ``flops_per_sample`` is
    training FLOPs: 3 x the forward pass (2 FLOPs per multiply-add).

    Examples
    --------
    >>> arch = load_model_architecture().set_index(["source", "model"])
    >>> int(arch.loc[("*", "ResNet-50"), "num_params"])
    25557032
    """
    return pd.read_csv(_data_path("model_architecture.csv"))


def load_hardware_specs() -> pd.DataFrame:
    """Published spec figures per accelerator type (56 types; blank where no source has one).

    A verbatim copy of the shared ``hardware_specs.csv``: ``hardware, vendor, architecture,
    form_factor, year, memory_gb, mem_bw_gbps, peak_bf16_tflops, peak_fp16_tflops,
    peak_fp32_tflops, intra_node_bw_GBps_unidir, inter_node_bw_Gbps_per_device, tdp_w,
    devices_per_host_typical, interconnect, source, notes``. Unlike a catalog, it holds no
    estimates, so baselines can tell a published figure from a guess.

    Examples
    --------
    >>> specs = load_hardware_specs()
    >>> float(specs.set_index("hardware").loc["H100-SXM", "mem_bw_gbps"])
    3350.0
    """
    return pd.read_csv(_data_path("hardware_specs.csv"))


def load_prices() -> pd.DataFrame:
    """Public on-demand price summary per accelerator type (USD per accelerator-hour).

    A verbatim copy of the shared ``hardware_prices_summary.csv``: ``hardware, basis,
    n_quotes, clouds, min_usd, median_usd, max_usd, hyperscaler_median_usd,
    latest_dated_quote``.

    Examples
    --------
    >>> float(load_prices().set_index("hardware").loc["H100-SXM", "median_usd"])
    3.47
    """
    return pd.read_csv(_data_path("hardware_prices_summary.csv"))


def benchmark_catalog_path() -> Path:
    """Path of the shipped catalog extension (pass it to ``leap --catalog``)."""
    return _data_path(CATALOG_FILE)


def benchmark_catalog() -> Catalog:
    """The default catalog extended with every accelerator type the shipped rows use.

    Examples
    --------
    >>> cat = benchmark_catalog()
    >>> set(load_throughput()["hardware"]) <= set(cat.names)
    True
    """
    return Catalog.load(benchmark_catalog_path())
