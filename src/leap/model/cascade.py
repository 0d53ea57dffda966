"""The median cascade (router + specialists) and the single global model, on LightGBM (the
split by novelty and what works on every model kind: :mod:`leap.model.split`).

Both predict log throughput with a median objective (LightGBM ``quantile``, alpha 0.5).
Both start boosting from a per-row base margin (the history-adjusted physics estimate, see
:func:`leap.features.encode.base_margin`) and learn the correction on top.

The cascade follows the paper: a multiclass LightGBM router sends each row to one of K
specialists, each trained on one range of log throughput widened by an overlap on both sides,
so a routing mistake near a boundary lands on a specialist that has seen such rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from functools import partial
from typing import Any, Protocol

import lightgbm as lgb
import numpy as np

from leap.errors import ModelError
from leap.memory import release_free_memory
from leap.threads import run_each

#: Below this many rows, prediction runs on one thread.
PARALLEL_ROWS = 2000
#: A compiled booster (:mod:`leap.model.compiled`): rows in, the booster's own predictions out.
Scorer = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class GBMParams:
    """LightGBM settings for one regressor.

    The defaults were chosen on the default simulated fleet (train days 1-30, evaluate day
    31) for speed on 2 cores at no measurable accuracy cost: the trees only learn a
    correction to the base margin, so 63 leaves, 63 bins, half the rows and 60% of the
    features per tree, and a high learning rate suffice (see bench/bench_train.py).
    """

    num_leaves: int = 63
    learning_rate: float = 0.15
    max_rounds: int = 300
    min_data_in_leaf: int = 200
    feature_fraction: float = 0.6
    bagging_fraction: float = 0.5
    #: Rows a booster is fit on at most: a larger training set is sampled down to this many
    #: (uniformly, with the booster's seed) before its Dataset is built. Bagging bounds the
    #: rows a tree's histograms read, but every round still computes gradients, leaf medians
    #: and scores over all of a booster's rows, and its Dataset bins every one of them. No
    #: booster of the default fleet reaches it (the largest, the novel-row model, has about
    #: 244,000 rows); on a fleet four times as large (specialists of about 420,000 rows, the
    #: novel-row model 927,000) it took the fit from 170 s to 123 s, held-out accuracy 87.80%
    #: -> 87.74% (a cap of 250,000: 106 s, 87.49%). It replaced a cap on the rows a tree is
    #: grown on (bagging at most 300,000 rows), which it makes moot.
    max_train_rows: int = 300_000
    max_bin: int = 63
    objective: str = "quantile"  # median; "l2" is the mean ablation
    #: Rounds without a better validation score before a booster stops (and keeps its best
    #: round). 10 rather than 20: on the default fleet's held-out day 87.12% -> 87.13%, on a
    #: fleet four times as large 87.74% -> 87.73%, with 14% and 22% fewer rounds grown.
    early_stopping_rounds: int = 10
    num_threads: int = 2
    seed: int = 0

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> GBMParams:
        """The settings a model was saved with; a setting this leap no longer has (a model
        written by an earlier version) is dropped: fit settings do not change predictions."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in known})

    def lgb_params(self) -> dict[str, Any]:
        p: dict[str, Any] = {
            "objective": self.objective, "num_leaves": self.num_leaves,
            "learning_rate": self.learning_rate, "min_data_in_leaf": self.min_data_in_leaf,
            "feature_fraction": self.feature_fraction, "bagging_fraction": self.bagging_fraction,
            "bagging_freq": 1, "max_bin": self.max_bin, "num_threads": self.num_threads,
            "seed": self.seed, "deterministic": True, "force_row_wise": True, "verbosity": -1,
            "cat_smooth": 10.0, "max_cat_to_onehot": 8,
        }
        if self.objective == "quantile":
            p["alpha"] = 0.5
        return p


def sample_rows(rows: np.ndarray, cap: int, seed: int) -> np.ndarray:
    """``rows`` (ascending positions) as they are, or ``cap`` of them drawn uniformly with
    ``seed``, still ascending.

    >>> sample_rows(np.arange(5), 10, 0).tolist()
    [0, 1, 2, 3, 4]
    >>> len(sample_rows(np.arange(100), 10, 0))
    10
    """
    if len(rows) <= cap:
        return rows
    return rows[np.sort(np.random.default_rng(seed).choice(len(rows), cap, replace=False))]


def _dataset(X: np.ndarray, y: np.ndarray, base: np.ndarray, names: list[str],
             categorical: list[str], max_bin: int,
             reference: lgb.Dataset | None = None) -> lgb.Dataset:
    return lgb.Dataset(X, label=y, init_score=base, feature_name=names,
                       categorical_feature=categorical, reference=reference,
                       params={"max_bin": max_bin, "verbosity": -1},
                       free_raw_data=False)


class Fitter(Protocol):
    """Grows one booster somewhere other than in this process (see
    :class:`leap.model.distributed.DaskFitter`); ``X`` may be a dask array, the rest are
    NumPy. Must honour ``params`` and stop early on ``val`` as :func:`_train` does."""

    def train(self, params: GBMParams, X: Any, y: np.ndarray, init: np.ndarray,
              names: list[str], categorical: list[str],
              val: tuple[np.ndarray, np.ndarray, np.ndarray] | None) -> lgb.Booster: ...


def _train(params: GBMParams, X: np.ndarray, y: np.ndarray, base: np.ndarray,
           names: list[str], categorical: list[str],
           val: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
           fitter: Fitter | None = None) -> tuple[lgb.Booster, float]:
    """Fit one booster from ``base + offset``; returns it and the offset.

    The offset (median residual of the base) plays the role of LightGBM's boost-from-average,
    which it skips when given an init score: without it, a base far from every label gives
    all rows the same quantile gradient, no split gains anything, and boosting stops at once.
    """
    offset = float(np.median(y - base))
    # Leaves need enough rows to take a median from, but a small training set (a few hundred
    # public benchmark rows) must still be able to split: scale the minimum with the data.
    params = replace(params, min_data_in_leaf=min(params.min_data_in_leaf,
                                                  max(5, len(y) // 100)))
    if fitter is not None:
        v = None if val is None or len(val[1]) == 0 else (val[0], val[1], val[2] + offset)
        return fitter.train(params, X, y, base + offset, names, categorical, v), offset
    train_set = _dataset(X, y, base + offset, names, categorical, params.max_bin)
    valid_sets = []
    callbacks: list[Callable[..., Any]] = []
    if val is not None and len(val[1]) > 0:
        valid_sets = [_dataset(val[0], val[1], val[2] + offset, names, categorical,
                               params.max_bin, reference=train_set)]
        callbacks = [lgb.early_stopping(params.early_stopping_rounds, verbose=False)]
    booster = lgb.train(params.lgb_params(), train_set, num_boost_round=params.max_rounds,
                        valid_sets=valid_sets, callbacks=callbacks)
    # A fitted booster keeps its Datasets (raw rows and bins) alive: drop them, or every
    # specialist holds a copy of its rows until the model is published.
    booster.free_dataset()
    del train_set, valid_sets
    release_free_memory()  # boosters grow side by side: not two boosters' rows in free heap
    return booster, offset


def _raw_predict(booster: lgb.Booster, X: np.ndarray, scorer: Scorer | None = None
                 ) -> np.ndarray:
    if scorer is not None:  # checked equal to the booster at load (leap.model.compiled)
        return scorer(X)
    it = booster.best_iteration if booster.best_iteration > 0 else None
    # Waking OpenMP threads costs milliseconds; a launch-time call scores ~20 rows.
    threads = 1 if len(X) < PARALLEL_ROWS else 0
    return np.asarray(booster.predict(X, num_iteration=it, num_threads=threads),
                      dtype=np.float64)


def _predict(booster: lgb.Booster, X: np.ndarray, base: np.ndarray,
             scorer: Scorer | None = None) -> np.ndarray:
    return _raw_predict(booster, X, scorer) + base


def best_iteration(booster: lgb.Booster) -> int | None:
    """The iterations prediction uses (``None``: all), as :func:`_raw_predict` reads them."""
    return booster.best_iteration if booster.best_iteration > 0 else None


class Fitted:
    #: Compiled scorers by booster name (:func:`boosters`); empty: LightGBM scores.
    scorers_: dict[str, Scorer] = {}  # noqa: RUF012 (replaced whole, never mutated)

    def _check_fitted(self) -> None:
        if not getattr(self, "fitted_", False):
            raise ModelError(f"this {type(self).__name__} is not fitted yet; call fit() first")


class GlobalModel(Fitted):
    """One LightGBM regressor for all rows (the ablation the cascade is compared with).

    Examples
    --------
    Not run here (it needs a workspace)::

        m = GlobalModel().fit(X, y, base=b, feature_names=names, categorical=cats)
        log_tp = m.predict(X_new, base=b_new)
    """

    kind = "global"

    def __init__(self, *, params: GBMParams | None = None) -> None:
        self.params = params or GBMParams()

    def fit(self, X: np.ndarray, y: np.ndarray, *, base: np.ndarray, feature_names: list[str],
            categorical: list[str],
            val: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
            train: np.ndarray | None = None, fitter: Fitter | None = None) -> GlobalModel:
        """Fit on the rows ``train`` marks (default: all), early-stopping on ``val``;
        ``fitter`` grows the booster elsewhere (default: here)."""
        rows = None if train is None else np.flatnonzero(train)
        _check_xy(X, y, rows)
        if rows is None and len(y) > self.params.max_train_rows:
            rows = np.arange(len(y))
        if rows is not None:
            rows = sample_rows(rows, self.params.max_train_rows, self.params.seed)
            X, y, base = X[rows], y[rows], base[rows]
        self.booster_, self.offset_ = _train(self.params, X, y, base, feature_names,
                                             categorical, val, fitter)
        self.feature_names_ = list(feature_names)
        self.fitted_ = True
        return self

    def predict(self, X: np.ndarray, *, base: np.ndarray) -> np.ndarray:
        """Predicted log throughput per row."""
        self._check_fitted()
        return _predict(self.booster_, X, base + self.offset_, self.scorers_.get("global"))

    # Serialisation: LightGBM text models + JSON, never pickle.
    def to_files(self) -> dict[str, str]:
        self._check_fitted()
        meta = {"kind": self.kind, "params": asdict(self.params), "offset": self.offset_,
                "feature_names": self.feature_names_}
        return {"model.json": json.dumps(meta, indent=2),
                "global.txt": self.booster_.model_to_string()}

    @classmethod
    def from_files(cls, files: dict[str, str]) -> GlobalModel:
        meta = json.loads(files["model.json"])
        m = cls(params=GBMParams.from_dict(meta["params"]))
        m.booster_ = lgb.Booster(model_str=files["global.txt"])
        m.offset_ = float(meta["offset"])
        m.feature_names_ = meta["feature_names"]
        m.fitted_ = True
        return m


class CascadeModel(Fitted):
    """A router and K median specialists over ranges of log throughput (default K = 13).

    Parameters
    ----------
    n_specialists : int
        K, the number of log-throughput ranges (equal-frequency bins of the training target).
    overlap : float
        How far each specialist's training range reaches into its neighbours, as a fraction
        of the neighbouring bin's width (0.5 = half of each neighbour).
    router_max_rows : int
        The router is trained on at most this many rows (uniform sample): it only has to
        find the range, and multiclass rounds cost K trees each.
    """

    kind = "cascade"

    def __init__(self, *, n_specialists: int = 13, overlap: float = 0.5,
                 params: GBMParams | None = None, router_params: GBMParams | None = None,
                 router_max_rows: int = 100_000) -> None:
        if n_specialists < 2:
            raise ModelError(f"n_specialists must be >= 2, got {n_specialists}")
        self.n_specialists = n_specialists
        self.overlap = overlap
        self.params = params or GBMParams()
        # Routing only has to find the range (specialists overlap), so the router is small.
        self.router_params = router_params or GBMParams(
            num_leaves=15, learning_rate=0.2, max_rounds=40, min_data_in_leaf=200,
            objective="multiclass", early_stopping_rounds=5, num_threads=self.params.num_threads)
        self.router_max_rows = router_max_rows

    def fit(self, X: np.ndarray, y: np.ndarray, *, base: np.ndarray, feature_names: list[str],
            categorical: list[str],
            val: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
            train: np.ndarray | None = None, fitter: Fitter | None = None) -> CascadeModel:
        """Fit on the rows ``train`` marks (default: all), early-stopping on ``val``; each
        booster copies out only its own rows. ``fitter`` grows the specialists elsewhere
        (default: here); the router, fit on a sample, always grows here."""
        idx = np.arange(len(y)) if train is None else np.flatnonzero(train)
        _check_xy(X, y, idx)
        y = y[idx]
        k = self.n_specialists
        qs = np.quantile(y, np.linspace(0, 1, k + 1))
        edges = np.unique(qs[1:-1])
        if len(edges) < k - 1:
            raise ModelError(f"the training target has too few distinct values for {k} "
                             "specialists; use fewer")
        self.edges_ = edges
        label = np.searchsorted(edges, y, side="right")

        rng = np.random.default_rng(self.router_params.seed)
        sample = (np.sort(rng.choice(len(y), self.router_max_rows, replace=False))
                  if len(y) > self.router_max_rows else np.arange(len(y)))
        rp = self.router_params.lgb_params() | {"num_class": k, "objective": "multiclass"}
        rp.pop("alpha", None)
        # The router sees the base margin as a feature (it is hist_est / the physics estimate).
        train_set = lgb.Dataset(np.asarray(X[idx[sample]]), label=label[sample],
                                feature_name=feature_names, categorical_feature=categorical,
                                free_raw_data=False,
                                params={"max_bin": self.router_params.max_bin, "verbosity": -1})
        valid: list[lgb.Dataset] = []
        callbacks: list[Callable[..., Any]] = []
        if val is not None and len(val[1]) > 0:
            vl = np.searchsorted(edges, val[1], side="right")
            valid = [lgb.Dataset(val[0], label=vl, reference=train_set,
                                 feature_name=feature_names, categorical_feature=categorical)]
            callbacks = [lgb.early_stopping(self.router_params.early_stopping_rounds,
                                            verbose=False)]
        self.router_ = lgb.train(rp, train_set, num_boost_round=self.router_params.max_rounds,
                                 valid_sets=valid, callbacks=callbacks).free_dataset()

        lo_all = np.concatenate([[y.min()], edges])
        hi_all = np.concatenate([edges, [y.max()]])
        widths = hi_all - lo_all
        self.ranges_: list[tuple[float, float]] = []
        for j in range(k):
            lo = lo_all[j] - (self.overlap * widths[j - 1] if j > 0 else np.inf)
            hi = hi_all[j] + (self.overlap * widths[j + 1] if j < k - 1 else np.inf)
            self.ranges_.append((float(lo), float(hi)))

        def specialist(j: int, threads: int) -> tuple[lgb.Booster, float]:
            lo, hi = self.ranges_[j]
            v = None
            if val is not None and len(val[1]) > 0:
                vm = (val[1] >= lo) & (val[1] <= hi)
                v = (val[0][vm], val[1][vm], val[2][vm])
            mine = sample_rows(np.flatnonzero((y >= lo) & (y <= hi)),
                               self.params.max_train_rows, self.params.seed + j)
            rows = idx[mine]  # each booster's rows copied out only while it grows
            params = self.params if fitter is not None else replace(self.params,
                                                                    num_threads=threads)
            return _train(params, X[rows], y[mine], base[rows], feature_names, categorical, v,
                          fitter)

        # Grown side by side on this machine's threads (the same trees as one by one); a
        # fitter elsewhere takes them one at a time.
        fitted = run_each([partial(specialist, j) for j in range(k)],
                          self.params.num_threads if fitter is None else 1)
        self.specialists_ = [b for b, _ in fitted]
        self.offsets_ = [o for _, o in fitted]
        self.feature_names_ = list(feature_names)
        self.fitted_ = True
        return self

    def route(self, X: np.ndarray) -> np.ndarray:
        """The specialist index chosen for each row."""
        self._check_fitted()
        proba = _raw_predict(self.router_, X, self.scorers_.get("router"))
        return np.argmax(proba.reshape(len(X), -1), axis=1)

    def predict(self, X: np.ndarray, *, base: np.ndarray) -> np.ndarray:
        """Predicted log throughput per row (each row scored by its routed specialist)."""
        self._check_fitted()
        out = np.empty(len(X), dtype=np.float64)
        if len(X) == 0:
            return out
        routes = self.route(X)
        scorers = self.scorers_
        for j in np.unique(routes):
            m = routes == j
            out[m] = _predict(self.specialists_[j], X[m], base[m] + self.offsets_[j],
                              scorers.get(f"specialist_{j:02d}"))
        return out

    def to_files(self) -> dict[str, str]:
        self._check_fitted()
        meta = {"kind": self.kind, "n_specialists": self.n_specialists, "overlap": self.overlap,
                "params": asdict(self.params), "router_params": asdict(self.router_params),
                "router_max_rows": self.router_max_rows, "edges": self.edges_.tolist(),
                "ranges": self.ranges_, "offsets": self.offsets_,
                "feature_names": self.feature_names_}
        files = {"model.json": json.dumps(meta, indent=2),
                 "router.txt": self.router_.model_to_string()}
        for j, b in enumerate(self.specialists_):
            files[f"specialist_{j:02d}.txt"] = b.model_to_string()
        return files

    @classmethod
    def from_files(cls, files: dict[str, str]) -> CascadeModel:
        meta = json.loads(files["model.json"])
        m = cls(n_specialists=meta["n_specialists"], overlap=meta["overlap"],
                params=GBMParams.from_dict(meta["params"]),
                router_params=GBMParams.from_dict(meta["router_params"]),
                router_max_rows=meta["router_max_rows"])
        m.edges_ = np.asarray(meta["edges"])
        m.ranges_ = [tuple(r) for r in meta["ranges"]]
        m.offsets_ = [float(o) for o in meta["offsets"]]
        m.router_ = lgb.Booster(model_str=files["router.txt"])
        m.specialists_ = [lgb.Booster(model_str=files[f"specialist_{j:02d}.txt"])
                          for j in range(m.n_specialists)]
        m.feature_names_ = meta["feature_names"]
        m.fitted_ = True
        return m


def _check_xy(X: np.ndarray, y: np.ndarray, rows: np.ndarray | None = None) -> None:
    """``X`` and ``y`` match, and the rows to fit on (``rows``, default all) are enough and
    have finite targets."""
    if len(X) != len(y):
        raise ModelError(f"X has {len(X)} rows but y has {len(y)}")
    if rows is not None:
        y = y[rows]
    if len(y) < 50:
        raise ModelError(f"only {len(y)} training rows; need at least 50 succeeded attempts")
    if not np.all(np.isfinite(y)):
        raise ModelError("the training target contains non-finite values")
