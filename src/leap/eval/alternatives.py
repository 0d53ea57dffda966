"""Alternatives on the same held-out day: other learners, the rules they must beat, ablations.

One training set is encoded for the window before the held-out day (the nightly one: the
window's rows and its rows with their own (family, type) history masked); every method below
learns from it and predicts the same held-out attempts, so the figures differ only by the
method:

- **leap** (the cascade with the novel-rows model), **one LightGBM model**, and the
  ablations: the cascade without history features, without the hardware-spec columns, and
  with the mean (L2) objective instead of the median;
- **linear regression on log features**, **k-nearest neighbours** and **a small MLP**
  (scikit-learn), each fit on a sample of the rows, learning the same target as the trees:
  log throughput above the base margin (the history-corrected physics estimate);
- **the analytic roofline alone** (the physics estimate, no learning), **the base margin
  alone** (physics corrected by the family's history, the trees' starting point) and **the
  lookup table** (the previous system: the median of the exact configuration's past runs; no
  answer for a configuration it has not seen) and **the spec-ratio transfer** (the family's
  median on each other type it ran on, times the geometric mean of the peak FLOP/s and
  bandwidth ratios: the simple rule for a pair without history; it never reads the pair's
  own type, so its prediction for an attempt is already the masked one).

Each is scored on the day's attempts as they came, on those whose family never ran on their
type (few: what a ranking mostly asks), and on the same attempts with their own pair history
masked (many, but typical jobs: a model that ignores the family does far better there than
on the pairs that are truly new, so both views are reported), with the
time to fit and to predict (a batch, and one job's 20 candidate rows; the models' own
prediction, after encoding, which every method shares).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.data.usage import recorded_device_hours
from leap.eval.backtest import last_full_day
from leap.eval.baselines import LookupTable, SpecRatioTransfer
from leap.features.encode import (
    CATEGORICAL,
    HARDWARE_SPEC_FEATURES,
    NOVELTY_GROUPS,
    FeatureSpec,
    base_margin,
)
from leap.model.train import family_seen, fit_model
from leap.model.window import (
    HISTORY_FEATURES,
    TrainConfig,
    TrainingSet,
    build_training_set,
    day_start,
    load_attempts,
    window_attempts,
)
from leap.records import Record

Status = Callable[[str], None]

#: Rows of one job's ranking: the latency figure predicts this many rows at a time.
JOB_ROWS = 20


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class MethodResult(Record):
    """One method's figures on the held-out day (accuracy: share within ±20%)."""

    name: str
    kind: str  # "leap", "learner", "ablation" or "rule"
    accuracy: float
    accuracy_gpu_hours: float
    median_ape: float
    coverage: float
    accuracy_covered: float
    masked_pairs_accuracy: float
    unobserved_pairs_accuracy: float
    unseen_families_accuracy: float
    fit_s: float
    predict_us_per_row: float
    job_ms_p50: float
    note: str = ""


@dataclass(frozen=True)
class AlternativesResult(Record):
    """:func:`alternatives_study`: the rows it used and every method's figures."""

    day: str
    train_rows: int
    sample_rows: int
    eval_rows: int
    masked_eval_rows: int
    unobserved_eval_rows: int
    methods: list[MethodResult] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


# Training sets of the ablations ---------------------------------------------------------------
def drop_features(ts: TrainingSet, drop: frozenset[str] | set[str]) -> TrainingSet:
    """``ts`` without the feature columns in ``drop`` (the masked evaluation rows too)."""
    keep = [i for i, n in enumerate(ts.spec.names) if n not in drop]
    spec = FeatureSpec(names=tuple(ts.spec.names[i] for i in keep), vocab=ts.spec.vocab)
    masked_X = ts.eval_masked_X[:, keep] if ts.eval_masked_X.shape[1] else ts.eval_masked_X
    return replace(ts, X=ts.X[:, keep], eval_X=ts.eval_X[:, keep], eval_masked_X=masked_X,
                   spec=spec)


def without_history(ts: TrainingSet) -> TrainingSet:
    """The ablation without history features (the base margin falls back to physics)."""
    return drop_features(ts, HISTORY_FEATURES)


# The scikit-learn learners --------------------------------------------------------------------
def _signed_log1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def _preprocess(names: list[str], *, one_hot: bool) -> Any:
    """Log scale, impute (with missing-value indicators), standardise; one-hot categories."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

    cat = [i for i, n in enumerate(names) if n in CATEGORICAL]
    logged = [i for i, n in enumerate(names) if n not in CATEGORICAL and n.startswith("log_")]
    raw = [i for i, n in enumerate(names) if n not in CATEGORICAL and i not in logged]

    def numeric(log: bool) -> Pipeline:
        steps: list[tuple[str, Any]] = [("log", FunctionTransformer(_signed_log1p))] if log \
            else []
        return Pipeline([*steps, ("impute", SimpleImputer(strategy="median", add_indicator=True,
                                                          keep_empty_features=True)),
                         ("scale", StandardScaler())])

    parts: list[tuple[str, Any, list[int]]] = [("logged", numeric(False), logged),
                                               ("raw", numeric(True), raw)]
    if cat and one_hot:
        parts.append(("cat", Pipeline([
            ("fill", SimpleImputer(strategy="constant", fill_value=-1.0)),
            ("onehot", OneHotEncoder(handle_unknown="ignore", sparse_output=False))]), cat))
    return ColumnTransformer(parts, remainder="drop")


def sklearn_learners(seed: int) -> dict[str, Any]:
    """The scikit-learn alternatives, each a pipeline from encoded rows to the residual."""
    from sklearn.linear_model import Ridge
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.neural_network import MLPRegressor

    return {
        "linear regression on log features": (Ridge(alpha=1.0), True),
        "k-nearest neighbours (k = 10)": (KNeighborsRegressor(n_neighbors=10,
                                                              weights="distance"), True),
        "small MLP (64, 32)": (MLPRegressor(hidden_layer_sizes=(64, 32), batch_size=512,
                                            learning_rate_init=1e-3, max_iter=30,
                                            early_stopping=True, n_iter_no_change=4,
                                            random_state=seed), True),
    }


class _Residual:
    """A scikit-learn regressor of ``y - base`` on the preprocessed rows; predicts log tp."""

    def __init__(self, estimator: Any, names: list[str], one_hot: bool,
                 fallback: float, spec: FeatureSpec) -> None:
        from sklearn.pipeline import Pipeline

        self.pipe = Pipeline([("prep", _preprocess(names, one_hot=one_hot)),
                              ("model", estimator)])
        self.spec, self.fallback = spec, fallback

    def fit(self, X: np.ndarray, y: np.ndarray) -> _Residual:
        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():  # the MLP's epochs are capped on purpose
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.pipe.fit(X, y - base_margin(X, self.spec, self.fallback))
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(base_margin(X, self.spec, self.fallback) + self.pipe.predict(X))


# Scoring ------------------------------------------------------------------------------------
def _latency(predict: Callable[[Any], np.ndarray], rows: Any, n: int) -> tuple[float, float]:
    """(µs per row over a batch of every row, p50 ms of one job's 20 rows)."""
    t0 = time.perf_counter()
    predict(rows)
    batch = time.perf_counter() - t0
    times = []
    for i in range(min(n, max(1, len(rows) // JOB_ROWS))):
        part = rows[i * JOB_ROWS:(i + 1) * JOB_ROWS]
        t0 = time.perf_counter()
        predict(part)
        times.append(time.perf_counter() - t0)
    return 1e6 * batch / max(len(rows), 1), 1e3 * float(np.median(times))


def _masked(predict: Callable[[np.ndarray], np.ndarray], ts: TrainingSet) -> np.ndarray:
    """Predictions for the held-out day's rows encoded with their own pair history masked."""
    return predict(ts.eval_masked_X) if len(ts.eval_masked_rows) else np.empty(0)


def _unobserved(ts: TrainingSet) -> np.ndarray:
    """Held-out rows whose family ran on other types but never on this one (as they came)."""
    groups = [NOVELTY_GROUPS.index(g) for g in NOVELTY_GROUPS if g.startswith("unobserved")]
    return np.isin(ts.eval_group, groups)


def _result(name: str, kind: str, pred_log: np.ndarray, masked_pred_log: np.ndarray,
            ts: TrainingSet, seen: np.ndarray, fit_s: float,
            latency: tuple[float, float], note: str = "") -> MethodResult:
    actual = ts.eval_jobs["throughput"].to_numpy(dtype=np.float64)
    pred = np.exp(pred_log)
    res = metrics.summary(pred, actual, recorded_device_hours(ts.eval_jobs))
    covered = np.isfinite(pred)
    masked_actual = actual[ts.eval_masked_rows]
    unobserved = _unobserved(ts)
    return MethodResult(
        name=name, kind=kind, accuracy=res.accuracy,
        accuracy_gpu_hours=res.accuracy_gpu_hours if res.accuracy_gpu_hours is not None
        else float("nan"),
        median_ape=res.median_ape, coverage=res.coverage,
        accuracy_covered=metrics.accuracy(pred[covered], actual[covered]),
        masked_pairs_accuracy=metrics.accuracy(np.exp(masked_pred_log), masked_actual)
        if len(masked_actual) else float("nan"),
        unobserved_pairs_accuracy=metrics.accuracy(pred[unobserved], actual[unobserved])
        if unobserved.any() else float("nan"),
        unseen_families_accuracy=metrics.accuracy(pred[~seen], actual[~seen]), fit_s=fit_s,
        predict_us_per_row=latency[0], job_ms_p50=latency[1], note=note)


def alternatives_study(store: Any, catalog: Catalog, cfg: TrainConfig | None = None, *,
                       as_of: datetime | None = None, sample_rows: int = 200_000,
                       knn_rows: int = 50_000, latency_jobs: int = 200,
                       status: Status = _quiet) -> AlternativesResult:
    """Every method of the module's list on the held-out day ``as_of`` of ``store``.

    Parameters
    ----------
    as_of : datetime, optional
        The held-out day (default: the last full day in the store).
    sample_rows : int
        Rows (drawn from the window's training rows) the linear model and the MLP learn
        from; ``knn_rows`` for k-NN, whose prediction scans all of its rows.
    latency_jobs : int
        Jobs of 20 rows timed for the per-job latency.
    """
    cfg = cfg or TrainConfig()
    day = day_start(as_of) if as_of is not None else last_full_day(store)
    t_start = time.perf_counter()
    status("encoding the window and the held-out day")
    attempts = window_attempts(store, day, cfg)
    ts = build_training_set(attempts, catalog, day, cfg)
    del attempts
    seen = family_seen(ts.serving_snapshot, ts.eval_jobs)
    timings = {"features_s": time.perf_counter() - t_start}
    rng = np.random.default_rng(cfg.seed)
    out: list[MethodResult] = []

    def margin(t: TrainingSet, X: np.ndarray) -> np.ndarray:
        return np.asarray(base_margin(X, t.spec, t.fallback_log_tp))

    # The boosted trees: leap, one model, the ablations.
    trees = [
        ("leap (cascade + novel-rows model)", "leap", ts, cfg, ""),
        ("one LightGBM model", "learner", ts, replace(cfg, model_kind="global"), ""),
        ("leap, mean (L2) objective", "ablation", ts, replace(cfg, objective="l2"), ""),
        ("leap without history features", "ablation", without_history(ts), cfg,
         "base margin: physics alone"),
        ("leap without hardware-spec columns", "ablation",
         drop_features(ts, set(HARDWARE_SPEC_FEATURES)), cfg,
         "the physics features still use the specs"),
    ]
    for name, kind, t, c, note in trees:
        status(f"fitting: {name}")
        t0 = time.perf_counter()
        model = fit_model(t, c)
        fit_s = time.perf_counter() - t0

        def predict(X: np.ndarray, t: TrainingSet = t, model: Any = model) -> np.ndarray:
            return np.asarray(model.predict(X, base=margin(t, X)))

        out.append(_result(name, kind, predict(t.eval_X), _masked(predict, t), ts, seen,
                           fit_s, _latency(predict, t.eval_X, latency_jobs), note))

    # The scikit-learn learners, on a sample of the rows.
    rows = np.arange(len(ts.y))  # every window row (no early stopping here)
    names = list(ts.spec.names)
    for name, (est, one_hot) in sklearn_learners(cfg.seed).items():
        n = knn_rows if name.startswith("k-nearest") else sample_rows
        pick = np.sort(rng.choice(rows, size=min(n, len(rows)), replace=False))
        status(f"fitting: {name} on {len(pick):,} rows")
        learner = _Residual(est, names, one_hot, ts.fallback_log_tp, ts.spec)
        t0 = time.perf_counter()
        learner.fit(ts.X[pick], ts.y[pick])
        fit_s = time.perf_counter() - t0
        out.append(_result(name, "learner", learner.predict(ts.eval_X),
                           _masked(learner.predict, ts), ts, seen, fit_s,
                           _latency(learner.predict, ts.eval_X, latency_jobs),
                           f"fit on {len(pick):,} sampled rows"))

    # The rules: no learning from the rows.
    phys_col = names.index("log_phys_sps")

    def roofline(X: np.ndarray) -> np.ndarray:
        p = X[:, phys_col]
        return np.where(np.isfinite(p), p, ts.fallback_log_tp)

    def base_only(X: np.ndarray) -> np.ndarray:
        return margin(ts, X)

    for name, fn, note in (("analytic roofline alone", roofline, "the physics estimate"),
                           ("base margin alone", base_only,
                            "physics corrected by the most specific history")):
        out.append(_result(name, "rule", fn(ts.eval_X), _masked(fn, ts), ts, seen, 0.0,
                           _latency(fn, ts.eval_X, latency_jobs), note))

    status("the lookup table and the spec-ratio transfer")
    past = load_attempts(store, day - pd.Timedelta(days=cfg.window_days), day)
    t0 = time.perf_counter()
    table = LookupTable().fit(past, catalog)
    table_fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ratio = SpecRatioTransfer().fit(past, catalog)
    ratio_fit_s = time.perf_counter() - t0
    del past
    jobs = ts.eval_jobs.reset_index(drop=True)

    def lookup(frame: pd.DataFrame) -> np.ndarray:
        return np.log(table.predict(frame))

    def spec_ratio(frame: pd.DataFrame) -> np.ndarray:
        return np.log(ratio.predict(frame))

    with np.errstate(divide="ignore", invalid="ignore"):
        # A masked pair never ran on its type in the model's view; the table has no answer.
        out.append(_result("lookup table (exact configuration)", "rule", lookup(jobs),
                           np.full(len(ts.eval_masked_rows), np.nan), ts, seen, table_fit_s,
                           _latency(lookup, jobs, latency_jobs),
                           "no answer for a configuration it has not seen"))
        transfer = spec_ratio(jobs)
        out.append(_result("spec-ratio transfer", "rule", transfer,
                           transfer[ts.eval_masked_rows], ts, seen, ratio_fit_s,
                           _latency(spec_ratio, jobs, latency_jobs),
                           "the family's other types x spec ratios; never reads the pair's "
                           "own type; no answer for a family on one type"))
    timings["total_s"] = time.perf_counter() - t_start
    return AlternativesResult(day=day.date().isoformat(), train_rows=len(ts.y),
                              sample_rows=sample_rows, eval_rows=len(ts.eval_jobs),
                              masked_eval_rows=len(ts.eval_masked_rows),
                              unobserved_eval_rows=int(_unobserved(ts).sum()), methods=out,
                              timings=timings)

