"""leap.datasets: the shipped public measurements, the catalog extension and the attempt mapping."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import leap.cli
from leap.catalog import Catalog
from leap.data.schema import ATTEMPTS_SCHEMA, PRECISIONS
from leap.data.store import Store
from leap.datasets import (
    COLUMNS,
    SOURCES,
    benchmark_catalog,
    benchmark_catalog_path,
    family_ids,
    load_hardware_specs,
    load_prices,
    load_throughput,
    to_attempts,
)
from leap.errors import ConfigError, DataError

DATA_DIR = Path(leap.datasets.__file__).parent / "data"
KEY = ["source", "table", "model", "hardware", "num_devices", "batch_size", "precision"]
EXPECTED_ROWS = {"lambda_pytorch": 2237, "lambda_tensorflow": 346, "gavel": 249, "sia": 4868,
                 "vectorlm": 93}
EXPECTED_FLAGGED = {"lambda_pytorch": 33, "lambda_tensorflow": 0, "gavel": 6, "sia": 0,
                    "vectorlm": 93}


@pytest.fixture(scope="module")
def df() -> pd.DataFrame:
    return load_throughput()


@pytest.fixture(scope="module")
def attempts(df: pd.DataFrame) -> pd.DataFrame:
    return to_attempts(df).to_pandas()


# The dataset -----------------------------------------------------------------------------------
def test_row_counts_and_columns(df: pd.DataFrame) -> None:
    assert list(df.columns) == list(COLUMNS)
    assert df.groupby("source").size().to_dict() == EXPECTED_ROWS
    assert df.groupby("source")["flagged"].sum().to_dict() == EXPECTED_FLAGGED
    for source, n in EXPECTED_ROWS.items():
        clean = load_throughput(source, include_flagged=False)
        assert len(clean) == n - EXPECTED_FLAGGED[source]
        assert not clean["flagged"].any()
        assert set(clean["source"]) <= {source}


def test_one_row_per_key_and_sane_values(df: pd.DataFrame) -> None:
    assert not df.duplicated(KEY).any()
    assert (df["num_devices"] >= 1).all()
    zero = df["throughput_samples_per_s"] <= 0
    assert (df["n_raw_rows"] >= 1).all()
    assert ((df["throughput_spread"] >= 1.0) | (zero & df["throughput_spread"].isna())).all()
    known_bs = df["batch_size"].notna()
    assert (df.loc[known_bs, "global_batch_size"]
            == df.loc[known_bs, "batch_size"] * df.loc[known_bs, "num_devices"]).all()
    assert set(df["precision"].dropna()) <= set(PRECISIONS)
    # A zero throughput only ever appears as a flagged "did not run" row.
    assert zero.sum() == 3
    assert df.loc[zero, "quality_flags"].str.contains("zero_throughput_not_run").all()
    assert (df["flagged"] == (df["quality_flags"] != "")).all()


def test_sources_name_every_table_commit_and_licence(df: pd.DataFrame) -> None:
    pairs = df[["source", "table", "source_commit"]].drop_duplicates()
    for source, table, commit in pairs.itertuples(index=False):
        meta = SOURCES[source]
        assert meta.table(table).commit == commit
        assert meta.license and meta.repo.startswith("https://github.com/")
        assert meta.table(table).snapshot.tzinfo is not None
    assert set(SOURCES) == set(df["source"])


def test_unknown_source_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown benchmark source 'lamda_pytorch'; "
                                          "did you mean 'lambda_pytorch'"):
        load_throughput("lamda_pytorch")


def test_hand_checked_dedup_rows(df: pd.DataFrame) -> None:
    # Lambda v2 BERT-base fp16 on 8x H100 SXM: 22 systems, median 9355 sequences/s; two of
    # the systems are flagged super-linear, so the key keeps the flag.
    row = df[(df["table"] == "v2") & (df["model"] == "BERT-base")
             & (df["hardware"] == "H100-SXM") & (df["num_devices"] == 8)
             & (df["precision"] == "fp16")].iloc[0]
    assert (row["n_raw_rows"], row["throughput_samples_per_s"], row["batch_size"]) == (
        22, 9355.0, 320)
    assert row["flagged"] and "superlinear_vs_1gpu_suspect" in row["quality_flags"]
    # Sia ResNet-50 on 5 T4 at local batch 20: 5 placements (381.6, 345.4, 311.6, 245.8,
    # 242.2 images/s over 4, 3, 3, 2, 2 hosts): the median, host count tie broken to fewer.
    row = df[(df["source"] == "sia") & (df["model"] == "ResNet-50") & (df["hardware"] == "T4")
             & (df["num_devices"] == 5) & (df["batch_size"] == 20)].iloc[0]
    assert (row["n_raw_rows"], row["throughput_samples_per_s"], row["num_nodes"]) == (
        5, 311.607, 2)


def test_small_enough_to_ship() -> None:
    total = sum(p.stat().st_size for p in DATA_DIR.iterdir() if p.is_file())
    assert total < 3 * 1024 * 1024


# Hardware catalogs -----------------------------------------------------------------------------
def test_benchmark_catalog_covers_every_row_and_keeps_default_figures(df: pd.DataFrame) -> None:
    cat = benchmark_catalog()
    default = Catalog.default()
    assert set(df["hardware"]) <= set(cat.names)
    for name in default:
        assert cat[name] == default[name]
    assert Catalog.load(benchmark_catalog_path()).fingerprint() == cat.fingerprint()


def _spec_rows() -> pd.DataFrame:
    return load_hardware_specs().set_index("hardware")


_FIELDS = {"year": "year", "devices_per_host": "devices_per_host_typical",
           "peak_fp32_tflops": "peak_fp32_tflops", "memory_gb": "memory_gb",
           "mem_bw_gb_per_s": "mem_bw_gbps", "intra_node_bw_gb_per_s": "intra_node_bw_GBps_unidir",
           "inter_node_bw_gbit_per_s": "inter_node_bw_Gbps_per_device"}


def _check_entry(name: str, hw: object, specs: pd.DataFrame, prices: pd.DataFrame) -> list[str]:
    """Mismatches of one catalog entry against the published tables (estimates and named
    corrections excepted)."""
    row = specs.loc[name]
    notes = str(hw.notes)  # type: ignore[attr-defined]
    bad: list[str] = []
    assert hw.vendor == row["vendor"]  # type: ignore[attr-defined]
    published16 = (row["peak_bf16_tflops"] if pd.notna(row["peak_bf16_tflops"])
                   else row["peak_fp16_tflops"])
    pairs = [("peak_bf16_tflops", published16)] + [(f, row[c]) for f, c in _FIELDS.items()]
    for field, published in pairs:
        value = float(getattr(hw, field))
        if pd.isna(published):
            if f"{field}:" not in notes:  # a missing figure must be a named estimate
                bad.append(f"{name}.{field} = {value} has no source and no estimate note")
        elif not math.isclose(value, float(published), rel_tol=1e-9) and not (
                f"{field}:" in notes and f"{float(published):g}" in notes):
            # A correction of a published figure names the field and the figure it replaces.
            bad.append(f"{name}.{field} = {value}, published {published}")
    cost_source = str(hw.cost_source)  # type: ignore[attr-defined]
    if name in prices.index:
        p = prices.loc[name]
        if hw.cost_per_device_hour != p["median_usd"]:  # type: ignore[attr-defined]
            bad.append(f"{name}.cost_per_device_hour != median quote {p['median_usd']}")
        assert cost_source.startswith(f"median of {int(p['n_quotes'])} public")
    elif not cost_source.startswith("estimate"):
        bad.append(f"{name}: price without a quote is not marked as an estimate")
    return bad


def test_default_catalog_matches_the_published_tables() -> None:
    specs, prices = _spec_rows(), load_prices().set_index("hardware")
    bad = [m for name, hw in Catalog.default().items()
           for m in _check_entry(name, hw, specs, prices)]
    assert bad == []


def test_benchmark_extension_matches_the_published_tables() -> None:
    specs, prices = _spec_rows(), load_prices().set_index("hardware")
    text = benchmark_catalog_path().read_text("utf-8")
    names = [t["name"] for t in tomllib.loads(text)["hardware"]]
    assert len(names) == 24 and "K80" in names and "RTX-2080Ti" in names
    cat = benchmark_catalog()
    bad = [m for name in names for m in _check_entry(name, cat[name], specs, prices)]
    assert bad == []


def test_every_extension_figure_has_a_provenance_row() -> None:
    prov = pd.read_csv(DATA_DIR / "benchmark_hardware_provenance.csv")
    cat = benchmark_catalog()
    fields = ["peak_bf16_tflops", "cost_per_device_hour", *_FIELDS]
    for name in set(prov["hardware"]):
        got = prov[prov["hardware"] == name].set_index("field")
        for field in fields:
            assert float(got.loc[field, "value"]) == pytest.approx(float(getattr(cat[name], field)))
            assert isinstance(got.loc[field, "source"], str) and got.loc[field, "source"]


# The attempt mapping --------------------------------------------------------------------------
def test_attempts_follow_the_schema_and_invariants(df: pd.DataFrame,
                                                  attempts: pd.DataFrame) -> None:
    assert to_attempts(df.head(5)).schema == ATTEMPTS_SCHEMA
    assert attempts["attempt_id"].is_unique
    dev = df["num_devices"].to_numpy()
    assert (attempts["trainer_count"] * attempts["devices_per_trainer"] == dev).all()
    known = df["batch_size"].notna().to_numpy()
    assert (attempts["trainer_count"] * attempts["batch_size"])[known].tolist() == \
        df.loc[known, "global_batch_size"].astype(int).tolist()
    assert (attempts["data_parallel"] == dev).all()
    assert set(attempts["status"]) == {"succeeded", "failed"}
    ok = attempts["status"] == "succeeded"
    assert (attempts.loc[ok, "throughput"] > 0).all()
    assert attempts.loc[~ok, "throughput"].isna().all()
    # The tables have no architecture summaries: without the shipped model table none is set.
    bare = to_attempts(df, architecture=False).to_pandas()
    for col in ("num_params", "flops_per_sample", "num_layers", "hidden_dim", "seq_len"):
        assert bare[col].isna().all()
    # The same configuration on different hardware is one family.
    fam = attempts.groupby("family_id")["hardware"].nunique()
    assert fam.max() > 20 and len(fam) == df[["source", "table", "model", "precision"]] \
        .drop_duplicates().shape[0]


def test_attempt_ids_and_times_do_not_depend_on_the_subset(df: pd.DataFrame,
                                                          attempts: pd.DataFrame) -> None:
    sub = df.iloc[[5000, 17, 2316]]
    again = to_attempts(sub).to_pandas()
    full = attempts.iloc[[5000, 17, 2316]].reset_index(drop=True)
    assert again["attempt_id"].tolist() == full["attempt_id"].tolist()
    assert again["submitted_at"].tolist() == full["submitted_at"].tolist()


def _one(df: pd.DataFrame, attempts: pd.DataFrame, **where: object) -> dict[str, Any]:
    m = np.ones(len(df), dtype=bool)
    for k, v in where.items():
        m &= (df[k] == v).to_numpy(dtype=bool, na_value=False)
    assert m.sum() == 1, where
    return attempts[m].iloc[0].to_dict()


def test_hand_checked_rows_map_as_documented(df: pd.DataFrame, attempts: pd.DataFrame) -> None:
    # Lambda v0 SSD300 fp16 on one V100 PCIe 32 GB: 224 images/s at batch 192.
    a = _one(df, attempts, source="lambda_pytorch", table="v0",
             model="SSD300 (ResNet-50 backbone)", hardware="V100-PCIe-32GB", num_devices=1,
             precision="fp16")
    assert a["family_id"] == "lambda_pytorch/v0/SSD300 (ResNet-50 backbone)/fp16"
    assert (a["trainer_count"], a["devices_per_trainer"], a["batch_size"]) == (1, 1, 192)
    assert (a["throughput"], a["status"], a["precision"]) == (224.0, "succeeded", "fp16")
    assert a["model_type"] == "SSD300 (ResNet-50 backbone)" and a["model_category"] == "vision"
    assert a["submitted_at"].date().isoformat() == "2022-07-06"
    # Lambda v2 BERT-base fp16 on one 8x H100 host: one trainer of 8 devices, batch 8 x 320.
    a = _one(df, attempts, source="lambda_pytorch", table="v2", model="BERT-base",
             hardware="H100-SXM", num_devices=8, precision="fp16")
    assert (a["trainer_count"], a["devices_per_trainer"], a["batch_size"]) == (1, 8, 2560)
    assert a["throughput"] == 9355.0 and a["submitted_at"].date().isoformat() == "2025-12-17"
    # Sia ResNet-50 on 5 T4 over (mostly) 2 hosts: uneven, so each device is a trainer.
    a = _one(df, attempts, source="sia", model="ResNet-50", hardware="T4", num_devices=5,
             batch_size=20)
    assert (a["trainer_count"], a["devices_per_trainer"], a["batch_size"]) == (5, 1, 20)
    assert a["family_id"] == "sia/sosp23/ResNet-50/fp32" and a["throughput"] == 311.607
    # Gavel A3C has no batch: one step is the sample, batch 1.
    a = _one(df, attempts, source="gavel", model="A3C", hardware="K80")
    assert (a["batch_size"], a["throughput"]) == (1, 3.43877)
    # Gavel ResNet-50 batch 128 on 2 K80: 0 in the source = did not run = a failed attempt.
    a = _one(df, attempts, source="gavel", model="ResNet-50", hardware="K80", num_devices=2,
             batch_size=128)
    assert a["status"] == "failed" and math.isnan(float(a["throughput"]))
    # VectorLM states no precision: missing, and the family says so.
    a = _one(df, attempts, source="vectorlm", model="gemma-2b (lora)", hardware="T4",
             num_devices=1)
    assert pd.isna(a["precision"]) and a["family_id"].endswith("/unstated")
    assert (a["throughput"], a["batch_size"]) == (148.272, 8)


def test_family_ids_example() -> None:
    row = pd.DataFrame({"source": ["gavel"], "table": ["osdi20"], "model": ["ResNet-18"],
                        "precision": [None]})
    assert family_ids(row).tolist() == ["gavel/osdi20/ResNet-18/unstated"]


def test_to_attempts_refuses_bad_input(df: pd.DataFrame) -> None:
    with pytest.raises(DataError, match="lack column"):
        to_attempts(df.drop(columns=["hardware"]).head(2))
    bad = df.head(2).copy()
    bad["precision"] = "fp64"
    with pytest.raises(DataError, match=r"column 'precision' has value\(s\) \['fp64'\]"):
        to_attempts(bad)
    bad = df.head(2).copy()
    bad["source"] = "mystery"
    with pytest.raises(DataError, match="unknown source"):
        to_attempts(bad)


def test_test_rows_without_throughput_map_to_null(df: pd.DataFrame) -> None:
    t = to_attempts(df.head(4).drop(columns=["throughput_samples_per_s"]))
    assert t.column("throughput").null_count == 4
    assert isinstance(t, pa.Table)


# CLI ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runner() -> CliRunner:
    leap.cli._register()
    return CliRunner()


def test_import_benchmarks_is_idempotent_and_passes_validation(runner: CliRunner,
                                                               tmp_path: Path) -> None:
    home = tmp_path / "home"
    args = ["--home", str(home), "import-benchmarks", "--source", "gavel", "--include-flagged",
            "--json"]
    first = runner.invoke(leap.cli.app, args)
    assert first.exit_code == 0, first.output
    rep = json.loads(first.stdout)
    assert rep["report"]["added"] == 249 and rep["report"]["quarantined"] == 0
    assert "--catalog" in rep["note"]
    again = json.loads(runner.invoke(leap.cli.app, args).stdout)
    assert again["report"]["added"] == 0 and again["report"]["already_stored"] == 249
    with Store(home / "leap.duckdb", read_only=True) as store:
        assert store.count() == 249
        stored = store.attempts().to_pandas()
    assert (stored["status"] == "failed").sum() == 3
    assert stored["family_id"].str.startswith("gavel/osdi20/").all()


def test_import_benchmarks_says_how_to_fix_a_catalog_without_the_types(
        runner: CliRunner, tmp_path: Path) -> None:
    own = tmp_path / "mine.toml"
    own.write_text('[[hardware]]\nname = "T4"\ncost_per_device_hour = 0.5\n', encoding="utf-8")
    res = runner.invoke(leap.cli.app, ["--home", str(tmp_path / "h"), "--catalog", str(own),
                                       "import-benchmarks", "--source", "gavel"])
    assert res.exit_code == 1
    assert "lacks 3 hardware type(s)" in res.output and "K80" in res.output
    assert "benchmark_hardware.toml import-benchmarks" in res.output.replace("\n", "")
    assert not (tmp_path / "h" / "leap.duckdb").exists()


def test_import_benchmarks_with_the_benchmark_catalog(runner: CliRunner, tmp_path: Path) -> None:
    res = runner.invoke(leap.cli.app, ["--home", str(tmp_path), "--catalog",
                                       str(benchmark_catalog_path()), "import-benchmarks",
                                       "--source", "vectorlm", "--include-flagged", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["report"]["added"] == 93 and rep["note"] == ""


def test_model_architecture_table_is_sourced_and_matches_the_shipped_models() -> None:
    from leap.datasets import architecture_columns, load_model_architecture

    arch = load_model_architecture()
    assert arch["reference"].str.len().gt(20).all()  # every row names where it comes from
    assert not arch.duplicated(["source", "model"]).any()
    data = load_throughput()
    pairs = set(zip(data["source"], data["model"], strict=True))
    models = set(data["model"])
    for src, model in zip(arch["source"], arch["model"], strict=True):
        assert (src, model) in pairs if src != "*" else model in models, (src, model)
    numbers = arch[["num_params", "embedding_params", "flops_per_sample", "num_layers",
                    "hidden_dim", "seq_len"]]
    assert (numbers.fillna(1) > 0).all().all()
    # A source-specific row wins over the generic one; unknown models stay empty.
    rows = pd.DataFrame({"source": ["sia", "gavel", "gavel"],
                         "model": ["ResNet-50", "ResNet-18", "A3C"]})
    got = architecture_columns(rows)
    assert got["num_params"].tolist()[:2] == [25557032.0, 11173962.0]
    assert got.iloc[2].isna().all()


def test_transformer_rows_agree_with_leap_arch() -> None:
    from leap.arch import describe_model
    from leap.datasets import load_model_architecture

    config = json.loads((Path(__file__).parent / "data" / "model_configs" /
                         "bert-base-uncased.json").read_text("utf-8"))
    want = describe_model(config, seq_len=384).columns()
    row = load_model_architecture().set_index(["source", "model"]).loc[
        ("lambda_pytorch", "BERT-base")]
    for col, value in want.items():
        assert row[col] == pytest.approx(value), col
