"""The architecture summary of a model from its definition (a Hugging Face style ``config.json``).

Most users know their model, not its FLOPs per sample. :func:`describe_model` reads the model's
own configuration and returns the summary the attempt record carries (``num_params``,
``embedding_params``, ``flops_per_sample``, ``num_layers``, ``hidden_dim``, ``seq_len``), so a
job can state ``"model_config": {...}`` instead (see :func:`leap.data.jobs.expand_model_config`).

Supported ``model_type`` values and what is counted:

* decoder-only transformers, gated MLP (``llama``, ``mistral``, ``qwen2``, ``gemma``): q/k/v/o
  projections (grouped-query attention: k and v have ``num_key_value_heads`` heads), a gated MLP
  of three ``hidden x intermediate`` matrices, RMSNorm weights, the token embedding, and the
  LM head unless ``tie_word_embeddings``;
* mixture of experts (``mixtral``): as ``mistral`` with ``num_local_experts`` MLPs per layer and
  a router; ``num_params`` counts every expert (it sets the memory), ``active_params`` the
  ``num_experts_per_tok`` a token passes through (it sets the FLOPs);
* GPT-style (``gpt2``, ``gpt_neox``): fused qkv and output projections with biases, a 4x (or
  ``intermediate_size``) MLP, LayerNorms, learned position embeddings (gpt2) or rotary
  (gpt_neox, whose LM head is untied);
* encoders (``bert``, ``roberta``): word, position and token-type embeddings, post-LN layers,
  the pooler (as ``BertModel`` counts it; task heads are not counted);
* vision transformers (``vit``): a patch embedding (a ``channels x patch x patch`` convolution,
  a matmul per patch), a class token and position embeddings; the patches plus the class
  token are the sequence: ``seq_len = (image_size / patch_size)**2 + 1``;
* DLRM-style recommendation models (``dlrm``), a small format of our own::

      {"model_type": "dlrm", "num_dense_features": 13, "embedding_dim": 128,
       "embedding_table_sizes": [rows of each sparse feature's table, ...],
       "bottom_mlp": [512, 256, 128], "top_mlp": [1024, 1024, 512, 256, 1]}

  the bottom MLP maps the dense features to ``embedding_dim`` (its last width must equal
  it), the dot interaction of the ``F + 1`` vectors (F tables plus the bottom output) gives
  ``F (F + 1) / 2`` pairs, concatenated with the bottom output into the top MLP.

FLOPs (training = forward + backward, the backward costing twice the forward): per token,
``6 N + 12 L h d_head s`` where ``N`` are the parameters a token multiplies by (every weight
matrix, the LM head included, embedding look-ups and norms not; the active experts only), and
the second term is attention's two ``s x s`` products (scores and the weighted sum) in ``L``
layers with ``h`` query heads of ``d_head`` over a context of ``s`` tokens (``min(s,
sliding_window)`` where attention is windowed). This is the model-FLOPs count of the PaLM paper
(Chowdhery et al. 2022, appendix B), also Megatron-LM's (Narayanan et al. 2021) without
recomputation; causal masking is not subtracted, as there. ``flops_per_sample = seq_len x``
that per-token figure: a sample is one sequence (one image for a ViT). For a DLRM, ``6 x``
the MLP weights plus ``6 (F + 1)^2 d`` for the interaction (look-ups cost memory traffic, not
FLOPs).

``embedding_params`` are the look-up tables (token, position, token-type, class-token and
sparse-feature tables), which cost memory but no matmul FLOPs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from leap.errors import DataError, did_you_mean

#: The attempt-record columns a summary fills (in :data:`leap.data.schema.OPTIONAL`).
SUMMARY_COLUMNS: tuple[str, ...] = ("num_params", "embedding_params", "flops_per_sample",
                                    "num_layers", "hidden_dim", "seq_len")

_LLAMA_LIKE = ("llama", "mistral", "qwen2", "gemma")
SUPPORTED: tuple[str, ...] = (*_LLAMA_LIKE, "mixtral", "gpt2", "gpt_neox", "bert", "roberta",
                              "vit", "dlrm")
#: The leap model category of each supported type (the simulator's vocabulary).
_CATEGORY = {"bert": "language", "roberta": "language", "vit": "vision",
             "dlrm": "recommendation"}


@dataclass(frozen=True)
class ArchSummary:
    """What :func:`describe_model` works out; the first six fields are attempt columns."""

    num_params: float
    embedding_params: float
    flops_per_sample: float
    num_layers: float
    hidden_dim: float
    seq_len: float | None
    active_params: float
    model_type: str
    model_category: str
    num_dense_features: float | None = None
    num_sparse_features: float | None = None

    def columns(self) -> dict[str, float | None]:
        """The summary under the attempt schema's column names (the DLRM feature counts too)."""
        d = asdict(self)
        out = {c: d[c] for c in SUMMARY_COLUMNS}
        for c in ("num_dense_features", "num_sparse_features"):
            if d[c] is not None:
                out[c] = d[c]
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Config:
    """Typed reads of one config with errors that name the field and where it came from."""

    def __init__(self, config: Mapping[str, Any], origin: str) -> None:
        self.c = config
        self.origin = origin

    def _bad(self, name: str, want: str, got: Any) -> DataError:
        text = repr(got)
        text = text if len(text) <= 40 else text[:37] + "..."
        return DataError(f"{self.origin}: field '{name}' must be {want}, got {text}")

    def count(self, *names: str, default: int | None = None, minimum: int = 1) -> int:
        """The first of ``names`` present (aliases, e.g. ``n_embd`` / ``hidden_size``)."""
        for name in names:
            v = self.c.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) \
                    or not math.isfinite(v):
                raise self._bad(name, "a whole number", v)
            if int(v) < minimum or int(v) > 10**13:
                raise self._bad(name, f"a whole number >= {minimum}", v)
            return int(v)
        if default is not None:
            return default
        alias = f" (or '{names[1]}')" if len(names) > 1 else ""
        raise DataError(f"{self.origin}: field '{names[0]}'{alias} is required for model_type "
                        f"'{self.c.get('model_type')}'")

    def counts(self, name: str) -> list[int]:
        v = self.c.get(name)
        if v is None:
            raise DataError(f"{self.origin}: field '{name}' is required for model_type "
                            f"'{self.c.get('model_type')}'")
        if isinstance(v, str | bytes | Mapping) or not isinstance(v, Sequence) or not v:
            raise self._bad(name, "a non-empty list of whole numbers", v)
        out = []
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) \
                    or x != int(x) or x < 1:
                raise self._bad(name, "a non-empty list of whole numbers >= 1", v)
            out.append(int(x))
        return out

    def flag(self, name: str, default: bool) -> bool:
        v = self.c.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self._bad(name, "true or false", v)
        return v


def read_model_config(path: Path) -> dict[str, Any]:
    """A model definition from a JSON file, checked by :func:`describe_model`.

    Raises
    ------
    DataError
        The file cannot be read, is not a JSON object, or is not a definition leap can
        summarise; the message names the file (and the field).
    """
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise DataError(f"cannot read model config {path}: {why}") from None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    describe_model(config, origin=str(path))
    return dict(config)


def describe_model(config: Mapping[str, Any], *, seq_len: int | None = None,
                   origin: str = "model config") -> ArchSummary:
    """The architecture summary of the model ``config`` defines.

    Parameters
    ----------
    config : mapping
        A Hugging Face style ``config.json`` (``model_type`` selects the family; see the
        module docs), or the DLRM format documented there.
    seq_len : int, optional
        Tokens per sample for the FLOPs; default the config's context length
        (``max_position_embeddings`` / ``n_positions``). A ViT's is fixed by its image and
        patch sizes; a DLRM has none.
    origin : str
        Where the config came from (a file name), for error messages.

    Raises
    ------
    DataError
        Unknown ``model_type``, a missing or ill-typed field; the message names the field.

    Examples
    --------
    >>> s = describe_model({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    ...                     "vocab_size": 50257, "n_positions": 1024})
    >>> round(s.num_params / 1e6, 1), s.seq_len
    (124.4, 1024.0)
    """
    if not isinstance(config, Mapping):
        raise DataError(f"{origin}: expected a JSON object (a config.json), got "
                        f"{type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise DataError(f"{origin}: field 'model_type' is required (one of "
                        f"{', '.join(SUPPORTED)})")
    if model_type not in SUPPORTED:
        raise DataError(f"{origin}: model_type '{model_type}' is not supported"
                        f"{did_you_mean(model_type, SUPPORTED)}; supported: "
                        f"{', '.join(SUPPORTED)}")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int)
                                or seq_len < 1):
        raise DataError(f"{origin}: seq_len must be a whole number >= 1, got {seq_len!r}")
    c = _Config(config, origin)
    if model_type == "dlrm":
        return _dlrm(c)
    if model_type == "vit":
        return _vit(c)
    if model_type in ("bert", "roberta"):
        return _encoder(c, model_type, seq_len)
    if model_type == "gpt2":
        return _gpt2(c, seq_len)
    if model_type == "gpt_neox":
        return _gpt_neox(c, seq_len)
    return _llama_like(c, model_type, seq_len)


def _attention_flops(layers: int, heads: int, head_dim: int, context: int) -> float:
    """Training FLOPs per token of the two ``s x s`` attention products (PaLM, appendix B)."""
    return 12.0 * layers * heads * head_dim * context


def _summary(*, model_type: str, category: str, layers: int, hidden: int, seq: int | None,
             total: float, embedding: float, active: float, matmul_per_token: float,
             attn_per_token: float) -> ArchSummary:
    tokens = 1 if seq is None else seq
    return ArchSummary(num_params=float(total), embedding_params=float(embedding),
                       flops_per_sample=float(tokens * (6.0 * matmul_per_token
                                                        + attn_per_token)),
                       num_layers=float(layers), hidden_dim=float(hidden),
                       seq_len=None if seq is None else float(seq),
                       active_params=float(active), model_type=model_type,
                       model_category=category)


def _context(c: _Config, seq_len: int | None, *names: str) -> int:
    return seq_len if seq_len is not None else c.count(*names)


def _llama_like(c: _Config, model_type: str, seq_len: int | None) -> ArchSummary:
    d = c.count("hidden_size")
    layers = c.count("num_hidden_layers")
    heads = c.count("num_attention_heads")
    kv = c.count("num_key_value_heads", default=heads)
    head_dim = c.count("head_dim", default=d // heads)
    ffn = c.count("intermediate_size")
    vocab = c.count("vocab_size")
    tied = c.flag("tie_word_embeddings", model_type == "gemma")
    # qwen2 has q/k/v biases; llama's are off unless attention_bias says otherwise.
    qkv_bias = c.flag("attention_bias", model_type == "qwen2")
    experts = c.count("num_local_experts", default=1) if model_type == "mixtral" else 1
    active_experts = c.count("num_experts_per_tok", default=2) if experts > 1 else 1
    if active_experts > experts:
        raise DataError(f"{c.origin}: field 'num_experts_per_tok' ({active_experts}) exceeds "
                        f"'num_local_experts' ({experts})")
    attn = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d
    attn_bias = (heads + 2 * kv) * head_dim if qkv_bias else 0
    mlp = 3 * d * ffn
    router = d * experts if experts > 1 else 0
    norms = 2 * d
    embed = vocab * d
    head = 0 if tied else vocab * d
    total = layers * (attn + attn_bias + experts * mlp + router + norms) + d + embed + head
    active = layers * (attn + attn_bias + active_experts * mlp + router + norms) + d + embed + head
    seq = _context(c, seq_len, "max_position_embeddings")
    window = c.count("sliding_window", default=0, minimum=0)
    context = min(seq, window) if window > 0 else seq
    category = "llm" if total >= 1e9 else "language"
    return _summary(model_type=model_type, category=category, layers=layers, hidden=d, seq=seq,
                    total=total, embedding=embed, active=active,
                    matmul_per_token=layers * (attn + active_experts * mlp + router)
                    + vocab * d, attn_per_token=_attention_flops(layers, heads, head_dim,
                                                                 context))


def _gpt_layer(d: int, ffn: int) -> tuple[int, int]:
    """(parameters, matmul weights) of one GPT-style layer: biased qkv/out/MLP, two LayerNorms."""
    matmul = 4 * d * d + 2 * d * ffn
    return matmul + 3 * d + d + ffn + d + 4 * d, matmul


def _gpt2(c: _Config, seq_len: int | None) -> ArchSummary:
    d = c.count("n_embd", "hidden_size")
    layers = c.count("n_layer", "num_hidden_layers")
    heads = c.count("n_head", "num_attention_heads")
    ffn = c.count("n_inner", default=4 * d)
    vocab = c.count("vocab_size")
    positions = c.count("n_positions", "max_position_embeddings")
    per_layer, matmul = _gpt_layer(d, ffn)
    embed = vocab * d + positions * d
    total = layers * per_layer + 2 * d + embed  # the LM head is tied to the token embedding
    seq = seq_len if seq_len is not None else positions
    category = "llm" if total >= 1e9 else "language"
    return _summary(model_type="gpt2", category=category, layers=layers, hidden=d, seq=seq,
                    total=total, embedding=embed, active=total,
                    matmul_per_token=layers * matmul + vocab * d,
                    attn_per_token=_attention_flops(layers, heads, d // heads, seq))


def _gpt_neox(c: _Config, seq_len: int | None) -> ArchSummary:
    d = c.count("hidden_size")
    layers = c.count("num_hidden_layers")
    heads = c.count("num_attention_heads")
    ffn = c.count("intermediate_size", default=4 * d)
    vocab = c.count("vocab_size")
    tied = c.flag("tie_word_embeddings", False)
    per_layer, matmul = _gpt_layer(d, ffn)
    embed = vocab * d
    total = layers * per_layer + 2 * d + embed + (0 if tied else vocab * d)
    seq = _context(c, seq_len, "max_position_embeddings")
    category = "llm" if total >= 1e9 else "language"
    return _summary(model_type="gpt_neox", category=category, layers=layers, hidden=d, seq=seq,
                    total=total, embedding=embed, active=total,
                    matmul_per_token=layers * matmul + vocab * d,
                    attn_per_token=_attention_flops(layers, heads, d // heads, seq))


def _encoder(c: _Config, model_type: str, seq_len: int | None) -> ArchSummary:
    d = c.count("hidden_size")
    layers = c.count("num_hidden_layers")
    heads = c.count("num_attention_heads")
    ffn = c.count("intermediate_size")
    vocab = c.count("vocab_size")
    positions = c.count("max_position_embeddings")
    types = c.count("type_vocab_size", default=2, minimum=0)
    per_layer, matmul = _gpt_layer(d, ffn)
    embed = (vocab + positions + types) * d
    pooler = d * d + d
    total = embed + 2 * d + layers * per_layer + pooler
    # RoBERTa reserves two position slots for its padding offset: 514 positions, 512 tokens.
    longest = positions - 2 if model_type == "roberta" else positions
    seq = seq_len if seq_len is not None else longest
    return _summary(model_type=model_type, category="language", layers=layers, hidden=d,
                    seq=seq, total=total, embedding=embed, active=total,
                    matmul_per_token=layers * matmul,
                    attn_per_token=_attention_flops(layers, heads, d // heads, seq))


def _vit(c: _Config) -> ArchSummary:
    d = c.count("hidden_size")
    layers = c.count("num_hidden_layers")
    heads = c.count("num_attention_heads")
    ffn = c.count("intermediate_size")
    image = c.count("image_size")
    patch = c.count("patch_size")
    channels = c.count("num_channels", default=3)
    if image % patch:
        raise DataError(f"{c.origin}: field 'image_size' ({image}) must be a multiple of "
                        f"'patch_size' ({patch})")
    tokens = (image // patch) ** 2 + 1
    patch_matmul = channels * patch * patch * d
    per_layer, matmul = _gpt_layer(d, ffn)
    embed = d + tokens * d  # class token + position embeddings
    total = patch_matmul + d + embed + layers * per_layer + 2 * d
    return _summary(model_type="vit", category="vision", layers=layers, hidden=d, seq=tokens,
                    total=total, embedding=embed, active=total,
                    matmul_per_token=layers * matmul + patch_matmul,
                    attn_per_token=_attention_flops(layers, heads, d // heads, tokens))


def _mlp(widths: list[int]) -> tuple[int, int]:
    """(parameters, matmul weights) of dense layers ``widths[0] -> widths[1] -> ...``."""
    weights = sum(a * b for a, b in itertools.pairwise(widths))
    return weights + sum(widths[1:]), weights


def _dlrm(c: _Config) -> ArchSummary:
    dense = c.count("num_dense_features", minimum=0)
    dim = c.count("embedding_dim")
    tables = c.counts("embedding_table_sizes")
    bottom = c.counts("bottom_mlp")
    top = c.counts("top_mlp")
    if bottom[-1] != dim:
        raise DataError(f"{c.origin}: field 'bottom_mlp' must end at embedding_dim ({dim}), "
                        f"ends at {bottom[-1]}")
    vectors = len(tables) + 1
    pairs = vectors * (vectors - 1) // 2
    bottom_params, bottom_w = _mlp([dense, *bottom]) if dense else (0, 0)
    top_params, top_w = _mlp([dim + pairs, *top])
    embed = sum(tables) * dim
    total = embed + bottom_params + top_params
    summary = _summary(model_type="dlrm", category="recommendation",
                       layers=len(bottom) + len(top), hidden=dim, seq=None, total=total,
                       embedding=embed, active=total, matmul_per_token=bottom_w + top_w,
                       attn_per_token=6.0 * vectors * vectors * dim)
    return replace(summary, num_dense_features=float(dense), num_sparse_features=float(len(tables)))
