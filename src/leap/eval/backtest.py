"""Backtest: consecutive nightly retrainings, each scored on the day after its window; resumable.

Night ``d`` trains :func:`leap.model.train.train_window` on the ``window_days`` days before
``d`` (the same code as ``leap train``, unpublished) and scores it on day ``d``. Each finished
night is written as ``night-YYYY-MM-DD.json`` (atomically) under a run directory named by a
hash of the settings (store, catalog, training config), so a killed backtest continues with
the nights still missing, and a longer backtest reuses the nights of a shorter one.

Nights are independent given the (read-only) store: :class:`~leap.eval.parallel.Parallel`
runs them in this process, on local processes or on Dask. Every night is computed the same
way wherever it runs (fixed LightGBM seeds and threads), so the numbers do not depend on the
backend. A process keeps the encoded training days of its previous night (consecutive
windows share all but one day), which is why one process on consecutive nights is cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap import __version__, metrics
from leap.catalog import Catalog
from leap.data.usage import device_hours
from leap.errors import DataError, ParamError
from leap.eval.backtest_summary import BacktestSummary, summarize
from leap.eval.baselines import LookupComparison, lookup_comparison
from leap.eval.oracle import Ceiling, oracle_ceiling, oracle_fleet
from leap.eval.parallel import Parallel
from leap.features.encode import FEATURE_VERSION
from leap.model.train import HeldOutFigures, Window, WindowModel, family_seen
from leap.model.window import EncodeCache, TrainConfig, day_start, window_attempts
from leap.records import Record

#: 2: nights carry the spec-ratio transfer comparison.
FORMAT_VERSION = 2
#: Bins of log10(predicted / measured) for the error distribution: 0.1x to 10x.
ERROR_EDGES = np.round(np.linspace(-1.0, 1.0, 81), 6)
_DAY = timedelta(days=1)
#: Night fields that depend on where and when it ran (left out of equality checks).
RUN_FIELDS = ("timings_s", "worker")

Progress = Callable[[int, int, "Night | None"], None]


@dataclass(frozen=True)
class NightTask:
    """One night, as plain data a worker process or Dask worker can receive."""

    store_path: str
    catalog_toml: str
    as_of: str
    cfg: dict[str, Any]
    run_key: str
    #: Also write the night's model here (an artifact directory), e.g. for the last night.
    model_dir: str | None = None


@dataclass(frozen=True)
class ErrorHistogram(Record):
    """Held-out attempts per bin of log10(predicted / measured) (:data:`ERROR_EDGES`); the
    end bins include what lies beyond, also counted apart."""

    log10_edges: list[float]
    counts: list[int]
    clipped_low: int
    clipped_high: int


@dataclass(frozen=True)
class Night(Record):
    """One night's record (``night-YYYY-MM-DD.json``, :func:`night_result`).

    ``held_out`` is the training's held-out figures (:func:`leap.model.train.evaluate`),
    with ``seen_families`` and ``unseen_families`` weighted by device-hours too and
    ``unseen_share``; ``oracle_ceiling`` the
    simulator's ceiling (None on real data); ``timings_s`` and ``worker`` (:data:`RUN_FIELDS`)
    say where and how long it ran.
    """

    OMIT_NONE = frozenset(RUN_FIELDS)

    format: int
    day: str
    window: Window
    train_rows: int
    held_out: HeldOutFigures
    oracle_ceiling: Ceiling | None
    lookup: LookupComparison
    error_hist: ErrorHistogram
    timings_s: dict[str, float] | None = None
    worker: dict[str, str | int] | None = None


@dataclass
class BacktestResult:
    """Nights (sorted by day), which were computed now and which reused, and the summary."""

    run_dir: Path
    settings: dict[str, Any]
    nights: list[Night]
    computed: list[str]
    reused: list[str]
    wall_s: float
    summary: BacktestSummary

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the result (every night), as ``leap backtest --json`` prints it."""
        return {"run_dir": str(self.run_dir), "settings": self.settings,
                "computed": self.computed, "reused": self.reused, "wall_s": self.wall_s,
                "summary": self.summary.to_dict(),
                "nights": [n.to_dict() for n in self.nights]}

    #: The older name of :meth:`to_dict`.
    to_json = to_dict

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BacktestResult:
        """Read :meth:`to_dict` back (e.g. the ``backtest`` part of a ``report.json``)."""
        return cls(run_dir=Path(data["run_dir"]), settings=dict(data["settings"]),
                   nights=[Night.from_dict(n) for n in data["nights"]],
                   computed=list(data["computed"]),
                   reused=list(data["reused"]), wall_s=float(data["wall_s"]),
                   summary=BacktestSummary.from_dict(data.get("summary", {})))


# Planning -------------------------------------------------------------------------------------
def last_full_day(store: Any) -> datetime:
    """The last day of the store whose attempts run past 20:00 UTC (a complete day)."""
    rng = store.time_range()
    if rng is None:
        raise DataError("the store has no attempts; ingest or simulate some first")
    last = rng[1].astimezone(UTC)
    return day_start(last) - (timedelta(0) if last.hour >= 20 else _DAY)


def plan_nights(store: Any, nights: int, window_days: int,
                end: datetime | None = None) -> list[datetime]:
    """The held-out days of ``nights`` consecutive nights ending at ``end``.

    ``end`` defaults to the last full day in the store. The first night's window must lie
    inside the store.

    Raises
    ------
    ConfigError
        Too few days in the store for ``nights`` windows of ``window_days`` days.
    """
    if nights < 1:
        raise ParamError(f"{{nights}} must be >= 1, got {nights}")
    rng = store.time_range()
    if rng is None:
        raise DataError("the store has no attempts; ingest or simulate some first")
    first = day_start(rng[0])
    last = day_start(end) if end is not None else last_full_day(store)
    if last > last_full_day(store):
        raise ParamError(f"{{end}} {last:%Y-%m-%d} is after the last full day in the store "
                         f"({last_full_day(store):%Y-%m-%d}); pick an earlier day")
    days = [last - (nights - 1 - i) * _DAY for i in range(nights)]
    if days[0] - window_days * _DAY < first:
        have = (last - first).days  # full days available before `last`
        raise ParamError(
            f"{nights} nights with {window_days}-day windows need {nights + window_days} days "
            f"up to {last:%Y-%m-%d}, but the store starts on {first:%Y-%m-%d} ({have + 1} "
            f"days); use {{nights}} {max(have - window_days + 1, 0)} or a shorter "
            "{window_days}, or simulate more days")
    return days


def run_key(store: Any, catalog: Catalog, cfg: TrainConfig) -> tuple[str, dict[str, Any]]:
    """A short hash naming the run directory, and the settings it hashes.

    The held-out days are not part of it (each night has its own file), so a longer or
    later backtest with the same settings reuses the nights already computed.
    """
    sim = {k: store.get_meta(f"sim.{k}") for k in ("seed", "start", "version", "scenario")}
    settings = {
        "format": FORMAT_VERSION,
        "leap_version": __version__,
        "feature_version": FEATURE_VERSION,
        "store": str(Path(store.path).resolve()),
        "simulation": {k: v for k, v in sim.items() if k != "scenario"} | {
            "scenario_sha256": hashlib.sha256(sim["scenario"].encode()).hexdigest()[:16]
            if sim["scenario"] else None},
        "catalog_fingerprint": catalog.fingerprint(),
        # Threads change the speed of a fit, never its model.
        "train_config": {k: v for k, v in asdict(cfg).items() if k != "threads"},
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return digest, settings


# One night ------------------------------------------------------------------------------------
# Per process: the encoded training days of the nights this process already ran, and the
# oracle fleet, for the run it is working on. A worker process serves many nights; keeping
# them here is what makes consecutive nights cheap (only the newest day is encoded).
_PROCESS_CACHE: dict[str, Any] = {}


def _cache_for(key: str) -> dict[str, Any]:
    if _PROCESS_CACHE.get("key") != key:
        _PROCESS_CACHE.clear()
        _PROCESS_CACHE.update({"key": key, "encoded": EncodeCache(), "fleet": None,
                               "fleet_loaded": False})
    return _PROCESS_CACHE


def run_night(task: NightTask) -> dict[str, Any]:
    """Train and score one night (the worker entry point: plain data in, JSON-ready out)."""
    from leap.data.store import Store
    from leap.model.train import train_window

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    cfg = TrainConfig.from_dict(task.cfg)
    as_of = day_start(datetime.fromisoformat(task.as_of))
    catalog = Catalog.from_toml(task.catalog_toml, origin="backtest catalog")
    cache = _cache_for(task.run_key)
    with Store(Path(task.store_path), read_only=True) as store:
        attempts = window_attempts(store, as_of, cfg)
        if not cache["fleet_loaded"]:
            cache["fleet"] = oracle_fleet(store)
            cache["fleet_loaded"] = True
    load_s = time.perf_counter() - t0
    encoded: EncodeCache = cache["encoded"]
    wm = train_window(attempts, catalog, as_of, cfg, cache=encoded)
    # What lies before this window is of no use to the next (later) night of this process.
    encoded.prune(as_of, cfg)
    window_start = as_of - cfg.window_days * _DAY
    past = attempts[(attempts["submitted_at"] >= window_start)
                    & (attempts["submitted_at"] < as_of)]
    night = replace(night_result(wm, past, cache["fleet"]),
                    timings_s={"load_s": load_s, **wm.timings,
                               "night_s": time.perf_counter() - t0,
                               "night_cpu_s": time.process_time() - cpu0},
                    worker={"host": socket.gethostname(), "pid": os.getpid()})
    if task.model_dir is not None:
        save_model(wm, Path(task.model_dir))
    return night.to_dict()


def save_model(wm: WindowModel, directory: Path) -> None:
    """Write a night's model as an (unpublished) artifact directory, atomically.

    Skipped when the directory's parent is not reachable from this worker (a remote Dask
    worker without the shared file system): the studies then retrain that night.
    """
    from leap.model.artifact import write_artifact

    if directory.exists() or not directory.parent.is_dir():
        return
    staged = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    if staged.exists():
        shutil.rmtree(staged)
    info = {k: v for k, v in wm.artifact.manifest.items() if k != "model_kind"}
    art = wm.artifact
    write_artifact(staged, model=art.model, snapshot=art.snapshot, spec=art.spec,
                   catalog=art.catalog, info=info | {"version": f"backtest-{directory.name}"},
                   intervals=art.intervals)
    try:
        os.replace(staged, directory)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)  # another worker saved it first


def night_result(wm: WindowModel, past: pd.DataFrame, fleet: Any = None) -> Night:
    """The record of one night: accuracy blocks, oracle ceiling, lookup, error histogram.

    Parameters
    ----------
    wm : WindowModel
        The night's model and its held-out day (from :func:`~leap.model.train.train_window`).
    past : pandas.DataFrame
        The window's attempts (the lookup table's memory).
    fleet : Fleet, optional
        The simulated fleet (oracle ceiling); None for real data.
    """
    held = wm.metrics.held_out
    if held is None or len(wm.eval_jobs) == 0:
        raise DataError(f"no succeeded attempts on the held-out day {wm.as_of:%Y-%m-%d}; "
                        "the backtest needs a full day after each window")
    jobs = wm.eval_jobs
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    pred = np.exp(wm.eval_pred_log)
    hours = device_hours(jobs)
    seen = family_seen(wm.artifact.snapshot, jobs)
    held = replace(held, seen_families=metrics.summary(pred[seen], actual[seen], hours[seen]),
                   unseen_families=metrics.summary(pred[~seen], actual[~seen], hours[~seen]),
                   unseen_share=float((~seen).mean()))
    ceiling = oracle_ceiling(fleet, jobs) if fleet is not None else None
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log10(pred / actual)
    log_ratio = log_ratio[np.isfinite(log_ratio)]
    counts, _ = np.histogram(np.clip(log_ratio, ERROR_EDGES[0], ERROR_EDGES[-1]), ERROR_EDGES)
    return Night(
        format=FORMAT_VERSION, day=wm.as_of.date().isoformat(), window=wm.metrics.window,
        train_rows=wm.metrics.train_rows, held_out=held, oracle_ceiling=ceiling,
        lookup=lookup_comparison(past, jobs, pred, wm.artifact.catalog),
        error_hist=ErrorHistogram(log10_edges=ERROR_EDGES.tolist(), counts=counts.tolist(),
                                  clipped_low=int((log_ratio < ERROR_EDGES[0]).sum()),
                                  clipped_high=int((log_ratio > ERROR_EDGES[-1]).sum())))


# The run --------------------------------------------------------------------------------------
def night_path(run_dir: Path, day: str) -> Path:
    """Where a night's record lives.

    >>> night_path(Path("w"), "2026-03-31").name
    'night-2026-03-31.json'
    """
    return run_dir / f"night-{day}.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` via a temporary file and a rename (readers never see half).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "x.json"
    >>> write_json_atomic(p, {"a": np.float64(1.5)}); json.loads(p.read_text())
    {'a': 1.5}
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_json_default) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, datetime):
        return obj.isoformat()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_night(path: Path) -> Night | None:
    """A finished night's record, or None when the file is absent, unreadable or stale.

    >>> read_night(Path("/nonexistent/night-2026-01-01.json")) is None
    True
    """
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT_VERSION:
        return None
    try:
        return Night.from_dict(rec)
    except (TypeError, KeyError, ValueError):  # a field missing or malformed: compute again
        return None


def run_backtest(store_path: Path, catalog: Catalog, cfg: TrainConfig, *, nights: int,
                 work_dir: Path, end: datetime | None = None,
                 parallel: Parallel | None = None,
                 progress: Progress | None = None) -> BacktestResult:
    """Run (or resume) ``nights`` nightly retrainings ending at ``end``.

    Parameters
    ----------
    store_path : Path
        The attempt store (opened read-only; workers open it too).
    catalog : Catalog
        Hardware catalog of training.
    cfg : TrainConfig
        The nightly training settings (model kind, K, window ...): the backtest costs what
        one ``leap train`` costs, times ``nights``.
    nights : int
    work_dir : Path
        Where the run directory ``backtest-<hash>`` lives (``<home>/work``).
    end : datetime, optional
        The last held-out day (default: the last full day in the store).
    parallel : Parallel, optional
        Where nights run (default: this process).
    progress : callable, optional
        ``progress(done, total, night_or_None)``; called once before the first night.

    Returns
    -------
    BacktestResult
    """
    from leap.data.store import Store

    t0 = time.perf_counter()
    parallel = parallel or Parallel()
    with Store(Path(store_path), read_only=True) as store:
        days = plan_nights(store, nights, cfg.window_days, end)
        key, settings = run_key(store, catalog, cfg)
    run_dir = Path(work_dir) / f"backtest-{key}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "settings.json").exists():
        write_json_atomic(run_dir / "settings.json", settings)
    wanted = [d.date().isoformat() for d in days]
    done: dict[str, Night] = {}
    for day in wanted:
        kept = read_night(night_path(run_dir, day))
        if kept is not None:
            done[day] = kept
    reused = sorted(done)
    todo = [d for d in wanted if d not in done]
    if progress:
        progress(len(done), len(wanted), None)
    toml = catalog.to_toml()
    # The last night's model is kept: the ranking and impact studies of `leap report` use it.
    last_model = run_dir / f"model-{wanted[-1]}"
    task_cfg = asdict(replace(cfg, threads=parallel.task_threads(cfg.threads)))
    tasks = [NightTask(str(Path(store_path).resolve()), toml, d, task_cfg, key,
                       str(last_model) if d == wanted[-1] else None) for d in todo]
    computed: list[str] = []
    for i, rec in parallel.map(run_night, tasks):
        write_json_atomic(night_path(run_dir, todo[i]), rec)
        night = done[todo[i]] = Night.from_dict(rec)
        computed.append(todo[i])
        if progress:
            progress(len(done), len(wanted), night)
    ordered = [done[d] for d in wanted]
    return BacktestResult(run_dir=run_dir, settings=settings | {
        "nights": nights, "first_day": wanted[0], "last_day": wanted[-1],
        "backend": parallel.backend, "workers": parallel.workers},
        nights=ordered, computed=sorted(computed), reused=reused,
        wall_s=time.perf_counter() - t0, summary=summarize([n.to_dict() for n in ordered]))


def comparable(night: Night | Mapping[str, Any]) -> dict[str, Any]:
    """A night's record (or its JSON) without the fields that depend on where and when it ran.

    >>> comparable({"day": "2026-01-12", "timings_s": {"fit_s": 3.0}, "worker": {}})
    {'day': '2026-01-12'}
    """
    rec = night.to_dict() if isinstance(night, Night) else night
    return {k: v for k, v in rec.items() if k not in RUN_FIELDS}
