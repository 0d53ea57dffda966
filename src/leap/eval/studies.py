"""The held-out-day studies and the report pipeline: what ``leap report`` and ``leap
experiment lookup|ranking|impact`` compute, without the CLI.

:func:`eval_day` prepares the model of one held-out day (the published one, one kept by the
backtest, or one trained on its window); :func:`lookup_day`, :func:`ranking_day` and
:func:`impact_day` run a study on it and return a typed result; :func:`run_report` runs the
backtest and every study the store allows (ranking and impact need the simulator's oracle)
and returns a :class:`Report` whose :meth:`Report.write` hands the parts to
:func:`leap.eval.report.write_report`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.errors import ConfigError, ParamError
from leap.eval.alternatives import AlternativesResult
from leap.eval.backtest import BacktestResult, last_full_day
from leap.eval.baselines import LookupComparison
from leap.eval.impact_summary import ImpactFigures
from leap.eval.new_families import NewFamiliesResult
from leap.eval.new_hardware import NewHardwareResult
from leap.eval.oracle import is_simulated, oracle_fleet
from leap.eval.ranking import RankingFigures
from leap.eval.trials_check import TrialsResult
from leap.model.window import TrainConfig, day_start, load_attempts, window_attempts
from leap.records import Record

if TYPE_CHECKING:
    from leap.data.store import Store
    from leap.eval.real_data import RealDataResult
    from leap.eval.tables import Table
    from leap.rank.ranker import Ranker

_DAY = timedelta(days=1)
F = TypeVar("F", bound=Record)
R = TypeVar("R", bound=Record)
#: ``status(message)``: what a long step is doing now (a spinner's text in the CLI).
Status = Callable[[str], None]


def _quiet(message: str) -> None:
    """The default :data:`Status`: say nothing."""


# The held-out day -----------------------------------------------------------------------------
@dataclass
class EvalDay:
    """A model and the attempts around its held-out day, for the lookup / ranking / impact
    studies.

    ``past`` holds the window's attempts (all statuses), ``day`` every attempt of the
    held-out day, ``held`` its succeeded attempts and ``held_pred`` LEAP's samples/s for them.
    """

    as_of: datetime
    artifact: Any
    past: pd.DataFrame
    day: pd.DataFrame
    held: pd.DataFrame
    held_pred: np.ndarray
    source: str


def eval_day(store: Store, catalog: Catalog, cfg: TrainConfig, *, as_of: datetime | None = None,
             models_dir: Path | None = None, source: str = "auto",
             saved: Path | None = None) -> EvalDay:
    """The model of one held-out day: the published one, or one trained on its window.

    Parameters
    ----------
    store : Store
    catalog : Catalog
        Training catalog (when a model is trained).
    cfg : TrainConfig
        Training settings (when a model is trained; the window of a published model is its
        own).
    as_of : datetime, optional
        The held-out day. Default: the published model's day (``auto`` / ``published``), or
        the last full day in the store (``train``).
    models_dir : Path, optional
        The registry of published models.
    source : {"auto", "published", "train"}
        ``auto`` uses the ``saved`` model, else the published one, when its held-out day is
        ``as_of`` (or ``as_of`` is not given) and the store has that day; otherwise trains.
    saved : Path, optional
        An artifact directory kept by a backtest (``<run_dir>/model-YYYY-MM-DD``).

    Raises
    ------
    ParamError
        ``published`` without a usable published model, or an unknown ``source``.

    """
    from leap.errors import ArtifactError
    from leap.model.artifact import Registry, load_artifact
    from leap.model.train import train_window
    from leap.model.window import succeeded_attempts

    if source not in ("auto", "published", "train"):
        raise ParamError(f"{{source}} must be auto, published or train, got {source!r}")
    last = last_full_day(store)
    want = day_start(as_of) if as_of is not None else None
    art = None
    if source == "auto" and saved is not None and (saved / "manifest.json").is_file():
        try:
            kept = load_artifact(saved)
        except ArtifactError:
            kept = None  # a damaged copy: train instead
        if kept is not None:
            kept_day = day_start(datetime.fromisoformat(str(kept.manifest["as_of"])))
            if kept_day <= last and (want is None or want == kept_day):
                art, want = kept, kept_day
    if art is None and source in ("auto", "published") and models_dir is not None:
        try:
            art = Registry(models_dir).load()
        except ArtifactError as exc:
            if source == "published":
                raise ParamError(f"no usable published model ({exc}); run `leap train` or "
                                 "use {source} train") from None
        if art is not None:
            pub_day = day_start(datetime.fromisoformat(str(art.manifest["as_of"])))
            usable = pub_day <= last and (want is None or want == pub_day)
            if source == "published" and not usable:
                raise ParamError(f"the published model {art.version} is for "
                                 f"{pub_day:%Y-%m-%d}, not a full day of the store "
                                 "matching {as_of}; use {source} train")
            if usable:
                want = pub_day
            else:
                art = None
    elif source == "published":
        raise ParamError("{source} published needs a workspace with published models")
    day = want if want is not None else last
    if day > last:
        raise ParamError(f"{{as_of}} {day:%Y-%m-%d} is after the last full day in the store "
                         f"({last:%Y-%m-%d})")
    if art is not None:
        start = datetime.fromisoformat(str(art.manifest["window_start"]))
        attempts = load_attempts(store, start, day + _DAY)
        past = attempts[attempts["submitted_at"] < day].reset_index(drop=True)
        day_rows = attempts[attempts["submitted_at"] >= day].reset_index(drop=True)
        held = succeeded_attempts(day_rows, art.catalog)
        origin = f"published {art.version}" if art.path is None or art.path.parent == (
            models_dir) else f"kept by the backtest in {art.path}"
        return EvalDay(day, art, past, day_rows, held, art.predict(held), origin)
    attempts = window_attempts(store, day, cfg)
    wm = train_window(attempts, catalog, day, cfg)
    window_start = day - cfg.window_days * _DAY
    past = attempts[(attempts["submitted_at"] >= window_start)
                    & (attempts["submitted_at"] < day)].reset_index(drop=True)
    day_rows = attempts[attempts["submitted_at"] >= day].reset_index(drop=True)
    return EvalDay(day, wm.artifact, past, day_rows, wm.eval_jobs, np.exp(wm.eval_pred_log),
                   f"trained on {window_start:%Y-%m-%d}..{day - _DAY:%Y-%m-%d}")


# Studies of one held-out day --------------------------------------------------------------------
@dataclass(frozen=True)
class DayStudy(Record, Generic[F]):
    """A study of one held-out day: which model made the predictions, and its figures.

    :meth:`to_dict` is the JSON the CLI prints and the report stores: ``day`` (when known),
    ``model``, then the figures' own keys.
    """

    model: str
    figures: F
    day: str | None = None

    def to_dict(self) -> dict[str, Any]:
        head = {} if self.day is None else {"day": self.day}
        return {**head, "model": self.model, **self.figures.to_dict()}


@dataclass(frozen=True)
class LookupResult(DayStudy[LookupComparison]):
    """The lookup table beside LEAP (:func:`leap.eval.baselines.lookup_comparison`)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LookupResult:
        return cls(str(data["model"]), LookupComparison.from_dict(data), data.get("day"))


@dataclass(frozen=True)
class RankingResult(DayStudy[RankingFigures]):
    """Ranking quality against the oracle (:func:`leap.eval.ranking.ranking_study`)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankingResult:
        return cls(str(data["model"]), RankingFigures.from_dict(data), data.get("day"))


@dataclass(frozen=True)
class ImpactResult(DayStudy[ImpactFigures]):
    """Cost with and without advice (:func:`leap.eval.impact.impact_study`) and its time."""

    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "wall_s": self.wall_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImpactResult:
        return cls(str(data["model"]), ImpactFigures.from_dict(data), data.get("day"),
                   float(data.get("wall_s", 0.0)))


def _day_text(ed: EvalDay) -> str:
    return ed.as_of.date().isoformat()


def study_costs(ed: EvalDay, catalog_path: Path | None) -> Catalog:
    """The prices the ranking studies rank by: the workspace catalog, else the model's own."""
    return Catalog.load(catalog_path) if catalog_path else ed.artifact.catalog


def _ranker(ed: EvalDay, costs: Catalog) -> Ranker:
    from leap.rank.ranker import Ranker

    return Ranker(ed.artifact, costs=costs)


def lookup_day(ed: EvalDay) -> LookupResult:
    """The lookup table (the previous system) beside LEAP on the held-out day of ``ed``."""
    from leap.eval.baselines import lookup_comparison

    return LookupResult(ed.source, lookup_comparison(ed.past, ed.held, ed.held_pred,
                                                     ed.artifact.catalog), _day_text(ed))


def ranking_day(ed: EvalDay, store: Store, costs: Catalog, *, sample: int = 1000, seed: int = 0,
                status: Status = _quiet) -> RankingResult:
    """Rank ``sample`` jobs of the held-out day and score against the oracle (simulated
    stores only; the store's fleet must come from this simulator version)."""
    from leap.eval.ranking import ranking_study
    from leap.sim.fleet import Fleet

    fleet = Fleet.from_store(store)
    ranker = _ranker(ed, costs)
    status("ranking sampled jobs against the oracle")
    figures = ranking_study(ranker, fleet, ed.day, ed.past, costs, sample=sample, seed=seed)
    return RankingResult(ed.source, figures, _day_text(ed))


def impact_day(ed: EvalDay, store: Store, costs: Catalog, *, days: int = 3,
                advice_depth: int | None = 3, delay_cost: float = 1.0,
                status: Status = _quiet) -> ImpactResult:
    """Replay ``days`` days from the held-out day on in every arm of the impact study."""
    from leap.eval.impact import impact_study
    from leap.sim.fleet import Fleet

    fleet = Fleet.from_store(store)
    ranker = _ranker(ed, costs)
    jobs = ed.day if days == 1 else load_attempts(store, ed.as_of, ed.as_of + days * _DAY)
    t0 = time.perf_counter()
    status("replaying every attempt in each arm and solving the optimum")
    figures = impact_study(ranker, fleet, jobs, costs, advice_depth=advice_depth,
                           delay_cost_weight=delay_cost,
                           progress=lambda stage, d, t: status(f"{stage}: {d:,}/{t:,}"))
    return ImpactResult(ed.source, figures, wall_s=time.perf_counter() - t0)


# The report pipeline ----------------------------------------------------------------------------
@dataclass
class Report:
    """Every part of ``leap report``: the backtest and the studies on its last night."""

    backtest: BacktestResult
    lookup: LookupResult
    ranking: RankingResult | None = None
    impact: ImpactResult | None = None
    real_data: RealDataResult | None = None
    new_families: NewFamiliesResult | None = None
    new_hardware: NewHardwareResult | None = None
    trials: TrialsResult | None = None
    alternatives: AlternativesResult | None = None
    notes: list[str] = field(default_factory=list)

    def tables(self) -> list[Table]:
        """The terminal tables of every part but the real data (which prints its own)."""
        from leap.eval.report import report_tables

        return report_tables(backtest=self.backtest, lookup=self.lookup, ranking=self.ranking,
                             impact=self.impact, new_families=self.new_families,
                             new_hardware=self.new_hardware, trials=self.trials,
                             alternatives=self.alternatives)

    def write(self, out_dir: Path, meta: dict[str, Any]) -> Path:
        """Write ``index.html``, ``report.json`` and the plots; return the page."""
        from leap.eval.report import write_report

        return write_report(out_dir, backtest=self.backtest, lookup=self.lookup,
                            ranking=self.ranking, impact=self.impact, real_data=self.real_data,
                            new_families=self.new_families, new_hardware=self.new_hardware,
                            trials=self.trials, alternatives=self.alternatives,
                            notes=self.notes, meta=meta)


def saved_study(work_dir: Path, name: str, kind: type[R], key: str) -> R | None:
    """A study's result saved under ``<work_dir>/reports`` when present (else None).

    ``key`` must be among its top-level keys (else it is another file of the same name).

    Raises
    ------
    ConfigError
        The file cannot be read, or not as a ``kind``.
    """
    path = work_dir / "reports" / name
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc}); rerun the experiment that wrote "
                          "it") from None
    if not isinstance(data, dict) or key not in data:
        return None
    try:
        return kind.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{path}: not a result this version reads ({type(exc).__name__}: "
                          f"{exc}); rerun the experiment that wrote it") from None


def run_report(store: Store, backtest: BacktestResult, *, catalog: Catalog,
               catalog_path: Path | None, models_dir: Path, work_dir: Path, cfg: TrainConfig,
               sample: int = 1000, impact_days: int = 3, advice_depth: int | None = 3,
               real_data: RealDataResult | None = None, status: Status = _quiet) -> Report:
    """The studies of ``leap report`` on the last night of ``backtest``.

    The lookup comparison comes with the night; on a simulated store the ranking and impact
    studies run on the night's model (kept by the backtest, else the published or a newly
    trained one); a saved new-families result under ``work_dir`` is included.
    """
    last = backtest.nights[-1]
    notes = [f"backtest run directory: {backtest.run_dir} ({len(backtest.computed)} nights "
             f"computed now, {len(backtest.reused)} reused)"]
    report = Report(backtest, LookupResult("the backtest's last night", last.lookup, last.day),
                    notes=notes, real_data=real_data)
    if is_simulated(store):
        oracle_fleet(store, strict=True)  # fails early, with its message, on a foreign simulator
        status("preparing the model of the held-out day (training if needed)")
        day = datetime.fromisoformat(last.day).replace(tzinfo=UTC)
        ed = eval_day(store, catalog, cfg, as_of=day, models_dir=models_dir, source="auto",
                      saved=backtest.run_dir / f"model-{last.day}")
        notes.append(f"ranking and impact studies: model {ed.source}")
        costs = study_costs(ed, catalog_path)
        report.ranking = ranking_day(ed, store, costs, sample=sample, seed=0, status=status)
        report.impact = impact_day(ed, store, costs, days=impact_days,
                                    advice_depth=advice_depth, status=status)
    else:
        notes.append("ranking and impact studies skipped: the store is not simulated, "
                     "so there is no oracle")
    report.new_families = saved_study(work_dir, "new_families.json", NewFamiliesResult,
                                      "model_type_groups")
    if report.new_families is not None:
        notes.append(f"new-families study: {work_dir / 'reports' / 'new_families.json'} "
                     f"(day {report.new_families.day})")
    report.new_hardware = saved_study(work_dir, "new_hardware.json", NewHardwareResult, "types")
    report.trials = saved_study(work_dir, "trials.json", TrialsResult, "arms")
    report.alternatives = saved_study(work_dir, "alternatives.json", AlternativesResult,
                                      "methods")
    saved: tuple[tuple[str, NewHardwareResult | TrialsResult | AlternativesResult | None],
                 ...] = (("new-hardware", report.new_hardware), ("trials", report.trials),
                         ("alternatives", report.alternatives))
    for name, part in saved:
        if part is not None:
            notes.append(f"{name} study: {work_dir / 'reports'} (day {part.day})")
    return report
