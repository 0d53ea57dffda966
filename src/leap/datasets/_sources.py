"""Where each shipped measurement comes from: repository, commit, license, units and caveats."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class SourceTable:
    """One table of a source: a harness or software version measured at one snapshot.

    ``snapshot`` is the UTC commit date of the copied files; :func:`leap.datasets.to_attempts`
    derives its synthetic ``submitted_at`` from it.
    """

    name: str
    commit: str
    snapshot: datetime
    description: str


@dataclass(frozen=True)
class Source:
    """Metadata of one public measurement source shipped in :mod:`leap.datasets`."""

    name: str
    title: str
    repo: str
    license: str
    redistribution: str
    hardware: str
    unit_notes: str
    batch_notes: str
    precision_notes: str
    trust: str
    tables: tuple[SourceTable, ...]

    def table(self, name: str) -> SourceTable:
        """The table called ``name`` (raises ``KeyError`` when absent)."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)


def _utc(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=UTC)


_LAMBDA_HEAD = "aa5addb6a53675a649a80036dad548f1c27cbcc4"

#: Every source in the compact copy, by name (the ``source`` column of the dataset).
SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            name="lambda_pytorch",
            title="Lambda Labs PyTorch GPU training benchmark (NVIDIA DeepLearningExamples)",
            repo="https://github.com/lambdal/deeplearning-benchmark",
            license="none: no LICENSE file in the repository at any commit",
            redistribution=(
                "Lambda publishes the same numbers on its public 'GPU benchmarks' web page; the "
                "repository has no licence. Fine for evaluation; ask Lambda before "
                "redistributing the figures in another product."
            ),
            hardware="33 GPU types, GTX 1080 Ti to H100/H200/GH200/B200; 1-8 GPUs on one node",
            unit_notes=(
                "Whole-node throughput in each model's own unit: SSD/ResNet-50/Mask R-CNN "
                "images/s; BERT sequences/s; GNMT and Transformer-XL tokens/s; NCF user-item "
                "pairs/s; Tacotron 2 mel frames/s; WaveGlow audio samples/s."
            ),
            batch_notes=(
                "Per-device batch = the table's global batch / GPU count; Lambda sized the "
                "batch per GPU to fit its memory, so batch differs across hardware."
            ),
            precision_notes=(
                "'fp16' = AMP for ResNet-50 and SSD, fp16 mixed for the others; 'fp32' = fp32 "
                "as stated (NGC containers may use TF32 on Ampere and later)."
            ),
            trust=(
                "High for single-GPU rows. Some multi-GPU cells are clearly wrong (v1 NCF up "
                "to 47x super-linear, v2 8-GPU BERT-base): flagged superlinear_vs_1gpu_suspect."
            ),
            tables=(
                SourceTable("v0", "67a9bb5128d51299376bc72e02ec7459f82efe38", _utc(2022, 7, 6),
                            "2020-2022 table, NGC PyTorch 20.01 (pre-Ampere) / 20.10 (Ampere)"),
                SourceTable("v1", _LAMBDA_HEAD, _utc(2025, 12, 17),
                            "2022-2024 table, NGC PyTorch 22.10"),
                SourceTable("v2", _LAMBDA_HEAD, _utc(2025, 12, 17),
                            "2024-2025 runs, NGC PyTorch 24.10 (H100, GH200, H200, B200); "
                            "mean over runs, median over server vendors"),
            ),
        ),
        Source(
            name="lambda_tensorflow",
            title="Lambda Labs TensorFlow 1.15 tf_cnn_benchmarks (synthetic ImageNet data)",
            repo="https://github.com/LambdaColdStorage/lambda-tensorflow-benchmark",
            license="BSD-3-Clause-style (Copyright (c) 2018, Lambda Labs, Inc.)",
            redistribution="Redistribution permitted with the copyright notice (BSD-3 terms).",
            hardware="11 GPU types (GTX 1080 Ti to A100 PCIe), 1-8 GPUs on one node",
            unit_notes="Whole-node images/s with synthetic input (no data-loading cost).",
            batch_notes="Per-device batch = the table's global batch / GPU count.",
            precision_notes="'fp16' = mixed precision, 'fp32' = fp32, as the file names say.",
            trust="Medium-high: real measurements, synthetic input, old software stack.",
            tables=(
                SourceTable("tf1.15", "e086e0e7d88a19991642d0774793693d4b7cbe46",
                            _utc(2021, 10, 30), "TensorFlow 1.15 with XLA, 2020-2021"),
            ),
        ),
        Source(
            name="gavel",
            title="Gavel (OSDI'20) measured isolated throughputs",
            repo="https://github.com/stanford-futuredata/gavel",
            license="MIT (Copyright (c) 2020 Stanford Future Data Systems)",
            redistribution="Redistribution permitted with the copyright notice (MIT terms).",
            hardware="K80 (one GK210 die), P100 16 GB, V100 16 GB SXM2 (hardware mapping assumed)",
            unit_notes=(
                "Gavel stores training steps/s summed over workers; converted to samples/s = "
                "steps/s x per-worker batch. A3C has no batch size and stays in steps/s "
                "(flagged no_batch_size_throughput_in_steps)."
            ),
            batch_notes="The batch in Gavel's job names is per worker (one worker per GPU).",
            precision_notes="fp32 (no AMP in the workloads; assumed).",
            trust=(
                "High, but old GPUs and small models. Only the consolidated (one-server) "
                "measurement of each job is kept; the unconsolidated one is a different shape."
            ),
            tables=(
                SourceTable("osdi20", "c4fa40097339e9608ab71fd64c8bdea96a5e4a4c",
                            _utc(2022, 1, 15),
                            "scheduler/simulation_throughputs.json, isolated ('null') entries"),
            ),
        ),
        Source(
            name="sia",
            title="Sia (SOSP'23) / Pollux (OSDI'21) per-placement step-time profiles",
            repo="https://github.com/siasosp23/artifacts",
            license=(
                "none at the artifact root; the upstream code it modifies (petuum/adaptdl) is "
                "Apache-2.0"
            ),
            redistribution=(
                "Research artifact data without a licence file: cite the Sia paper; ask the "
                "authors before redistributing in another product."
            ),
            hardware=(
                "T4 (AWS g4dn), V100 32 GB SXM2 (Azure ND40rs_v2), A100 40 GB SXM4 (DGX), "
                "Quadro RTX 6000, RTX 2080 Ti; up to 64 GPUs over up to 16 nodes"
            ),
            unit_notes=(
                "samples/s = replicas x local batch / step time (step time includes gradient "
                "sync). BERT sequences/s, ResNet images/s, DeepSpeech2 utterances/s, NCF "
                "user-item pairs/s, YOLOv3 images/s."
            ),
            batch_notes=(
                "local_bsz is per GPU. The placements and scalability files overlap: one row "
                "per (model, hardware, GPUs, batch) is kept, the median over placements; "
                "num_nodes is the most common host count among them (ties: fewer hosts)."
            ),
            precision_notes="Not stated; fp32 assumed (TF32 possible on A100).",
            trust="High, dense grid; NCF step times are milliseconds, so overhead-sensitive.",
            tables=(
                SourceTable("sosp23", "aaf7a0de7b6cb5eab06ea020467ede5d2fd18e70",
                            _utc(2023, 8, 15), "sia-simulator/traces placements + scalability"),
            ),
        ),
        Source(
            name="vectorlm",
            title="VectorLM reference LLM fine-tuning throughput",
            repo="https://github.com/VectorInstitute/vectorlm",
            license="MIT (Copyright (c) 2024 Muhammad Adil Asif)",
            redistribution="Redistribution permitted with the copyright notice (MIT terms).",
            hardware="A100 80 GB SXM4, A40, T4; 1-8 GPUs",
            unit_notes="Tokens/s summed over GPUs (flagged throughput_in_tokens).",
            batch_notes="Per-device batch as the table states (8, or the best of 2/4/8).",
            precision_notes="Not stated (mixed precision likely): precision left missing.",
            trust="Low-medium: single runs and a few odd values.",
            tables=(
                SourceTable("ce1eaa3", "ce1eaa30c095d903f0fd923594968da48d78a45d",
                            _utc(2024, 4, 26), "docs/reference_throughput.md, 2024-04-26"),
                SourceTable("9045f08", "9045f08ac1af38c13100cfabdd17412f57dbffd2",
                            _utc(2024, 5, 28), "docs/reference_throughput.md, 2024-05-28 "
                            "(Meta-Llama-3-8B)"),
            ),
        ),
    )
}
