"""Nightly training: window of attempts -> point-in-time features -> model -> published artifact.

``train_nightly`` trains on the attempts of the ``window_days`` days before ``as_of``,
evaluates on ``as_of``'s own day when the store has it, applies the quality gate against the
currently published model, and publishes atomically. The rows it fits come from
:mod:`leap.model.window`; :mod:`leap.model.distributed` runs the same steps on Dask.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.data.store import Store
from leap.data.usage import recorded_device_hours
from leap.errors import ArtifactError, ModelError, QualityGateError
from leap.features.encode import (
    NOVELTY_GROUPS,
    base_margin,
    new_trainer_count,
    new_vendor,
)
from leap.features.history import LEVELS, Snapshot
from leap.memory import release_free_memory
from leap.model.artifact import (
    NEW_TRAINER_COUNT_ALONE,
    Artifact,
    Registry,
    history_alone,
    write_artifact,
)
from leap.model.cascade import CascadeModel, Fitter, GBMParams, GlobalModel
from leap.model.intervals import IntervalCalibrator
from leap.model.split import Model, NoveltySplitModel
from leap.model.window import (
    EncodeCache,
    NightCache,
    Progress,
    TrainConfig,
    TrainingSet,
    build_training_set,
    day_start,
    default_as_of,
    window_attempts,
)
from leap.records import Record

#: Validation rows :func:`judge_new_trainer_count` needs to judge at all: on fewer, a share
#: within +-20% has a standard error of 4 points or more, and the trees and the base margin
#: differ by a few rows (the tests' small fleet: 29 against 28 of 33).
JUDGE_MIN_ROWS = 100


@dataclass(frozen=True)
class GroupSummary(metrics.Summary):
    """The accuracy block of one novelty group, with its share of the rows and the coverage
    of its intervals (:func:`by_novelty`); given the rows' families, how many independent
    families the rows are worth (:func:`~leap.metrics.effective_clusters`) and 90%
    confidence intervals of the accuracy and the coverage, resampling whole families
    (:func:`~leap.metrics.cluster_interval`)."""

    OMIT_NONE = frozenset({"accuracy_gpu_hours", "interval_coverage", "effective_families",
                           "accuracy_ci", "interval_coverage_ci"})

    share: float = float("nan")
    interval_coverage: float | None = None
    effective_families: float | None = None
    accuracy_ci: tuple[float, float] | None = None
    interval_coverage_ci: tuple[float, float] | None = None


@dataclass(frozen=True)
class HeldOutFigures(Record):
    """A model's figures on its held-out day (:func:`evaluate`): the standard block over all
    attempts, seen vs unseen families, and by novelty group; ``masked_pairs``: the same
    attempts with their own (family, type) history removed. ``unseen_share`` is added by the
    backtest."""

    OMIT_NONE = frozenset({"accuracy_gpu_hours", "novelty", "interval_coverage",
                           "masked_pairs", "unseen_share", "new_trainer_count"})

    day: str
    n: float
    coverage: float
    accuracy: float
    median_ape: float
    accuracy_gpu_hours: float | None
    seen_families: metrics.Summary
    unseen_families: metrics.Summary
    novelty: dict[str, GroupSummary] | None = None
    interval_coverage: float | None = None
    masked_pairs: dict[str, GroupSummary] | None = None
    unseen_share: float | None = None
    new_trainer_count: GroupSummary | None = None


@dataclass(frozen=True)
class Window(Record):
    """A training window: ``[start, end)``, ISO timestamps."""

    start: str
    end: str


@dataclass(frozen=True)
class WindowMetrics(Record):
    """What a night's training measured: its rows, its window and its held-out figures
    (None when the store has no held-out day)."""

    OMIT_NONE = frozenset({"held_out"})

    train_rows: int
    masked_train_rows: int
    window: Window
    held_out: HeldOutFigures | None = None


@dataclass(frozen=True)
class QualityGate(Record):
    """The publish decision: the new model's held-out accuracy against the current one's on
    the same day (within ``margin``); ``note`` says why the gate was skipped."""

    OMIT_NONE = frozenset({"note"})

    passed: bool
    margin: float
    current_version: str | None
    current_accuracy: float | None
    new_accuracy: float | None
    note: str | None = None


@dataclass
class TrainResult:
    version: str | None
    published: bool
    as_of: datetime
    metrics: WindowMetrics
    timings: dict[str, float]
    gate: QualityGate
    artifact: Artifact | None = None
    #: What the night took from and left in its :class:`NightCache`
    #: (:meth:`~leap.model.window.CacheUse.counts`); ``None`` without one.
    cache: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"version": self.version, "published": self.published,
               "as_of": self.as_of.isoformat(), "metrics": self.metrics.to_dict(),
               "timings_s": self.timings, "quality_gate": self.gate.to_dict()}
        if self.cache is not None:
            out["cache"] = self.cache
        return out


def gbm_params(cfg: TrainConfig) -> GBMParams:
    return GBMParams(objective=cfg.objective, seed=cfg.seed, num_threads=cfg.threads)


def make_model(cfg: TrainConfig) -> GlobalModel | CascadeModel:
    params = gbm_params(cfg)
    if cfg.model_kind == "global":
        return GlobalModel(params=params)
    return CascadeModel(n_specialists=cfg.n_specialists, params=params)


def fit_model(ts: TrainingSet, cfg: TrainConfig, fitter: Fitter | None = None) -> Model:
    """Fit on the window, early-stopping on its last ``validation_days`` days.

    With masked rows (and history features), the model is a :class:`NoveltySplitModel`:
    ``cfg.model_kind`` for rows with (family, type) history, one global model for the rest.
    ``fitter`` grows the boosters elsewhere (a Dask cluster, with ``ts.X`` a dask array).
    """
    base = np.asarray(base_margin(ts.X, ts.spec, ts.fallback_log_tp))
    val = ts.day >= cfg.window_days - cfg.validation_days
    X_val = np.asarray(ts.X[val])
    names = list(ts.spec.names)
    if ts.masked.any() and "fam_hw_n" in names:
        split = NoveltySplitModel(seen=make_model(cfg), novel=GlobalModel(params=gbm_params(cfg)))
        return split.fit(ts.X, ts.y, base=base, feature_names=names,
                         categorical=ts.spec.categorical, masked=ts.masked, train=~val,
                         val=(X_val, ts.y[val], base[val], ts.masked[val]), fitter=fitter)
    unmasked = ~ts.masked if len(ts.masked) else np.ones(len(ts.y), dtype=bool)
    tr, va = ~val & unmasked, unmasked[val]
    model = make_model(cfg)
    return model.fit(ts.X, ts.y, base=base, feature_names=names, train=tr, fitter=fitter,
                     categorical=ts.spec.categorical,
                     val=(X_val[va], ts.y[val][va], base[val][va]))


def judge_new_trainer_count(model: Model, ts: TrainingSet, cfg: TrainConfig) -> bool:
    """Whether a trainer count new to its (family, type) pair (:func:`new_trainer_count`) is
    served the base margin alone (see :meth:`Artifact.predict_rows`).

    The trees' correction must earn its place there: it is kept only where the validation
    days' natural rows at such a trainer count with a history-adjusted estimate, which the
    trees never fitted, number :data:`JUDGE_MIN_ROWS` or more and it lands at least as many
    of them within +-20% as the base margin alone. A window with too few such rows to judge
    (a public table with a type's multi-device rows held out: none on the validation day)
    serves the base margin alone, as a type nobody ran on is served.
    """
    val = (ts.day >= cfg.window_days - cfg.validation_days) & ~ts.masked
    rows = np.flatnonzero(val)
    X = np.asarray(ts.X[rows])
    names = ts.spec.names
    use = new_trainer_count(X, names)
    if "hist_est" in names:
        use &= np.isfinite(X[:, list(names).index("hist_est")])
    if use.sum() < JUDGE_MIN_ROWS:
        return True
    X, y = X[use], ts.y[rows[use]]
    base = base_margin(X, ts.spec, ts.fallback_log_tp)
    trees = model.predict(X, base=base)
    return int(metrics.within_log(trees - y).sum()) < int(metrics.within_log(base - y).sum())


def calibrate_intervals(model: Model, ts: TrainingSet, cfg: TrainConfig,
                        new_trainer_count_alone: bool = False) -> IntervalCalibrator | None:
    """Conformal interval offsets per novelty group from the validation days' rows.

    The validation rows (natural and masked) were never fitted on; their residuals under the
    fitted model calibrate each group's interval (a trainer count new to its pair by the base
    margin alone where ``new_trainer_count_alone``, as served). With fewer validation rows
    than a calibration needs (a few hundred public benchmark rows), the model has no
    intervals.
    """
    val = ts.day >= cfg.window_days - cfg.validation_days
    calibrator = IntervalCalibrator(coverage=cfg.interval_coverage)
    if val.sum() < calibrator.min_rows:
        return None
    X = np.asarray(ts.X[val])
    names = ts.spec.names

    def served(X: np.ndarray, alone: np.ndarray | None = None) -> np.ndarray:
        """Log throughput as serving predicts rows ``X``: the base margin alone on ``alone``
        rows (a type nobody ran on), and at a trainer count new to its pair where judged."""
        base = base_margin(X, ts.spec, ts.fallback_log_tp)
        pred = model.predict(X, base=base)
        if new_trainer_count_alone:
            new = new_trainer_count(X, names)
            alone = new if alone is None else alone | new
        return pred if alone is None else history_alone(pred, base, X, names, alone)

    def resid(X: np.ndarray, y: np.ndarray, alone: bool = False) -> np.ndarray | None:
        if not len(y):
            return None
        X = np.asarray(X)
        return y - served(X, np.ones(len(X), dtype=bool) if alone else None)

    pred = served(X)
    # A trainer count new to its pair: the validation days' natural rows of that kind, and
    # their rows with the trainer count hidden from the pair (never fitted on either).
    natural = new_trainer_count(X, names) & ~ts.masked[val]
    hidden = resid(ts.new_trainer_count_X, ts.new_trainer_count_y)
    hidden = np.empty(0) if hidden is None else hidden
    return calibrator.fit(ts.y[val] - pred, ts.group[val], ts.masked[val],
                          new_vendor(X, names),
                          resid(ts.new_type_X, ts.new_type_y, alone=True),
                          ts.family[val] if len(ts.family) == len(ts.y) else None,
                          resid(ts.new_model_type_X, ts.new_model_type_y),
                          np.concatenate([ts.y[val][natural] - pred[natural], hidden]),
                          np.r_[np.zeros(int(natural.sum()), bool), np.ones(len(hidden), bool)])


def evaluate(pred_log: np.ndarray, jobs: pd.DataFrame, fam_seen: np.ndarray, day: str,
             group: np.ndarray | None = None,
             interval: tuple[np.ndarray, np.ndarray] | None = None) -> HeldOutFigures:
    """Figures for a held-out ``day``: overall, GPU-hour weighted, seen vs unseen families,
    and, given each row's novelty ``group``, per group (with the ``interval``'s coverage:
    log-space ``(lo, hi)`` per row)."""
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    pred = np.exp(pred_log)
    every = metrics.summary(pred, actual, recorded_device_hours(jobs))
    coverage = None
    if interval is not None:
        y = np.log(actual)
        coverage = float(((y >= interval[0]) & (y <= interval[1])).mean()) \
            if len(y) else float("nan")
    return HeldOutFigures(
        day=day, n=every.n, coverage=every.coverage, accuracy=every.accuracy,
        median_ape=every.median_ape, accuracy_gpu_hours=every.accuracy_gpu_hours,
        seen_families=metrics.summary(pred[fam_seen], actual[fam_seen]),
        unseen_families=metrics.summary(pred[~fam_seen], actual[~fam_seen]),
        novelty=None if group is None else by_novelty(
            pred_log, np.log(actual), group, interval, jobs["family_id"].to_numpy()),
        interval_coverage=coverage)


def by_novelty(pred_log: np.ndarray, y: np.ndarray, group: np.ndarray,
               interval: tuple[np.ndarray, np.ndarray] | None = None,
               family: np.ndarray | None = None) -> dict[str, GroupSummary]:
    """Accuracy, MdAPE, share of rows and interval coverage per novelty group (log inputs);
    with each row's ``family``, the group's effective families and family-resampled 90%
    confidence intervals of both shares."""
    return {name: rows_summary(pred_log, y, m, interval, family)
            for name, m in ((name, group == i) for i, name in enumerate(NOVELTY_GROUPS))
            if m.any()}


def rows_summary(pred_log: np.ndarray, y: np.ndarray, m: np.ndarray,
                 interval: tuple[np.ndarray, np.ndarray] | None = None,
                 family: np.ndarray | None = None) -> GroupSummary:
    """:func:`by_novelty`'s figures for the rows ``m`` (a boolean mask) alone."""
    spread: dict[str, Any] = {}
    inside = None if interval is None else (y[m] >= interval[0][m]) & (y[m] <= interval[1][m])
    if family is not None:
        fam = family[m]
        spread = {"effective_families": metrics.effective_clusters(fam),
                  "accuracy_ci": metrics.cluster_interval(
                      metrics.within_log(pred_log[m] - y[m]), fam)}
        if inside is not None:
            spread["interval_coverage_ci"] = metrics.cluster_interval(inside, fam)
    block = metrics.summary(np.exp(pred_log[m]), np.exp(y[m]))
    return GroupSummary(**block.to_dict(), share=float(m.mean()),
                        interval_coverage=None if inside is None else float(inside.mean()),
                        **spread)


def family_seen(snapshot: Snapshot, jobs: pd.DataFrame) -> np.ndarray:
    """Whether each job's family has any history in ``snapshot``."""
    fam = next(lv for lv in LEVELS if lv.name == "fam")
    return np.isfinite(snapshot.lookup(jobs, fam)[:, 0])


@dataclass
class WindowModel:
    """A model trained on one window, in memory, with its held-out evaluation.

    ``artifact`` is unpublished (no path) but predicts exactly as the published one would;
    backtests and experiments use it without touching the registry.
    """

    as_of: datetime
    cfg: TrainConfig
    artifact: Artifact
    metrics: WindowMetrics
    timings: dict[str, float]
    eval_jobs: pd.DataFrame
    eval_pred_log: np.ndarray


def train_window(attempts: pd.DataFrame, catalog: Catalog, as_of: datetime,
                 cfg: TrainConfig | None = None, progress: Progress | None = None,
                 cache: EncodeCache | None = None,
                 disk_cache: NightCache | None = None) -> WindowModel:
    """Train on the ``cfg.window_days`` days of ``attempts`` before ``as_of``; evaluate on its day.

    ``attempts`` must reach back ``window_days + lookback_days`` before ``as_of`` for full
    history (see :func:`load_attempts`); later attempts are used only for evaluation.
    ``cache`` is shared by consecutive nights in one process (see :class:`EncodeCache`),
    ``disk_cache`` by consecutive runs (see :class:`~leap.model.window.NightCache`; pruning
    it is the caller's, as :func:`train_nightly` does).
    """
    cfg = cfg or TrainConfig()
    as_of = day_start(as_of)
    ts = build_training_set(attempts, catalog, as_of, cfg, progress, cache, disk_cache)
    return fit_window(ts, catalog, as_of, cfg, progress)


def fit_window(ts: TrainingSet, catalog: Catalog, as_of: datetime, cfg: TrainConfig,
               progress: Progress | None = None, fitter: Fitter | None = None) -> WindowModel:
    """Fit, calibrate and evaluate on a built :class:`TrainingSet` (the half of
    :func:`train_window` after the features; ``fitter`` as in :func:`fit_model`)."""
    timings = dict(ts.timings)
    if progress:
        progress("fit", 0, 1)
    t0 = time.perf_counter()
    model = fit_model(ts, cfg, fitter)
    alone = judge_new_trainer_count(model, ts, cfg)
    intervals = calibrate_intervals(model, ts, cfg, alone)
    timings["fit_s"] = time.perf_counter() - t0
    if progress:
        progress("fit", 1, 1)
    window = Window(start=(as_of - timedelta(days=cfg.window_days)).isoformat(),
                    end=as_of.isoformat())
    manifest = {"version": "unpublished", "as_of": as_of.isoformat(),
                "window_start": window.start, "window_end": window.end,
                "window_days": cfg.window_days, "lookback_days": cfg.lookback_days,
                "train_config": asdict(cfg), "fallback_log_throughput": ts.fallback_log_tp,
                NEW_TRAINER_COUNT_ALONE: alone, "model_kind": model.kind}
    artifact = Artifact(version="unpublished", path=None, manifest=manifest, model=model,
                        snapshot=ts.serving_snapshot, spec=ts.spec, catalog=catalog,
                        intervals=intervals)
    pred = np.empty(0)
    held = None
    if len(ts.eval_jobs):
        pred = artifact.predict_rows(ts.eval_X)  # the one prediction path
        seen = family_seen(ts.serving_snapshot, ts.eval_jobs)
        interval = None
        if intervals is not None:
            # As serving gives them (a type new to the window included).
            lo, hi = artifact.interval_offsets(ts.eval_X, ts.spec.names, ts.eval_group)
            interval = (pred + lo, pred + hi)
        held = evaluate(pred, ts.eval_jobs, seen, as_of.date().isoformat(), ts.eval_group,
                        interval)
        new_tc = new_trainer_count(ts.eval_X, ts.spec.names)
        if new_tc.any():
            held = replace(held, new_trainer_count=rows_summary(
                pred, np.log(ts.eval_jobs["throughput"].to_numpy(dtype=np.float64)), new_tc,
                interval, ts.eval_jobs["family_id"].to_numpy()))
        if len(ts.eval_masked_rows):
            # The held-out day's rows again, each with its own (family, type) history
            # removed: how leap does on types a family never ran on, against measured truth.
            Xm, g = ts.eval_masked_X, ts.eval_masked_group
            pm = model.predict(Xm, base=base_margin(Xm, ts.spec, ts.fallback_log_tp))
            ym = np.log(ts.eval_jobs["throughput"].to_numpy(dtype=np.float64))[
                ts.eval_masked_rows]
            masked_interval = None
            if intervals is not None:
                lo_m, hi_m = intervals.offsets(g, new_vendor(Xm, ts.spec.names))
                masked_interval = (pm + lo_m, pm + hi_m)
            held = replace(held, masked_pairs=by_novelty(
                pm, ym, g, masked_interval,
                ts.eval_jobs["family_id"].to_numpy()[ts.eval_masked_rows]))
    result_metrics = WindowMetrics(train_rows=len(ts.y), masked_train_rows=int(ts.masked.sum()),
                                   window=window, held_out=held)
    manifest["metrics"] = result_metrics.to_dict()
    return WindowModel(as_of, cfg, artifact, result_metrics, timings, ts.eval_jobs, pred)


def train_nightly(store: Store, catalog: Catalog, registry: Registry, *,
                  as_of: datetime | None = None, cfg: TrainConfig | None = None,
                  publish: bool = True, force: bool = False,
                  progress: Progress | None = None, now: datetime | None = None,
                  dask_client: Any = None, export_dir: Path | None = None,
                  disk_cache: NightCache | None = None) -> TrainResult:
    """Train on the window before ``as_of``, evaluate on its day, gate, and publish.

    Parameters
    ----------
    store, catalog, registry
        Where attempts come from, the hardware catalog, and where models are published.
    as_of : datetime, optional
        Start of the held-out day (UTC midnight); default :func:`default_as_of` (with ``now``).
    cfg : TrainConfig, optional
    disk_cache : NightCache, optional
        What is kept between nights (``leap train``: ``<home>/cache``): the pair models fit
        and the days encoded from the same attempts before are read instead of made again,
        and what no later night reads is removed (:meth:`NightCache.prune`). The model is the
        same either way. With ``dask_client`` the workers read and write it, so its folder
        must be one they reach (as ``export_dir``).
    publish : bool
        Write and publish the artifact (False: train and evaluate only).
    force : bool
        Publish even when the quality gate refuses.
    now : datetime, optional
        The wall clock, for the default ``as_of``: attempts after it are ignored.
    dask_client : distributed.Client, optional
        Train on that Dask cluster (:mod:`leap.model.distributed`): the window is exported
        to Parquet in ``export_dir`` (default: a temporary directory, reachable only by a
        cluster on this machine) and encoded and fit by the workers.

    Raises
    ------
    QualityGateError
        The new model's held-out accuracy is more than ``cfg.quality_margin`` below the
        current model's on the same day (nothing is published).

    Examples
    --------
    Not run here (it needs a workspace)::

        result = train_nightly(store, catalog, Registry(ws.models_dir))
    """
    cfg = cfg or TrainConfig()
    as_of = day_start(as_of) if as_of is not None else default_as_of(store, now)
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    if dask_client is not None:
        from leap.model.distributed import train_store_dask  # imports Dask

        wm = train_store_dask(store, catalog, as_of, dask_client, cfg, export_dir, progress,
                              disk_cache)
        timings = dict(wm.timings)
    else:
        attempts = window_attempts(store, as_of, cfg)
        load_s = time.perf_counter() - t0
        ts = build_training_set(attempts, catalog, as_of, cfg, progress,
                                disk_cache=disk_cache)
        del attempts  # the fit needs only the encoded rows: free the raw ones first
        release_free_memory()
        wm = fit_window(ts, catalog, as_of, cfg, progress)
        del ts
        timings = {"load_s": load_s, **wm.timings}
    cache = None
    if disk_cache is not None:  # what this night neither read nor made, on either path
        disk_cache.prune()
        cache = disk_cache.used().counts()
    held = wm.metrics.held_out
    new_acc = held.accuracy if held else None
    gate = _quality_gate(registry, wm.eval_jobs, new_acc, cfg.quality_margin)
    timings["total_s"] = time.perf_counter() - t_start
    if not publish:
        return TrainResult(None, False, as_of, wm.metrics, timings, gate, wm.artifact,
                           cache=cache)
    if not gate.passed and not force:
        raise QualityGateError(
            f"refusing to publish: held-out accuracy {new_acc:.3f} is more than "
            f"{cfg.quality_margin:.3f} below the current model {gate.current_version} "
            f"({gate.current_accuracy:.3f}) on {as_of:%Y-%m-%d}; inspect the data, or "
            "publish anyway with {force}")

    version = registry.new_version(as_of)
    staged = registry.staging_dir(version)
    info = {**wm.artifact.manifest, "version": version, "quality_gate": gate.to_dict()}
    info.pop("model_kind", None)
    try:
        write_artifact(staged, model=wm.artifact.model, snapshot=wm.artifact.snapshot,
                       spec=wm.artifact.spec, catalog=catalog, info=info,
                       intervals=wm.artifact.intervals)
        registry.publish(staged, version)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)
    timings["total_s"] = time.perf_counter() - t_start
    return TrainResult(version, True, as_of, wm.metrics, timings, gate, cache=cache)


def _quality_gate(registry: Registry, eval_jobs: pd.DataFrame, new_acc: float | None,
                  margin: float) -> QualityGate:
    current = registry.latest_version()
    skipped = QualityGate(passed=True, margin=margin, current_version=current,
                          current_accuracy=None, new_accuracy=new_acc)
    if current is None:
        return replace(skipped, note="no published model yet")
    if new_acc is None or len(eval_jobs) == 0:
        return replace(skipped, note="no held-out day in the store; gate skipped")
    try:
        art = registry.load(current)
        pred = art.predict(eval_jobs)
    except (ArtifactError, ModelError) as exc:
        return replace(skipped, note=f"current model unusable ({exc}); gate skipped")
    cur_acc = metrics.accuracy(pred, eval_jobs["throughput"].to_numpy(dtype=np.float64))
    return replace(skipped, current_accuracy=cur_acc, passed=bool(new_acc >= cur_acc - margin))
