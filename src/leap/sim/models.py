"""Model architecture types of the reference fleet: public summaries and hidden cost factors."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from leap.sim.scenario import CATEGORIES

#: Short prefixes of model-type names, by category.
_PREFIX = {"recommendation": "rec", "vision": "vis", "language": "lang", "llm": "llm",
           "speech": "speech", "tabular": "tab", "graph": "gnn"}


@dataclass(frozen=True)
class ModelTypes:
    """One entry per model type, as arrays.

    Public (what an attempt record carries): ``name``, ``category``, ``num_params``,
    ``flops_per_sample`` (training: forward + backward), ``embedding_params``,
    ``num_layers``, ``hidden_dim``, ``seq_len``, ``num_dense_features``,
    ``num_sparse_features`` (NaN where not applicable). Hidden (only throughput reveals
    them): memory traffic and activation bytes per sample, all-to-all bytes per sample,
    the achievable fraction of peak (``eff_cap``), the batch-saturation time, a per-step
    overhead, the compute/communication overlap, the host input-pipeline rate.
    """

    name: np.ndarray
    category: np.ndarray
    num_params: np.ndarray
    flops_per_sample: np.ndarray
    embedding_params: np.ndarray
    num_layers: np.ndarray
    hidden_dim: np.ndarray
    seq_len: np.ndarray
    num_dense_features: np.ndarray
    num_sparse_features: np.ndarray
    dense_params: np.ndarray
    sharded_emb_params: np.ndarray
    bytes_per_sample: np.ndarray
    act_bytes_per_sample: np.ndarray
    a2a_bytes_per_sample: np.ndarray
    eff_cap: np.ndarray
    saturation_s: np.ndarray
    overhead_s: np.ndarray
    overlap: np.ndarray
    host_samples_per_s: np.ndarray
    zero_sharded: np.ndarray
    popularity: np.ndarray

    def __len__(self) -> int:
        return len(self.name)

    @property
    def seq_len_or_one(self) -> np.ndarray:
        return np.where(np.isnan(self.seq_len), 1.0, self.seq_len)

    def index(self) -> dict[str, int]:
        """Name -> position."""
        return {str(n): i for i, n in enumerate(self.name)}


def _ln(rng: np.random.Generator, n: int, median: float, sd: float) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, sd, n))


def _loguniform(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    return np.exp(rng.uniform(np.log(lo), np.log(hi), n))


def _transformer(rng: np.random.Generator, n: int, layers: np.ndarray, hidden: np.ndarray,
                 seq: np.ndarray, vocab: np.ndarray, params_per_layer: float = 12.0
                 ) -> dict[str, np.ndarray]:
    emb = vocab * hidden
    body = params_per_layer * layers * hidden ** 2
    # Training FLOPs: 6 per parameter per token, plus attention scores (12 L h s^2).
    flops = 6.0 * body * seq + 12.0 * layers * hidden * seq ** 2
    return {
        "num_params": body + emb, "dense_params": body + emb, "embedding_params": emb,
        "flops_per_sample": flops, "num_layers": layers, "hidden_dim": hidden, "seq_len": seq,
        "bytes_per_sample": seq * hidden * layers * _ln(rng, n, 40.0, 0.35),
        "act_bytes_per_sample": seq * hidden * layers * _ln(rng, n, 34.0, 0.3),
    }


def _llm(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    params = 10 ** (8.0 + 2.85 * rng.uniform(size=n) ** 1.6)       # 1e8 .. 7e10
    aspect = rng.uniform(50, 130, n)                                # hidden / layers
    hidden = np.maximum(512.0, np.round((params * aspect / 12) ** (1 / 3) / 256) * 256)
    layers = np.maximum(4.0, np.round(params / (12 * hidden ** 2)))
    seq = rng.choice([2048.0, 4096.0, 8192.0], n, p=[0.4, 0.4, 0.2])
    vocab = rng.choice([32000.0, 50257.0, 65536.0, 128256.0], n)
    out = _transformer(rng, n, layers, hidden, seq, vocab)
    # Activation checkpointing: keep layer inputs only, plus one layer's working set.
    out["act_bytes_per_sample"] = seq * hidden * (2 * layers + 34) * _ln(rng, n, 1.0, 0.3)
    out["zero_sharded"] = np.ones(n, dtype=bool)
    out["host_samples_per_s"] = _ln(rng, n, 2e9, 0.3) / (seq * 4)
    return out


def _language(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    layers = rng.choice([6.0, 12.0, 24.0, 36.0, 48.0], n, p=[0.2, 0.35, 0.3, 0.1, 0.05])
    hidden = rng.choice([512.0, 768.0, 1024.0, 1536.0, 2048.0], n, p=[.15, .35, .3, .12, .08])
    seq = rng.choice([128.0, 256.0, 384.0, 512.0], n)
    vocab = rng.choice([30522.0, 50265.0, 120000.0, 250002.0], n, p=[0.4, 0.3, 0.2, 0.1])
    out = _transformer(rng, n, layers, hidden, seq, vocab)
    out["host_samples_per_s"] = _ln(rng, n, 1.5e9, 0.3) / (seq * 40)
    return out


def _speech(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    layers = rng.choice([12.0, 16.0, 17.0, 24.0], n)
    hidden = rng.choice([256.0, 512.0, 768.0, 1024.0], n)
    seq = np.round(_loguniform(rng, n, 250, 2000))                  # frames after subsampling
    out = _transformer(rng, n, layers, hidden, seq, np.full(n, 512.0), params_per_layer=16.0)
    out["bytes_per_sample"] *= 1.5                                  # convolution modules
    out["host_samples_per_s"] = _ln(rng, n, 4e3, 0.4)              # audio decode + features
    return out


def _vision(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    vit = rng.uniform(size=n) < 0.4
    # CNNs: GFLOPs and parameter counts like a model zoo table.
    fwd = 2e9 * 10 ** rng.uniform(-0.7, 1.5, n)                     # forward FLOPs / image
    cnn_params = 10 ** (6.5 + 0.45 * np.log10(fwd / 2e8) + rng.normal(0, 0.25, n))
    cnn_layers = rng.choice([18.0, 34.0, 50.0, 101.0, 152.0, 200.0], n)
    cnn_hidden = rng.choice([512.0, 1024.0, 1280.0, 2048.0], n)
    intensity = 10 ** rng.uniform(1.3, 2.2, n)                      # FLOPs per byte moved
    layers = rng.choice([12.0, 24.0, 32.0, 40.0, 48.0], n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    hidden = rng.choice([384.0, 768.0, 1024.0, 1280.0, 1664.0], n)
    seq = rng.choice([196.0, 256.0, 576.0, 1024.0], n, p=[0.45, 0.2, 0.25, 0.1])
    t = _transformer(rng, n, layers, hidden, seq, np.zeros(n))
    out = {
        "num_params": np.where(vit, t["num_params"], cnn_params),
        "dense_params": np.where(vit, t["dense_params"], cnn_params),
        "embedding_params": np.zeros(n),
        "flops_per_sample": np.where(vit, t["flops_per_sample"], 3 * fwd),
        "num_layers": np.where(vit, layers, cnn_layers),
        "hidden_dim": np.where(vit, hidden, cnn_hidden),
        "seq_len": np.where(vit, seq, np.nan),
        "bytes_per_sample": np.where(vit, t["bytes_per_sample"], 3 * fwd / intensity),
        "act_bytes_per_sample": np.where(vit, t["act_bytes_per_sample"],
                                         fwd / _ln(rng, n, 40.0, 0.3)),
        "host_samples_per_s": _ln(rng, n, 15000.0, 0.5),           # JPEG decode + augment
    }
    return out


def _recommendation(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    sparse = np.round(_loguniform(rng, n, 20, 1000))
    dense_f = np.round(_loguniform(rng, n, 50, 2000))
    emb_dim = rng.choice([32.0, 64.0, 128.0, 256.0], n)
    tables = 10 ** rng.uniform(7.5, 11.0, n)
    mlp = 10 ** rng.uniform(6.0, 8.5, n)
    layers = rng.integers(4, 17, n).astype(np.float64)
    hidden = rng.choice([256.0, 512.0, 1024.0, 2048.0, 4096.0], n)
    pooling = 10 ** rng.uniform(0.0, 1.7, n)                       # lookups per feature
    inter = np.minimum(sparse, 200.0) ** 2 * emb_dim * 6
    return {
        "num_params": tables + mlp, "dense_params": mlp, "embedding_params": tables,
        "sharded_emb_params": tables, "flops_per_sample": 6 * mlp + inter,
        "num_layers": layers, "hidden_dim": hidden, "seq_len": np.full(n, np.nan),
        "num_dense_features": dense_f, "num_sparse_features": sparse,
        # Random row gathers waste most of each memory burst (x2) ...
        "bytes_per_sample": sparse * pooling * emb_dim * 4 * 3 * _ln(rng, n, 2.0, 0.3)
        + hidden * layers * 24,
        "act_bytes_per_sample": (sparse * emb_dim * 8 + hidden * layers * 16)
        * _ln(rng, n, 1.0, 0.3),
        "a2a_bytes_per_sample": sparse * emb_dim * 2 * 2,
        "host_samples_per_s": _ln(rng, n, 4e10, 0.4)
        / (dense_f * 4 + sparse * pooling * 8 + 500),
    }


def _tabular(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    mlp = 10 ** rng.uniform(4.0, 6.7, n)
    layers = rng.integers(2, 9, n).astype(np.float64)
    hidden = np.maximum(16.0, 2 ** np.round(np.log2(np.sqrt(mlp / layers))))
    dense_f = np.round(_loguniform(rng, n, 10, 500))
    sparse = np.where(rng.uniform(size=n) < 0.5, 0.0, np.round(_loguniform(rng, n, 1, 30)))
    emb = sparse * 10 ** rng.uniform(3.0, 5.5, n) * 16
    return {
        "num_params": mlp + emb, "dense_params": mlp + emb, "embedding_params": emb,
        "flops_per_sample": 6 * mlp, "num_layers": layers, "hidden_dim": hidden,
        "seq_len": np.full(n, np.nan), "num_dense_features": dense_f,
        "num_sparse_features": sparse,
        "bytes_per_sample": (dense_f * 4 + sparse * 16 * 12 + hidden * layers * 16)
        * _ln(rng, n, 1.5, 0.3),
        "act_bytes_per_sample": hidden * layers * 16 * _ln(rng, n, 1.0, 0.3) + dense_f * 8,
        "host_samples_per_s": _ln(rng, n, 1e9, 0.4) / (dense_f * 4 + sparse * 8 + 200),
    }


def _graph(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    hidden = rng.choice([64.0, 128.0, 256.0, 512.0, 1024.0], n)
    layers = rng.integers(2, 7, n).astype(np.float64)
    feat = np.round(_loguniform(rng, n, 32, 1024))
    nodes = 10 ** rng.uniform(1.5, 3.7, n)                          # sampled subgraph size
    params = layers * 2 * hidden ** 2 + feat * hidden
    return {
        "num_params": params, "dense_params": params, "embedding_params": np.zeros(n),
        "flops_per_sample": 6 * nodes * params, "num_layers": layers, "hidden_dim": hidden,
        "seq_len": np.full(n, np.nan), "num_dense_features": feat,
        "num_sparse_features": np.full(n, np.nan),
        # Neighbour gathers are irregular: memory-bound well below the roofline ridge.
        "bytes_per_sample": nodes * (feat * 4 + layers * hidden * 12) * _ln(rng, n, 3.0, 0.4),
        "act_bytes_per_sample": nodes * (feat * 4 + layers * hidden * 12),
        "host_samples_per_s": _ln(rng, n, 3e7, 0.4) / nodes,          # CPU neighbour sampling
    }


_MAKERS = {"recommendation": _recommendation, "vision": _vision, "language": _language,
           "llm": _llm, "speech": _speech, "tabular": _tabular, "graph": _graph}
#: Achievable fraction of peak, by category (low, high of a uniform draw per type).
_EFF_CAP = {"recommendation": (0.25, 0.5), "vision": (0.3, 0.6), "language": (0.3, 0.6),
            "llm": (0.35, 0.6), "speech": (0.25, 0.5), "tabular": (0.25, 0.45),
            "graph": (0.25, 0.45)}


def make_model_types(rng: np.random.Generator, n_types: int,
                     category_share: dict[str, float]) -> ModelTypes:
    """Draw ``n_types`` model types; counts per category follow ``category_share``.

    Examples
    --------
    >>> mt = make_model_types(np.random.default_rng(0), 70, {"llm": 1.0, "tabular": 1.0})
    >>> len(mt), sorted(set(mt.category.tolist()))
    (70, [3, 5])
    """
    shares = np.array([category_share.get(c, 0.0) for c in CATEGORIES])
    counts = np.floor(shares / shares.sum() * n_types).astype(np.int64)
    # Give the remainder to the largest shares so the total is exact.
    for i in np.argsort(-shares)[: n_types - int(counts.sum())]:
        counts[i] += 1
    names = [f.name for f in fields(ModelTypes)]
    cols: dict[str, list[np.ndarray]] = {k: [] for k in names}
    for ci, cat in enumerate(CATEGORIES):
        n = int(counts[ci])
        if n == 0:
            continue
        d = _MAKERS[cat](rng, n)
        d.setdefault("sharded_emb_params", np.zeros(n))
        d.setdefault("num_dense_features", np.full(n, np.nan))
        d.setdefault("num_sparse_features", np.full(n, np.nan))
        d.setdefault("a2a_bytes_per_sample", np.zeros(n))
        d.setdefault("zero_sharded", np.zeros(n, dtype=bool))
        lo, hi = _EFF_CAP[cat]
        d["eff_cap"] = rng.uniform(lo, hi, n)
        d["saturation_s"] = _ln(rng, n, 3e-4, 0.4) * np.sqrt(d["num_layers"] / 10)
        d["overhead_s"] = _ln(rng, n, 1.5e-3, 0.4) + d["num_layers"] * 2e-5
        d["overlap"] = rng.uniform(0.3, 0.9, n)
        # A few types are very popular (many families), most have a handful.
        d["popularity"] = rng.pareto(1.3, n) + 0.2
        d["category"] = np.full(n, ci, dtype=np.int64)
        d["name"] = np.array([f"{_PREFIX[cat]}-{i:03d}" for i in range(n)], dtype=object)
        for k in names:
            cols[k].append(np.asarray(d[k]))
    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    return ModelTypes(**arrays)
