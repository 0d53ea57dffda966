"""Dev-time builder of leap's compact benchmark data from the shared public data folder.

Run it from the repository root when the shared data changes::

    python tools/build_datasets.py [--data-dir ../shared/data]

It reads ``real_throughput.csv``, ``hardware_specs.csv``, ``hardware_specs_provenance.csv`` and
``hardware_prices_summary.csv`` and writes, under ``src/leap/datasets/data/``:

- ``throughput.csv.gz``: the measurements, one row per (source, table, model, hardware,
  num_devices, per-device batch_size, precision), median throughput over the raw rows merged;
- ``hardware_specs.csv`` / ``hardware_prices_summary.csv``: verbatim copies (published figures,
  blank where the sources have none), used to check the default catalog;
- ``benchmark_hardware.toml``: a catalog extension with every accelerator type the shipped rows
  use that the default catalog lacks, every figure sourced or marked as an estimate;
- ``benchmark_hardware_provenance.csv``: the field-level source of each figure of that file.

This script is the only code that reads the shared folder; the package reads its own copy.
The output is deterministic (sorted rows, gzip without a timestamp).
"""

from __future__ import annotations

import argparse
import gzip
import io
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
OUT_DIR = REPO / "src" / "leap" / "datasets" / "data"
DEFAULT_DATA_DIR = REPO.parent / "shared" / "data"

sys.path.insert(0, str(REPO / "src"))
from leap.catalog import Catalog  # noqa: E402

#: Sources shipped (all five of the shared combined table).
SOURCES = ("lambda_pytorch", "lambda_tensorflow", "gavel", "sia", "vectorlm")

#: Short, stable table names; a table is one harness/software version within a source.
_LAMBDA_TABLES = {"v0": "v0", "v1": "v1", "v2": "v2"}

#: Task -> optional ``model_category`` of the attempt schema.
TASK_CATEGORY = {
    "image_classification": "vision",
    "object_detection": "vision",
    "instance_segmentation": "vision",
    "image_to_image": "vision",
    "question_answering_finetune": "language",
    "translation": "language",
    "language_modeling": "language",
    "recommendation": "recommendation",
    "speech_recognition": "speech",
    "text_to_speech": "speech",
    "speech_vocoder": "speech",
    "reinforcement_learning": "reinforcement_learning",
    "llm_finetune_full_rank": "llm",
    "llm_finetune_lora": "llm",
}

#: Flags that mark a duplicate of another raw row rather than a suspect value.
DUPLICATE_FLAGS = ("backup_rerun_duplicate", "label_says_GH200_80GB")

KEY = ["source", "table", "model", "hardware", "num_devices", "batch_size", "precision"]

OUT_COLUMNS = [
    "source", "table", "source_commit", "framework", "model", "task", "model_category",
    "dataset", "precision", "precision_note", "hardware", "num_devices", "num_nodes",
    "batch_size", "global_batch_size", "throughput_samples_per_s", "sample_unit",
    "n_raw_rows", "throughput_spread", "flagged", "quality_flags",
]


def _table(row_source: pd.Series, row_version: pd.Series) -> pd.Series:
    out = pd.Series("", index=row_source.index, dtype=object)
    lam = row_source == "lambda_pytorch"
    out[lam] = row_version[lam].str.slice(0, 2).map(_LAMBDA_TABLES)
    out[row_source == "lambda_tensorflow"] = "tf1.15"
    out[row_source == "gavel"] = "osdi20"
    out[row_source == "sia"] = "sosp23"
    vec = row_source == "vectorlm"
    out[vec] = row_version[vec].str.extract(r"@([0-9a-f]{7})", expand=False)
    if (out == "").any() or out.isna().any():
        raise SystemExit("unmapped source_version values: "
                         f"{sorted(row_version[(out == '') | out.isna()].unique())}")
    return out


def _precision(note: pd.Series) -> pd.Series:
    """Map the free-text precision to leap.data.schema.PRECISIONS (None when not stated)."""
    low = note.str.lower()
    out = pd.Series(None, index=note.index, dtype=object)
    out[low.str.startswith("fp16")] = "fp16"
    out[low.str.startswith("fp32")] = "fp32"
    return out


def _add_flag(flags: pd.Series, flag: str) -> pd.Series:
    return flags.where(flags == "", flags + ";") + flag


def build_throughput(raw: pd.DataFrame) -> pd.DataFrame:
    """Deduplicate the combined measurement table to one row per :data:`KEY`."""
    df = raw[raw["source"].isin(SOURCES)].copy()
    df["table"] = _table(df["source"], df["source_version"])
    df["precision_note"] = df["precision"]
    df["precision"] = _precision(df["precision_note"])
    df["model_category"] = df["task"].map(TASK_CATEGORY)
    if df["model_category"].isna().any():
        raise SystemExit(f"unmapped tasks: {sorted(df.loc[df.model_category.isna(), 'task'])}")
    df["flags"] = df["flags"].fillna("")
    # Gavel stores 0 for a configuration that did not run (ResNet-50 batch 128 on K80), and
    # Lambda's batch table says 0 for "not run" on a few v0 cells that do have a throughput.
    zero_tp = df["throughput_samples_per_s"] <= 0
    df.loc[zero_tp, "flags"] = _add_flag(df.loc[zero_tp, "flags"], "zero_throughput_not_run")
    zero_bs = df["batch_size"] <= 0
    df.loc[zero_bs, "flags"] = _add_flag(df.loc[zero_bs, "flags"], "batch_size_missing_in_source")
    df.loc[zero_bs, ["batch_size", "global_batch_size"]] = np.nan
    # Gavel measured each job consolidated (one server) and unconsolidated (workers spread over
    # servers, ~0.74x for multi-GPU). The key cannot hold both shapes, so keep the consolidated
    # measurement, the one whose shape (one host) the attempt mapping states.
    df["_priority"] = np.where((df["source"] == "gavel") & (df["system"] != "consolidated"), 1, 0)
    df["_bs"] = df["batch_size"].fillna(-1.0)
    df["_prec"] = df["precision"].fillna("")
    gkey = ["source", "table", "model", "hardware", "num_devices", "_bs", "_prec"]
    best = df.groupby(gkey)["_priority"].transform("min")
    df = df[df["_priority"] == best]
    # A backup rerun or a mislabelled host duplicates a clean measurement of the same key:
    # where the clean one exists it alone decides. Other flags (super-linear scaling ...) are
    # judgements about the value, so every raw row is merged and the key keeps the flag.
    dup_flag = df["flags"].isin(DUPLICATE_FLAGS)
    clean_exists = (~dup_flag).groupby([df[c] for c in gkey]).transform("any")
    df = df[~(clean_exists & dup_flag)]

    def first(s: pd.Series) -> object:
        return s.iloc[0]

    def nodes_mode(s: pd.Series) -> float:
        s = s.dropna()
        if s.empty:
            return math.nan
        counts = s.value_counts()
        return float(min(counts[counts == counts.max()].index))

    def flags_union(s: pd.Series) -> str:
        return ";".join(sorted({f for v in s for f in v.split(";") if f}))

    g = df.groupby(gkey, sort=True)
    out = g.agg(
        source_commit=("source_commit", first),
        framework=("framework", first),
        task=("task", first),
        model_category=("model_category", first),
        dataset=("dataset", first),
        precision=("precision", first),
        precision_note=("precision_note", first),
        batch_size=("batch_size", first),
        num_nodes=("num_nodes", nodes_mode),
        throughput_samples_per_s=("throughput_samples_per_s", "median"),
        tp_min=("throughput_samples_per_s", "min"),
        tp_max=("throughput_samples_per_s", "max"),
        sample_unit=("sample_unit", first),
        n_raw_rows=("throughput_samples_per_s", "size"),
        quality_flags=("flags", flags_union),
    ).reset_index()
    out["throughput_spread"] = (out["tp_max"] / out["tp_min"]).round(6)
    out["flagged"] = out["quality_flags"] != ""
    out["global_batch_size"] = out["batch_size"] * out["num_devices"]
    # Lambda and VectorLM ran on one host (the combined table says so except for 6 VectorLM
    # 8-GPU rows, left unknown); Gavel's consolidated placement is one server by definition.
    one_host = out["source"].isin(["lambda_pytorch", "lambda_tensorflow"]) | (
        out["source"] == "gavel")
    out.loc[one_host, "num_nodes"] = 1.0
    out["num_nodes"] = out["num_nodes"].astype("Int64")
    out["num_devices"] = out["num_devices"].astype("int64")
    out["batch_size"] = out["batch_size"].astype("Int64")
    out["global_batch_size"] = out["global_batch_size"].astype("Int64")
    out["throughput_samples_per_s"] = out["throughput_samples_per_s"].round(6)
    out = out[OUT_COLUMNS].sort_values(
        ["source", "table", "model", "precision", "hardware", "num_devices", "batch_size"],
        na_position="first", kind="mergesort").reset_index(drop=True)
    dup = out.duplicated(KEY, keep=False)
    if dup.any():
        raise SystemExit(f"dedupe left {int(dup.sum())} duplicate keys")
    return out


# ---------------------------------------------------------------------------------------------
# Catalog extension
# ---------------------------------------------------------------------------------------------

GENERAL = "estimate (general knowledge of the product's configuration; not in the shared sources)"

#: Figures the shared specs lack, for types the shipped rows use: value and why.
MANUAL_ESTIMATES: dict[tuple[str, str], tuple[float, str]] = {
    ("Titan-RTX", "memory_gb"): (24.0, "mlco2/impact data/gpus.csv @d0d3ee5 row 'Titan RTX' "
                                       "(memory column)"),
    ("Titan-RTX", "mem_bw_gb_per_s"): (672.0, "estimate: same as Quadro-RTX-6000 (same TU102 die, "
                                              "384-bit GDDR6)"),
    ("RTX-3070", "memory_gb"): (8.0, GENERAL),
    ("RTX-3070", "mem_bw_gb_per_s"): (448.0, GENERAL),
    ("RTX-A4500", "year"): (2021, GENERAL),
    ("RTX-A4500", "peak_fp32_tflops"): (23.65, GENERAL),
    ("RTX-A4500", "memory_gb"): (20.0, GENERAL),
    ("RTX-A4500", "mem_bw_gb_per_s"): (640.0, GENERAL),
    ("RTX-A5500", "memory_gb"): (24.0, GENERAL),
    ("RTX-A5500", "mem_bw_gb_per_s"): (768.0, GENERAL),
    ("RTX-6000-Ada", "memory_gb"): (48.0, GENERAL),
    ("RTX-6000-Ada", "mem_bw_gb_per_s"): (960.0, GENERAL),
    ("RTX-2080-Super-MaxQ-Laptop", "memory_gb"): (8.0, GENERAL),
    ("RTX-2080-Super-MaxQ-Laptop", "mem_bw_gb_per_s"): (352.0, GENERAL),
    ("RTX-2080-MaxQ-Laptop", "memory_gb"): (8.0, GENERAL),
    ("RTX-2080-MaxQ-Laptop", "mem_bw_gb_per_s"): (384.0, GENERAL),
    ("RTX-2070-MaxQ-Laptop", "memory_gb"): (8.0, GENERAL),
    ("RTX-2070-MaxQ-Laptop", "mem_bw_gb_per_s"): (384.0, GENERAL),
    ("RTX-3080-MaxQ-Laptop", "memory_gb"): (8.0, GENERAL),
    ("RTX-3080-MaxQ-Laptop", "mem_bw_gb_per_s"): (384.0, GENERAL),
}

#: Missing 16-bit peaks: scale the type's fp32 peak by a published sibling's 16-bit/fp32 ratio
#: (same die family and tensor-core generation); ``None`` = no fast 16-bit math, use fp32.
PEAK16_SIBLING: dict[str, str | None] = {
    "K80": None, "GTX-1080Ti": None,
    "Titan-RTX": "T4", "Quadro-RTX-5000": "T4", "Quadro-RTX-6000": "T4",
    "Quadro-RTX-8000": "T4", "RTX-2080-Super-MaxQ-Laptop": "T4",
    "RTX-2080-MaxQ-Laptop": "T4", "RTX-2070-MaxQ-Laptop": "T4",
    "RTX-3070": "RTX-A6000", "RTX-3080": "RTX-A6000", "RTX-3090": "RTX-A6000",
    "RTX-A4000": "RTX-A6000", "RTX-A5000": "RTX-A6000", "RTX-A5500": "RTX-A6000",
    "RTX-3080-MaxQ-Laptop": "RTX-A6000", "RTX-6000-Ada": "L40S",
}

#: Types with no public price quote: sibling whose median quote stands in.
PRICE_SIBLING: dict[str, tuple[str, str]] = {
    "V100-PCIe-32GB": ("V100-PCIe-16GB", "the 16 GB variant"),
    "Titan-RTX": ("Quadro-RTX-6000", "same TU102 die and memory"),
    "Quadro-RTX-8000": ("Quadro-RTX-6000", "same TU102 die, twice the memory"),
    "GTX-1080Ti": ("RTX-2080Ti", "consumer marketplace class"),
    "RTX-A5500": ("RTX-A5000", "nearest workstation sibling"),
    "RTX-2080-Super-MaxQ-Laptop": ("RTX-2080Ti", "laptop part, not rented; consumer class"),
    "RTX-2080-MaxQ-Laptop": ("RTX-2080Ti", "laptop part, not rented; consumer class"),
    "RTX-2070-MaxQ-Laptop": ("RTX-2080Ti", "laptop part, not rented; consumer class"),
    "RTX-3080-MaxQ-Laptop": ("RTX-3070", "laptop part, not rented; consumer class"),
}

_SPEC_FIELD = {  # catalog field -> hardware_specs.csv column
    "year": "year", "devices_per_host": "devices_per_host_typical",
    "peak_fp32_tflops": "peak_fp32_tflops", "memory_gb": "memory_gb",
    "mem_bw_gb_per_s": "mem_bw_gbps", "intra_node_bw_gb_per_s": "intra_node_bw_GBps_unidir",
    "inter_node_bw_gbit_per_s": "inter_node_bw_Gbps_per_device",
}
_NIC = "typical NIC per device for this class (estimate)"


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(round(v, 4))
    text = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def build_catalog_extension(
    used: list[str], specs: pd.DataFrame, prov: pd.DataFrame, prices: pd.DataFrame,
) -> tuple[str, pd.DataFrame]:
    """TOML text and field-level provenance for the used types the default catalog lacks."""
    default = Catalog.default()
    sp = specs.set_index("hardware")
    pr = prices.set_index("hardware")
    known = set(default.names)  # `in` on a Catalog raises for unknown names
    new = [h for h in used if h not in known]
    missing_specs = [h for h in new if h not in sp.index]
    if missing_specs:
        raise SystemExit(f"hardware without a hardware_specs.csv row: {missing_specs}")
    blocks = [
        "# leap benchmark hardware: catalog extension for the accelerator types in",
        "# leap.datasets (public measured throughput) that the default catalog lacks.",
        "# Built by tools/build_datasets.py from the shared hardware_specs.csv (Epoch AI chip",
        "# dataset + ml-engineering / llm-analysis gap fillers) and hardware_prices_summary.csv",
        "# (median public on-demand quote, USD per accelerator-hour). Field-level sources:",
        "# benchmark_hardware_provenance.csv. Estimated figures are named in each entry's notes.",
        "# Load with Catalog.load(path) (or `leap --catalog <path> ...`): default + these types.",
        "",
    ]
    rows: list[dict[str, str]] = []
    for name in new:
        r = sp.loc[name]
        estimates: list[str] = []
        values: dict[str, object] = {"name": name, "vendor": r["vendor"],
                                     "architecture": r["architecture"]}

        def record(field: str, value: object, source: str, hw: str = name) -> None:
            rows.append({"hardware": hw, "field": field, "value": str(value), "source": source})

        def sourced(field: str, column: str, hw: str = name) -> str:
            hit = prov[(prov["hardware"] == hw) & (prov["field"] == column)]
            return str(hit["source"].iloc[0]) if len(hit) else "hardware_specs.csv"

        for field in ("vendor", "architecture"):
            record(field, r[field], sourced(field, field))
        for field, column in _SPEC_FIELD.items():
            v = r[column]
            if pd.notna(v):
                value: float | int = int(v) if field in ("year", "devices_per_host") else float(v)
                record(field, value, sourced(field, column))
            elif (name, field) in MANUAL_ESTIMATES:
                value, why = MANUAL_ESTIMATES[(name, field)]
                value = int(value) if field == "year" else float(value)
                record(field, value, why)
                estimates.append(f"{field}: {why}")
            elif field == "inter_node_bw_gbit_per_s":
                value = 10.0 if "laptop" in str(r["form_factor"]) else 100.0
                record(field, value, _NIC)
                estimates.append(f"{field}: {_NIC}")
            elif field == "intra_node_bw_gb_per_s":
                value = 16.0
                why = "estimate: PCIe 3.0 x16 (16 GB/s), the bus of this GPU generation"
                record(field, value, why)
                estimates.append(f"{field}: {why}")
            else:
                raise SystemExit(f"{name}: no value and no estimate rule for '{field}'")
            values[field] = value
        # 16-bit peak: bf16 where supported, else fp16 tensor (the catalog's definition).
        b16 = r["peak_bf16_tflops"] if pd.notna(r["peak_bf16_tflops"]) else r["peak_fp16_tflops"]
        if pd.notna(b16):
            column = "peak_bf16_tflops" if pd.notna(r["peak_bf16_tflops"]) else "peak_fp16_tflops"
            values["peak_bf16_tflops"] = float(b16)
            record("peak_bf16_tflops", float(b16), sourced("peak_bf16_tflops", column))
        else:
            sib = PEAK16_SIBLING[name]
            fp32 = float(values["peak_fp32_tflops"])  # type: ignore[arg-type]
            if sib is None:
                v16 = fp32
                why = ("estimate: fp32 peak (no tensor cores / no fast 16-bit math, so mixed "
                       "precision runs at about the fp32 rate)")
            else:
                s = sp.loc[sib]
                s16 = s["peak_bf16_tflops"] if pd.notna(s["peak_bf16_tflops"]) else s[
                    "peak_fp16_tflops"]
                ratio = float(s16) / float(s["peak_fp32_tflops"])
                v16 = round(fp32 * ratio, 2)
                why = (f"estimate: fp32 peak x {ratio:.3f}, the published 16-bit/fp32 ratio of "
                       f"{sib} (same tensor-core generation); not in the shared sources")
            values["peak_bf16_tflops"] = v16
            record("peak_bf16_tflops", v16, why)
            estimates.append(f"peak_bf16_tflops: {why}")
        if name in pr.index:
            p = pr.loc[name]
            cost = float(p["median_usd"])
            cost_source = (f"median of {int(p['n_quotes'])} public on-demand quotes "
                           f"({p['basis']}; {p['clouds']})")
        else:
            sib, why = PRICE_SIBLING[name]
            cost = float(pr.loc[sib, "median_usd"])
            cost_source = (f"estimate: {sib} median quote ({cost}) ({why}); no public quote in "
                           "the shared price tables")
        values["cost_per_device_hour"] = cost
        record("cost_per_device_hour", cost, cost_source)
        values["premium"] = False
        values["min_utilization"] = 0.0
        primary = str(r["source"]).split("primary: ", 1)[-1]
        values["spec_source"] = ("field-level sources in benchmark_hardware_provenance.csv; "
                                 f"primary: {primary}")
        values["cost_source"] = cost_source
        notes = "; ".join(estimates)
        if isinstance(r["notes"], str) and r["notes"]:
            notes = (notes + "; " if notes else "") + f"spec note: {r['notes']}"
        if notes:
            values["notes"] = notes
        order = ["name", "vendor", "architecture", "year", "devices_per_host",
                 "peak_bf16_tflops", "peak_fp32_tflops", "memory_gb", "mem_bw_gb_per_s",
                 "intra_node_bw_gb_per_s", "inter_node_bw_gbit_per_s",
                 "cost_per_device_hour", "premium", "min_utilization", "spec_source",
                 "cost_source", "notes"]
        blocks.append("[[hardware]]")
        blocks.extend(f"{k} = {_fmt(values[k])}" for k in order if k in values)
        blocks.append("")
    return "\n".join(blocks), pd.DataFrame(rows, columns=["hardware", "field", "value", "source"])


def _write_gzip_csv(frame: pd.DataFrame, path: Path) -> None:
    buf = io.StringIO()
    frame.to_csv(buf, index=False, lineterminator="\n")
    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0,
                                                  filename="", compresslevel=9) as gz:
        gz.write(buf.getvalue().encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    data: Path = args.data_dir
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)

    raw = pd.read_csv(data / "real_throughput.csv", dtype={"flags": str})
    tp = build_throughput(raw)
    _write_gzip_csv(tp, out / "throughput.csv.gz")

    specs = pd.read_csv(data / "hardware_specs.csv")
    prices = pd.read_csv(data / "hardware_prices_summary.csv")
    prov = pd.read_csv(data / "hardware_specs_provenance.csv")
    shutil.copyfile(data / "hardware_specs.csv", out / "hardware_specs.csv")
    shutil.copyfile(data / "hardware_prices_summary.csv", out / "hardware_prices_summary.csv")
    used = sorted(tp["hardware"].unique())
    toml_text, provenance = build_catalog_extension(used, specs, prov, prices)
    (out / "benchmark_hardware.toml").write_text(toml_text, encoding="utf-8")
    provenance.to_csv(out / "benchmark_hardware_provenance.csv", index=False,
                      lineterminator="\n")

    cat = Catalog.load(out / "benchmark_hardware.toml")
    uncovered = sorted(set(used) - set(cat.names))
    if uncovered:
        raise SystemExit(f"benchmark catalog misses {uncovered}")
    print(f"throughput rows: {len(tp)} (from {len(raw)} raw rows)")
    print(tp.groupby("source").size().to_string())
    print(f"flagged rows kept: {int(tp['flagged'].sum())}")
    print(f"hardware types used: {len(used)}; added to the default catalog: "
          f"{len(cat) - len(Catalog.default())}")
    for p in sorted(out.iterdir()):
        print(f"  {p.name}: {p.stat().st_size / 1024:.1f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
