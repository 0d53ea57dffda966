"""Public measured training throughput on real accelerators, shipped with leap (like sklearn's).

A compact, deduplicated copy of five public sources (Lambda PyTorch and TensorFlow benchmarks,
Gavel, Sia/Pollux, VectorLM): one row per (source, table, model, hardware, device count,
per-device batch size, precision), flagged rows kept and marked. ``SOURCES`` names each
source's repository, commits and licence; ``data/README.md`` documents the files.

Examples
--------
>>> from leap.datasets import load_throughput, to_attempts, benchmark_catalog
>>> df = load_throughput("lambda_pytorch", include_flagged=False)
>>> attempts = to_attempts(df)                 # leap.data.schema.ATTEMPTS_SCHEMA
>>> catalog = benchmark_catalog()              # default catalog + every benchmark GPU
"""

from leap.datasets._sources import SOURCES, Source, SourceTable
from leap.datasets.attempts import architecture_columns, family_ids, to_attempts
from leap.datasets.loaders import (
    COLUMNS,
    OUTCOME_COLUMNS,
    benchmark_catalog,
    benchmark_catalog_path,
    data_checksum,
    load_hardware_specs,
    load_model_architecture,
    load_prices,
    load_throughput,
)

__all__ = [
    "COLUMNS",
    "OUTCOME_COLUMNS",
    "SOURCES",
    "Source",
    "SourceTable",
    "architecture_columns",
    "benchmark_catalog",
    "benchmark_catalog_path",
    "data_checksum",
    "family_ids",
    "load_hardware_specs",
    "load_model_architecture",
    "load_prices",
    "load_throughput",
    "to_attempts",
]
