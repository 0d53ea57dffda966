"""leap.arch: the architecture summary from a model's config.json, against published figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap.arch import SUMMARY_COLUMNS, describe_model
from leap.data.schema import OPTIONAL
from leap.errors import DataError

CONFIGS = Path(__file__).parent / "data" / "model_configs"


def load(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text("utf-8"))


# (config, published parameter count, where the figure is published). The configs in
# tests/data/model_configs are the public config.json files of the Hugging Face model pages
# named, copied as data (no download at run time).
PUBLISHED = [
    ("llama-2-7b", 6.74e9, "Llama 2 model card (meta-llama/Llama-2-7b-hf): 6.74B "
     "(Touvron et al. 2023 name it 7B)"),
    ("mistral-7b-v0.1", 7.3e9, "Mistral AI, 'Announcing Mistral 7B' (2023): "
     "'a 7.3B parameter model'"),
    ("mixtral-8x7b-v0.1", 46.7e9, "Mistral AI, 'Mixtral of experts' (2023): "
     "'46.7B total parameters'"),
    ("gpt2", 124e6, "Hugging Face gpt2 model card: 'the smallest version of GPT-2, "
     "with 124M parameters'"),
    ("pythia-160m", 162_322_944, "Biderman et al. 2023 (Pythia), table 1 / the pythia README: "
     "162,322,944 total parameters"),
    ("bert-base-uncased", 110e6, "Devlin et al. 2019 (BERT), section 3: "
     "BERT-BASE total parameters = 110M"),
    ("roberta-base", 125e6, "Hugging Face roberta-base model card / fairseq RoBERTa README: "
     "125M parameters"),
    ("vit-base-patch16-224", 86e6, "Dosovitskiy et al. 2021 (ViT), table 1: ViT-Base 86M"),
    ("dlrm-criteo-kaggle", 540e6, "Naumov et al. 2019 (DLRM), section 6: the Criteo Kaggle "
     "models 'have approximately 540M parameters'"),
]


@pytest.mark.parametrize(("name", "published", "source"), PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_parameter_count_within_2_percent_of_published(name: str, published: float,
                                                       source: str) -> None:
    s = describe_model(load(name), origin=name)
    assert abs(s.num_params / published - 1) < 0.02, (name, s.num_params, source)


def test_exact_counts_where_the_published_figure_is_exact() -> None:
    # Llama-2-7b's safetensors total and Pythia's table are exact counts, so the formulas are.
    assert describe_model(load("llama-2-7b")).num_params == 6_738_415_616
    pythia = describe_model(load("pythia-160m"))
    assert pythia.num_params == 162_322_944
    # Pythia's table also gives 85,056,000 non-embedding parameters (both embedding matrices
    # out): ours counts the untied output matrix as a weight, the input one as a look-up.
    assert pythia.num_params - 2 * pythia.embedding_params == 85_056_000


def test_mixture_of_experts_counts_every_expert_and_flops_use_the_active_ones() -> None:
    s = describe_model(load("mixtral-8x7b-v0.1"), seq_len=4096)
    # Mistral AI: "uses 12.9B parameters per token".
    assert abs(s.active_params / 12.9e9 - 1) < 0.02
    dense = describe_model({**load("mixtral-8x7b-v0.1"), "num_local_experts": 2,
                            "model_type": "mixtral"}, seq_len=4096)
    assert s.num_params > 3 * dense.num_params
    # Two of eight experts active: the same FLOPs as a two-expert model of the same shape
    # (only the router, 8 vs 2 columns, differs).
    assert s.flops_per_sample == pytest.approx(dense.flops_per_sample, rel=1e-4)


def test_flops_follow_the_documented_formula() -> None:
    s = describe_model(load("llama-2-7b"), seq_len=2048)
    d, layers, vocab = 4096, 32, 32000
    matmul = layers * (4 * d * d + 3 * d * 11008) + vocab * d
    expected = 2048 * (6 * matmul + 12 * layers * d * 2048)
    assert s.flops_per_sample == pytest.approx(expected)
    # The 6N rule of thumb (N = all parameters) is within 15% at this length.
    assert s.flops_per_sample == pytest.approx(6 * s.num_params * 2048, rel=0.15)


def test_flops_grow_with_sequence_length_and_the_window_caps_attention() -> None:
    short = describe_model(load("llama-2-7b"), seq_len=512)
    long = describe_model(load("llama-2-7b"), seq_len=4096)
    # Per token, longer contexts cost more (attention); per sample at least 8x more.
    assert long.flops_per_sample / 4096 > short.flops_per_sample / 512
    assert long.seq_len == 4096 and short.seq_len == 512
    mistral = load("mistral-7b-v0.1")
    windowed = describe_model(mistral, seq_len=16384)
    unwindowed = describe_model({**mistral, "sliding_window": None}, seq_len=16384)
    assert windowed.flops_per_sample < unwindowed.flops_per_sample


def test_vision_transformer_sequence_is_its_patches_plus_the_class_token() -> None:
    s = describe_model(load("vit-base-patch16-224"), seq_len=9999)  # fixed by the image
    assert s.seq_len == 14 * 14 + 1
    # timm's vit_base_patch16_224 model card: 17.6 GMACs forward at 224; training FLOPs are
    # 3 (forward + backward) x 2 (FLOPs per multiply-add) x MACs.
    assert s.flops_per_sample == pytest.approx(6 * 17.6e9, rel=0.03)


def test_dlrm_fills_the_recommendation_columns() -> None:
    s = describe_model(load("dlrm-criteo-kaggle"))
    cols = s.columns()
    assert cols["num_sparse_features"] == 26 and cols["num_dense_features"] == 13
    assert cols["seq_len"] is None
    # Bottom MLP 13-512-256-64-16 by hand, weights and biases.
    bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16
    top = (16 + 27 * 26 // 2) * 512 + 512 + 512 * 256 + 256 + 256 + 1
    assert s.num_params - s.embedding_params == bottom + top
    assert s.model_category == "recommendation"


def test_summary_columns_are_attempt_schema_columns() -> None:
    for name, *_ in PUBLISHED:
        cols = describe_model(load(name)).columns()
        assert set(SUMMARY_COLUMNS) <= set(cols) <= set(OPTIONAL)
        assert all(v is None or v > 0 for v in cols.values())


def test_encoders_default_to_their_longest_input() -> None:
    assert describe_model(load("bert-base-uncased")).seq_len == 512
    assert describe_model(load("roberta-base")).seq_len == 512  # 514 positions, 2 reserved


@pytest.mark.parametrize(("config", "match"), [
    ({"hidden_size": 8}, "field 'model_type' is required"),
    ({"model_type": "lama"}, "model_type 'lama' is not supported; did you mean 'llama'"),
    ({"model_type": "llama", "hidden_size": 64}, "field 'num_hidden_layers' is required"),
    ({"model_type": "gpt2", "n_embd": "768"}, "field 'n_embd' must be a whole number"),
    ({"model_type": "gpt2", "n_embd": 768, "n_layer": True},
     "field 'n_layer' must be a whole number"),
    ({"model_type": "vit", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
      "intermediate_size": 8, "image_size": 10, "patch_size": 3}, "multiple of 'patch_size'"),
    ({"model_type": "dlrm", "num_dense_features": 4, "embedding_dim": 8,
      "embedding_table_sizes": [10], "bottom_mlp": [16], "top_mlp": [1]},
     "'bottom_mlp' must end at embedding_dim"),
    ({"model_type": "dlrm", "num_dense_features": 4, "embedding_dim": 8,
      "embedding_table_sizes": "10", "bottom_mlp": [8], "top_mlp": [1]},
     "'embedding_table_sizes' must be a non-empty list"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_configs_are_one_line_errors_naming_the_field(config: object, match: str) -> None:
    with pytest.raises(DataError, match=match) as info:
        describe_model(config, origin="cfg.json")  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and str(info.value).startswith("cfg.json")


def test_bad_seq_len_is_refused() -> None:
    with pytest.raises(DataError, match="seq_len must be a whole number >= 1"):
        describe_model(load("gpt2"), seq_len=0)
