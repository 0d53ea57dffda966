"""Nightly training: window of attempts -> point-in-time features -> model -> published artifact.

``train_nightly`` trains on the attempts of the ``window_days`` days before ``as_of``,
evaluates on ``as_of``'s own day when the store has it, applies the quality gate against the
currently published model, and publishes atomically.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.data.store import Store
from leap.errors import ArtifactError, ModelError, QualityGateError
from leap.features.encode import FEATURE_NAMES, FeatureSpec, base_margin, encode
from leap.features.history import LEVELS, HistoryBuilder, Snapshot, prepare_history
from leap.model.artifact import Artifact, Registry, write_artifact
from leap.model.cascade import CascadeModel, GBMParams, GlobalModel, Model

Progress = Callable[[str, int, int], None]

#: History features (and the estimate built from them): what the no-history ablation drops.
HISTORY_FEATURES = frozenset([s for lv in LEVELS for s in lv.stats]
                             + ["has_family_history", "hist_level", "hist_est"])


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one nightly training run (the CLI builds it once).

    ``model_kind`` is ``"cascade"`` (default, K specialists) or ``"global"`` (one model, the
    ablation). ``objective`` is ``"quantile"`` (median, default) or ``"l2"`` (mean, ablation).
    ``validation_days`` trailing days of the window serve for early stopping (a time-based
    split, never a random one).
    """

    window_days: int = 30
    lookback_days: int = 30
    model_kind: str = "cascade"
    n_specialists: int = 13
    objective: str = "quantile"
    use_history: bool = True
    validation_days: int = 1
    quality_margin: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        if self.window_days < 2:
            raise ModelError(f"window_days must be >= 2, got {self.window_days}")
        if self.model_kind not in ("cascade", "global"):
            raise ModelError(f"model kind must be 'cascade' or 'global', got {self.model_kind!r}")
        if self.objective not in ("quantile", "l2"):
            raise ModelError(f"objective must be 'quantile' or 'l2', got {self.objective!r}")
        if not 0 < self.validation_days < self.window_days:
            raise ModelError("validation_days must be between 1 and window_days - 1")


@dataclass
class TrainingSet:
    """Encoded rows of a window (``day`` = days since the window start) and the eval day."""

    X: np.ndarray
    y: np.ndarray
    day: np.ndarray
    spec: FeatureSpec
    fallback_log_tp: float
    serving_snapshot: Snapshot
    eval_jobs: pd.DataFrame
    eval_X: np.ndarray
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainResult:
    version: str | None
    published: bool
    as_of: datetime
    metrics: dict[str, Any]
    timings: dict[str, float]
    gate: dict[str, Any]
    artifact: Artifact | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "published": self.published,
                "as_of": self.as_of.isoformat(), "metrics": self.metrics,
                "timings_s": self.timings, "quality_gate": self.gate}


def day_start(d: date | datetime) -> datetime:
    if isinstance(d, datetime):
        d = d.astimezone(UTC).date()
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def default_as_of(store: Store, now: datetime | None = None) -> datetime:
    """The day after the last full day in the store, never after ``now``.

    The last day with attempts counts as full when its latest attempt is after 20:00 UTC;
    otherwise that partial day becomes the as-of day (and is the held-out day). With ``now``
    (the wall clock, passed by ``leap train``), attempts stamped after it are ignored, so one
    row dated in the future cannot move training into an empty window.
    """
    rng = store.time_range(until=now)
    if rng is None:
        raise ModelError("the store has no attempts" + (
            f" submitted before {now:%Y-%m-%d %H:%M} UTC" if now is not None else "")
            + "; ingest or simulate some first (or pass --as-of)")
    last = rng[1].astimezone(UTC)
    as_of = day_start(last) + (timedelta(days=1) if last.hour >= 20 else timedelta(0))
    return as_of if now is None else min(as_of, day_start(now))


def load_attempts(store: Store, start: datetime, end: datetime) -> pd.DataFrame:
    """Attempts submitted in ``[start, end)`` in a stable order (time, then id)."""
    frame = store.attempts(start, end).to_pandas()
    if len(frame):
        frame["submitted_at"] = pd.to_datetime(frame["submitted_at"], utc=True)
        frame = frame.sort_values(["submitted_at", "attempt_id"], kind="stable")
    return frame.reset_index(drop=True)


def succeeded_attempts(frame: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    ok = (frame["status"] == "succeeded") & (frame["throughput"] > 0) & frame["hardware"].isin(
        list(catalog))
    return frame[ok].reset_index(drop=True)


@dataclass
class EncodeCache:
    """What consecutive nightly windows share (a backtest worker keeps one across nights).

    A day's encoded rows depend only on the attempts before that day and on the feature spec
    (``blocks``, keyed by day and spec); a day's prepared history rows depend only on that
    day's attempts and the catalog (``history``, keyed by day and catalog). Each entry also
    records its row count, so a day that gained rows is rebuilt.
    """

    blocks: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)
    history: dict[tuple[str, str], tuple[int, pd.DataFrame]] = field(default_factory=dict)

    def prune(self, as_of: datetime, cfg: TrainConfig) -> None:
        """Forget what no window ending at or after ``as_of`` can use."""
        window = (as_of - timedelta(days=cfg.window_days)).date().isoformat()
        lookback = (as_of - timedelta(days=cfg.window_days + cfg.lookback_days)).date().isoformat()
        for k in [k for k in self.blocks if k[0] < window]:
            del self.blocks[k]
        for h in [h for h in self.history if h[0] < lookback]:
            del self.history[h]


def _prepared_history(past: pd.DataFrame, catalog: Catalog,
                      cache: EncodeCache | None) -> pd.DataFrame:
    """:func:`prepare_history` of ``past``, day by day through ``cache`` when given."""
    if cache is None or past.empty:
        return prepare_history(past, catalog)
    fingerprint = catalog.fingerprint()
    parts = []
    for day, rows in past.groupby(past["submitted_at"].dt.floor("D"), sort=True):
        key = (day.date().isoformat(), fingerprint)
        hit = cache.history.get(key)
        if hit is None or hit[0] != len(rows):
            hit = cache.history[key] = (len(rows), prepare_history(rows, catalog))
        parts.append(hit[1])
    return pd.concat(parts, ignore_index=True)


def build_training_set(attempts: pd.DataFrame, catalog: Catalog, as_of: datetime,
                       cfg: TrainConfig, progress: Progress | None = None,
                       cache: EncodeCache | None = None) -> TrainingSet:
    """Encode the window's succeeded attempts, each with history as of its own day.

    Consecutive nightly windows share most of this work: pass the same ``cache`` to reuse
    each day's encoded block and prepared history instead of rebuilding them.
    """
    timings: dict[str, float] = {}
    window_start = as_of - timedelta(days=cfg.window_days)
    t0 = time.perf_counter()
    past = attempts[attempts["submitted_at"] < as_of]
    builder = HistoryBuilder(_prepared_history(past, catalog, cache),
                             lookback_days=cfg.lookback_days)
    timings["history_prepare_s"] = time.perf_counter() - t0

    train_rows = succeeded_attempts(attempts[(attempts["submitted_at"] >= window_start)
                                     & (attempts["submitted_at"] < as_of)], catalog)
    if len(train_rows) < 50:
        raise ModelError(f"only {len(train_rows)} succeeded attempts in the window "
                         f"{window_start:%Y-%m-%d}..{as_of:%Y-%m-%d}; need at least 50 "
                         "(check --as-of and --window-days against `leap stats`)")
    spec = FeatureSpec.fit(train_rows, catalog)
    if not cfg.use_history:
        spec = replace(spec, names=tuple(n for n in FEATURE_NAMES if n not in HISTORY_FEATURES))
    day = ((train_rows["submitted_at"] - window_start).dt.total_seconds() // 86400).astype(int)
    day_arr = day.to_numpy()
    blocks: list[np.ndarray] = []
    snap_s = enc_s = 0.0
    spec_key = hashlib.sha256(spec.to_json().encode()).hexdigest()[:16]
    for d in range(cfg.window_days):
        rows = train_rows[day_arr == d]
        if progress:
            progress("features", d + 1, cfg.window_days + 1)
        if len(rows) == 0:
            continue
        key = ((window_start + timedelta(days=d)).date().isoformat(), spec_key)
        if cache is not None and key in cache.blocks and len(cache.blocks[key]) == len(rows):
            blocks.append(cache.blocks[key])
            continue
        t1 = time.perf_counter()
        snap = builder.snapshot(window_start + timedelta(days=d))
        t2 = time.perf_counter()
        blocks.append(encode(rows, snap, catalog, spec))
        snap_s += t2 - t1
        enc_s += time.perf_counter() - t2
        if cache is not None:
            cache.blocks[key] = blocks[-1]
    t1 = time.perf_counter()
    serving = builder.snapshot(as_of)
    snap_s += time.perf_counter() - t1
    builder.close()
    if progress:
        progress("features", cfg.window_days + 1, cfg.window_days + 1)

    eval_jobs = succeeded_attempts(attempts[(attempts["submitted_at"] >= as_of)
                                    & (attempts["submitted_at"] < as_of + timedelta(days=1))],
                           catalog)
    t2 = time.perf_counter()
    eval_X = encode(eval_jobs, serving, catalog, spec)
    enc_s += time.perf_counter() - t2
    timings["snapshot_s"] = snap_s
    timings["features_s"] = enc_s
    y = np.log(train_rows["throughput"].to_numpy(dtype=np.float64))
    return TrainingSet(X=np.vstack(blocks), y=y, day=day_arr, spec=spec,
                       fallback_log_tp=float(np.median(y)), serving_snapshot=serving,
                       eval_jobs=eval_jobs, eval_X=eval_X, timings=timings)


def make_model(cfg: TrainConfig) -> Model:
    params = GBMParams(objective=cfg.objective, seed=cfg.seed)
    if cfg.model_kind == "global":
        return GlobalModel(params=params)
    return CascadeModel(n_specialists=cfg.n_specialists, params=params)


def fit_model(ts: TrainingSet, cfg: TrainConfig) -> Model:
    """Fit on the window, early-stopping on its last ``validation_days`` days."""
    base = base_margin(ts.X, ts.spec, ts.fallback_log_tp)
    val = ts.day >= cfg.window_days - cfg.validation_days
    model = make_model(cfg)
    return model.fit(ts.X[~val], ts.y[~val], base=base[~val], feature_names=list(ts.spec.names),
                     categorical=ts.spec.categorical, val=(ts.X[val], ts.y[val], base[val]))


def evaluate(pred_log: np.ndarray, jobs: pd.DataFrame, fam_seen: np.ndarray) -> dict[str, Any]:
    """Accuracy block for a held-out day: overall, GPU-hour weighted, seen vs unseen families."""
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    pred = np.exp(pred_log)
    gpu_hours = _gpu_hours(jobs)
    out: dict[str, Any] = metrics.summary(pred, actual, gpu_hours)
    out["seen_families"] = metrics.summary(pred[fam_seen], actual[fam_seen])
    out["unseen_families"] = metrics.summary(pred[~fam_seen], actual[~fam_seen])
    return out


def _gpu_hours(jobs: pd.DataFrame) -> np.ndarray | None:
    if "duration_hours" not in jobs.columns:
        return None
    devices = jobs["trainer_count"].to_numpy(dtype=np.float64) * (
        jobs["devices_per_trainer"].fillna(1).to_numpy(dtype=np.float64)
        if "devices_per_trainer" in jobs.columns else 1.0)
    return jobs["duration_hours"].fillna(0).to_numpy(dtype=np.float64) * devices


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
    metrics: dict[str, Any]
    timings: dict[str, float]
    eval_jobs: pd.DataFrame
    eval_pred_log: np.ndarray


def train_window(attempts: pd.DataFrame, catalog: Catalog, as_of: datetime,
                 cfg: TrainConfig | None = None, progress: Progress | None = None,
                 cache: EncodeCache | None = None) -> WindowModel:
    """Train on the ``cfg.window_days`` days of ``attempts`` before ``as_of``; evaluate on its day.

    ``attempts`` must reach back ``window_days + lookback_days`` before ``as_of`` for full
    history (see :func:`load_attempts`); later attempts are used only for evaluation.
    ``cache`` is shared by consecutive nights (see :class:`EncodeCache`).
    """
    cfg = cfg or TrainConfig()
    as_of = day_start(as_of)
    ts = build_training_set(attempts, catalog, as_of, cfg, progress, cache)
    timings = dict(ts.timings)
    if progress:
        progress("fit", 0, 1)
    t0 = time.perf_counter()
    model = fit_model(ts, cfg)
    timings["fit_s"] = time.perf_counter() - t0
    if progress:
        progress("fit", 1, 1)
    window = {"start": (as_of - timedelta(days=cfg.window_days)).isoformat(),
              "end": as_of.isoformat()}
    result_metrics: dict[str, Any] = {"train_rows": len(ts.y), "window": window}
    manifest = {"version": "unpublished", "as_of": as_of.isoformat(),
                "window_start": window["start"], "window_end": window["end"],
                "window_days": cfg.window_days, "lookback_days": cfg.lookback_days,
                "train_config": asdict(cfg), "fallback_log_throughput": ts.fallback_log_tp,
                "model_kind": model.kind}
    artifact = Artifact(version="unpublished", path=None, manifest=manifest, model=model,
                        snapshot=ts.serving_snapshot, spec=ts.spec, catalog=catalog)
    pred = np.empty(0)
    if len(ts.eval_jobs):
        pred = model.predict(ts.eval_X, base=base_margin(ts.eval_X, ts.spec, ts.fallback_log_tp))
        seen = family_seen(ts.serving_snapshot, ts.eval_jobs)
        result_metrics["held_out"] = {"day": as_of.date().isoformat(),
                                      **evaluate(pred, ts.eval_jobs, seen)}
    manifest["metrics"] = result_metrics
    return WindowModel(as_of, cfg, artifact, result_metrics, timings, ts.eval_jobs, pred)


def train_nightly(store: Store, catalog: Catalog, registry: Registry, *,
                  as_of: datetime | None = None, cfg: TrainConfig | None = None,
                  publish: bool = True, force: bool = False,
                  progress: Progress | None = None, now: datetime | None = None
                  ) -> TrainResult:
    """Train on the window before ``as_of``, evaluate on its day, gate, and publish.

    Parameters
    ----------
    store, catalog, registry
        Where attempts come from, the hardware catalog, and where models are published.
    as_of : datetime, optional
        Start of the held-out day (UTC midnight); default :func:`default_as_of` (with ``now``).
    cfg : TrainConfig, optional
    publish : bool
        Write and publish the artifact (False: train and evaluate only).
    force : bool
        Publish even when the quality gate refuses.
    now : datetime, optional
        The wall clock, for the default ``as_of``: attempts after it are ignored.

    Raises
    ------
    QualityGateError
        The new model's held-out accuracy is more than ``cfg.quality_margin`` below the
        current model's on the same day (nothing is published).

    Examples
    --------
    >>> # result = train_nightly(store, catalog, Registry(ws.models_dir))
    """
    cfg = cfg or TrainConfig()
    as_of = day_start(as_of) if as_of is not None else default_as_of(store, now)
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    attempts = load_attempts(store, as_of - timedelta(days=cfg.window_days + cfg.lookback_days),
                             as_of + timedelta(days=1))
    load_s = time.perf_counter() - t0
    wm = train_window(attempts, catalog, as_of, cfg, progress)
    timings = {"load_s": load_s, **wm.timings}
    held = wm.metrics.get("held_out")
    new_acc = float(held["accuracy"]) if held else None
    gate = _quality_gate(registry, wm.eval_jobs, new_acc, cfg.quality_margin)
    timings["total_s"] = time.perf_counter() - t_start
    if not publish:
        return TrainResult(None, False, as_of, wm.metrics, timings, gate, wm.artifact)
    if not gate["passed"] and not force:
        raise QualityGateError(
            f"refusing to publish: held-out accuracy {new_acc:.3f} is more than "
            f"{cfg.quality_margin:.3f} below the current model {gate['current_version']} "
            f"({gate['current_accuracy']:.3f}) on {as_of:%Y-%m-%d}; inspect the data, or "
            "publish anyway with --force")

    version = registry.new_version(as_of)
    staged = registry.staging_dir(version)
    info = {**wm.artifact.manifest, "version": version, "quality_gate": gate}
    info.pop("model_kind", None)
    try:
        write_artifact(staged, model=wm.artifact.model, snapshot=wm.artifact.snapshot,
                       spec=wm.artifact.spec, catalog=catalog, info=info)
        registry.publish(staged, version)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)
    timings["total_s"] = time.perf_counter() - t_start
    return TrainResult(version, True, as_of, wm.metrics, timings, gate)


def _quality_gate(registry: Registry, eval_jobs: pd.DataFrame, new_acc: float | None,
                  margin: float) -> dict[str, Any]:
    current = registry.latest_version()
    gate: dict[str, Any] = {"passed": True, "margin": margin, "current_version": current,
                            "current_accuracy": None, "new_accuracy": new_acc}
    if current is None:
        gate["note"] = "no published model yet"
        return gate
    if new_acc is None or len(eval_jobs) == 0:
        gate["note"] = "no held-out day in the store; gate skipped"
        return gate
    try:
        art = registry.load(current)
        pred = art.predict(eval_jobs)
    except (ArtifactError, ModelError) as exc:
        gate["note"] = f"current model unusable ({exc}); gate skipped"
        return gate
    cur_acc = metrics.accuracy(pred, eval_jobs["throughput"].to_numpy(dtype=np.float64))
    gate["current_accuracy"] = cur_acc
    gate["passed"] = bool(new_acc >= cur_acc - margin)
    return gate
