"""New hardware: hold an accelerator type out of training and measure what leap loses on it.

:func:`new_hardware_study` answers two questions on a held-out day:

* **held out**: for each named type, a model trained without any of that type's attempts in
  its window (and lookback) scores the type's attempts of the day, beside the model that saw
  them (accuracy within ±20%); on a simulated store both also rank sampled jobs of the day
  that could run on the type, against the oracle (ranking regret, top-1, how often the type
  is picked and how often it is truly best);
* **newest type's curve**: the type whose first attempt is the latest in the store (on the
  default fleet the scenario's ``new_hardware``, B200 from day 10) scored night by night
  after its arrival, beside the fleet's accuracy that night: how many days of history it takes
  to reach the fleet's level.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.usage import device_hours
from leap.errors import CatalogError, ConfigError, ParamError, did_you_mean
from leap.eval.baselines import CHEAPEST, cheapest_order
from leap.eval.new_families import TrainSettings, score_block, score_model
from leap.eval.oracle import oracle_fleet
from leap.eval.rank_quality import order_quality, summarize_quality
from leap.model.train import WindowModel, train_window
from leap.model.window import TrainConfig, day_start, window_attempts
from leap.records import Record

if TYPE_CHECKING:
    from leap.data.store import Store
    from leap.sim.fleet import Fleet

_DAY = timedelta(days=1)
#: Days of history at which the newest type's curve is scored (capped by the store).
DEFAULT_CURVE_DAYS: tuple[int, ...] = (0, 1, 2, 3, 5, 7, 10, 14, 20)
Progress = Callable[[str], None]


# The results --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TypeRanking(Record):
    """:func:`rank_on_type`: the jobs sampled, and per model (``seen``, ``held_out``,
    ``leap`` ...) and of the cheapest-type rule (``cheapest``) its
    :func:`~leap.eval.rank_quality.summarize_quality` figures with ``coverage`` and
    ``picks_type``. In the JSON each model's block sits at the top level."""

    OMIT_NONE = frozenset({"n_eligible", "type_is_best"})

    n_sampled: int
    n_eligible: int | None = None
    type_is_best: float | None = None
    models: dict[str, dict[str, float]] = field(default_factory=dict)

    def model(self, name: str) -> dict[str, float]:
        """The figures of model ``name`` (empty when it ranked nothing)."""
        return self.models.get(name, {})

    def to_dict(self) -> dict[str, Any]:
        head: dict[str, Any] = {} if self.n_eligible is None else {
            "n_eligible": self.n_eligible}
        head["n_sampled"] = self.n_sampled
        if self.type_is_best is not None:
            head["type_is_best"] = self.type_is_best
        return head | {k: dict(v) for k, v in self.models.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TypeRanking:
        plain = ("n_eligible", "n_sampled", "type_is_best")
        return cls(n_sampled=data["n_sampled"], n_eligible=data.get("n_eligible"),
                   type_is_best=data.get("type_is_best"),
                   models={k: dict(v) for k, v in data.items() if k not in plain})


@dataclass(frozen=True)
class HeldOutType(Record):
    """One type held out: its attempts of the day scored by the model that saw it and by the
    one that did not (accuracy blocks, absent without attempts), and the ranking check
    (simulated stores)."""

    OMIT_NONE = frozenset({"seen", "held_out", "drop_points", "ranking"})

    n: int
    training_attempts_left_out: int
    seen: dict[str, float] | None = None
    held_out: dict[str, float] | None = None
    drop_points: float | None = None
    ranking: TypeRanking | None = None


@dataclass(frozen=True)
class CurveNight(Record):
    """The newest type on one night: its accuracy (when it ran that day) beside the fleet's."""

    OMIT_NONE = frozenset({"accuracy", "gap_points"})

    day: str
    days_of_history: int
    n: int
    fleet_accuracy: float
    accuracy: float | None = None
    gap_points: float | None = None


@dataclass(frozen=True)
class NewestTypeCurve(Record):
    """:func:`newest_type_curve`: the newest type night by night (``hardware`` None, with a
    ``note``, when every type is in the store from its first day)."""

    hardware: str | None
    nights: list[CurveNight]
    first_day: str | None = None
    days_to_fleet_accuracy: int | None = None
    definition: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        nights = [n.to_dict() for n in self.nights]
        if self.hardware is None:
            return {"hardware": None, "nights": nights, "note": self.note}
        return {"hardware": self.hardware, "first_day": self.first_day, "nights": nights,
                "days_to_fleet_accuracy": self.days_to_fleet_accuracy,
                "definition": self.definition}


@dataclass(frozen=True)
class NewHardwareResult(Record):
    """:func:`new_hardware_study`: each held-out type, the newest type's curve, timings."""

    OMIT_NONE = frozenset({"curve"})

    day: str
    window_days: int
    seed: int
    sample: int
    simulated: bool
    overall_seen: dict[str, float]
    types: dict[str, HeldOutType]
    curve: NewestTypeCurve | None = None
    timings: dict[str, float] = field(default_factory=dict)
    train_config: TrainSettings = field(default_factory=dict)
    definitions: dict[str, str] = field(default_factory=dict)


def check_hardware(names: Sequence[str], catalog: Catalog) -> list[str]:
    """``names`` as catalog types (order kept, duplicates dropped), or a CatalogError.

    Examples
    --------
    >>> check_hardware(["B200", "B200", "MI300X"], Catalog.default())
    ['B200', 'MI300X']
    """
    out: list[str] = []
    for name in names:
        if name not in catalog.names:
            raise CatalogError(f"unknown hardware '{name}'{did_you_mean(name, catalog.names)}; "
                               "name a type of the catalog (`leap stats` lists those in use)")
        if name not in out:
            out.append(name)
    if not out:
        raise ParamError("{hardware} names no type; pass at least one")
    return out


def newest_type(store: Store) -> tuple[str, datetime] | None:
    """The type whose first attempt is the latest in ``store``, and that first day."""
    table = store.attempts(columns=["hardware", "submitted_at"]).to_pandas()
    if not len(table):
        return None
    first = pd.to_datetime(table["submitted_at"], utc=True).groupby(table["hardware"]).min()
    start = first.min()
    first = first[first > start.normalize() + pd.Timedelta(days=1)]
    if not len(first):
        return None
    name = str(first.sort_values(kind="stable").index[-1])
    return name, day_start(first[name].to_pydatetime())


# Ranking on jobs that could run on one type -------------------------------------------------
def rank_on_type(models: dict[str, WindowModel], fleet: Fleet, jobs: pd.DataFrame,
                 hardware: str, costs: Catalog, *, sample: int, seed: int) -> TypeRanking:
    """Ranking quality of each model on sampled ``jobs`` whose eligible types include
    ``hardware`` (and at least one other), against the oracle's true values.

    Returns per model the :func:`~leap.eval.rank_quality.summarize_quality` figures plus
    ``picks_type`` (share of lists whose first type is ``hardware``), and the same for the
    simple rule "cheapest type per device-hour" under :data:`CHEAPEST`, on the jobs the
    first model ranked; ``type_is_best`` is the share of jobs whose best true value is on
    ``hardware``.
    """
    from leap.eval.ranking import (
        eligible_names,
        leap_rankings,
        oracle_order,
        policy_values,
        true_throughputs,
        true_values,
    )
    from leap.rank.ranker import Ranker

    jobs = jobs.reset_index(drop=True)
    if not len(jobs):
        return TypeRanking(n_sampled=0)
    known = [n for n in fleet.hardware_names if n in costs]
    cands = eligible_names(fleet, jobs, known)
    pool = np.flatnonzero([hardware in c and len(c) >= 2 for c in cands])
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(pool, min(sample, len(pool)), replace=False)) if len(pool) \
        else pool
    picked = jobs.iloc[pick].reset_index(drop=True)
    cand = [cands[i] for i in pick]
    if not len(picked):
        return TypeRanking(n_sampled=0, n_eligible=len(pool))
    truth = true_throughputs(fleet, picked, cand)
    values = true_values(fleet, picked, cand, costs)
    rankers = {k: Ranker(m.artifact, costs=costs) for k, m in models.items()}
    first = next(iter(rankers.values()))
    vals = policy_values(first, picked, truth, values)
    hours = device_hours(picked)
    type_is_best = float(np.mean([bool(v) and oracle_order(v)[0] == hardware for v in vals]))

    def quality(orders: list[list[str]], ranked: np.ndarray) -> dict[str, float]:
        per_job = [order_quality(orders[i], vals[i]) for i in np.flatnonzero(ranked)]
        block = summarize_quality(per_job, hours[ranked])
        block["coverage"] = float(ranked.mean())
        block["picks_type"] = float(np.mean([orders[i][0] == hardware
                                             for i in np.flatnonzero(ranked)])) \
            if ranked.any() else math.nan
        return block

    orders = {key: [[r.hardware for r in res.ranking]
                    for res in leap_rankings(ranker, picked, cand)]
              for key, ranker in rankers.items()}
    ranked = {key: np.array([len(o) > 0 for o in lists]) for key, lists in orders.items()}
    blocks = {key: quality(orders[key], ranked[key]) for key in orders}
    # The rule on the jobs the first model ranked: the same rows as that model's figures.
    blocks[CHEAPEST] = quality([cheapest_order(c, costs) for c in cand],
                               next(iter(ranked.values())))
    return TypeRanking(n_sampled=len(picked), n_eligible=len(pool), type_is_best=type_is_best,
                       models=blocks)


# The study ----------------------------------------------------------------------------------
def _type_jobs(model: WindowModel, hardware: str) -> pd.DataFrame:
    jobs = model.eval_jobs
    return jobs[(jobs["hardware"] == hardware).to_numpy()].reset_index(drop=True)


def held_out_type(attempts: pd.DataFrame, catalog: Catalog, day: datetime, cfg: TrainConfig,
                  hardware: str) -> WindowModel:
    """A model trained on ``attempts`` before ``day`` without any attempt on ``hardware``."""
    drop = (attempts["submitted_at"] < day) & (attempts["hardware"] == hardware)
    return train_window(attempts[~drop].reset_index(drop=True), catalog, day, cfg)


def new_hardware_study(store: Store, catalog: Catalog, cfg: TrainConfig | None = None, *,
                       hardware: Sequence[str] = ("B200", "MI300X", "Gaudi3"),
                       as_of: datetime | None = None, sample: int = 500, seed: int = 0,
                       curve_days: Sequence[int] | None = DEFAULT_CURVE_DAYS,
                       costs: Catalog | None = None,
                       progress: Progress | None = None) -> NewHardwareResult:
    """Accuracy and ranking regret on types held out of training, and the newest type's curve.

    Parameters
    ----------
    store : Store
    catalog : Catalog
        Training catalog.
    cfg : TrainConfig, optional
        Training settings of every model (default :class:`TrainConfig`).
    hardware : sequence of str
        Types held out, one retraining each.
    as_of : datetime, optional
        The held-out day (default: the last full day in the store).
    sample : int
        Jobs of the day ranked per type (simulated stores only).
    seed : int
        Seed of the job sample.
    curve_days : sequence of int, optional
        Days of history of the newest type at which it is scored (one retraining each);
        None or empty skips the curve.
    costs : Catalog, optional
        Prices for ranking (default ``catalog``).
    progress : callable, optional
        Called with a short stage name before each step.

    Returns
    -------
    NewHardwareResult
        ``types``: per type ``n`` (its succeeded attempts of the day), ``seen`` and
        ``held_out`` accuracy blocks, ``drop_points`` and ``ranking`` (simulated stores);
        ``curve``: the newest type, its first day and per night its accuracy beside the
        fleet's; ``timings``.
    """
    from leap.eval.backtest import last_full_day

    if sample < 1:
        raise ParamError(f"{{sample}} must be >= 1, got {sample}")
    cfg = cfg or TrainConfig()
    costs = costs or catalog
    names = check_hardware(hardware, catalog)
    say = progress or (lambda _stage: None)
    day = day_start(as_of) if as_of is not None else last_full_day(store)
    t0 = time.perf_counter()
    attempts = window_attempts(store, day, cfg)
    if not len(attempts):
        raise ConfigError(f"no attempts in the window before {day:%Y-%m-%d}")
    fleet = oracle_fleet(store)
    say("training on every type")
    seen = train_window(attempts, catalog, day, cfg)
    day_rows = attempts[attempts["submitted_at"] >= day].reset_index(drop=True)
    timings = {"train_seen_s": time.perf_counter() - t0}
    types: dict[str, HeldOutType] = {}
    for name in names:
        say(f"training without {name}")
        t1 = time.perf_counter()
        held = held_out_type(attempts, catalog, day, cfg, name)
        jobs = _type_jobs(seen, name)
        window = attempts[(attempts["submitted_at"] < day)]
        seen_block: dict[str, float] | None = None
        held_block: dict[str, float] | None = None
        drop: float | None = None
        if len(jobs):
            seen_block = score_model(seen, jobs)
            held_block = score_model(held, jobs)
            drop = 100 * (seen_block["accuracy"] - held_block["accuracy"])
        ranking: TypeRanking | None = None
        if fleet is not None:
            say(f"ranking jobs that could run on {name}")
            ranking = rank_on_type({"seen": seen, "held_out": held}, fleet, day_rows, name,
                                   costs, sample=sample, seed=seed)
        timings[f"{name}_s"] = time.perf_counter() - t1
        types[name] = HeldOutType(
            n=len(jobs), training_attempts_left_out=int((window["hardware"] == name).sum()),
            seen=seen_block, held_out=held_block, drop_points=drop, ranking=ranking)
    overall = score_block(np.exp(seen.eval_pred_log), seen.eval_jobs)
    curve: NewestTypeCurve | None = None
    if curve_days:
        t2 = time.perf_counter()
        curve = newest_type_curve(store, catalog, cfg, until=day, days_of_history=curve_days,
                                  progress=say)
        timings["curve_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    definitions = {
        "held_out": "trained without any attempt on the type (window and lookback); the "
                    "catalog still knows its specs, so leap predicts it from specs and the "
                    "transfer from other types",
        "ranking": "sampled jobs of the day whose eligible types (oracle) include the type "
                   "and one other; regret = 1 - true value of the pick / best true value",
        "curve": "the newest type's attempts of each night, scored by the model trained on "
                 "the window before that night, beside the fleet's accuracy that night",
    }
    return NewHardwareResult(
        day=day.date().isoformat(), window_days=cfg.window_days, seed=seed, sample=sample,
        simulated=fleet is not None, overall_seen=overall, types=types, curve=curve,
        timings=timings,
        train_config={"window_days": cfg.window_days, "model_kind": cfg.model_kind,
                      "n_specialists": cfg.n_specialists, "pair_model": cfg.pair_model},
        definitions=definitions)


def newest_type_curve(store: Store, catalog: Catalog, cfg: TrainConfig, *, until: datetime,
                      days_of_history: Sequence[int] = DEFAULT_CURVE_DAYS,
                      progress: Progress | None = None) -> NewestTypeCurve:
    """Accuracy on the newest type per night since its first day, beside the fleet's.

    Night ``k`` (``k`` in ``days_of_history``, at most ``until``) is the type's first day
    plus ``k``: its model has ``k`` days of the type's history.
    """
    say = progress or (lambda _stage: None)
    found = newest_type(store)
    if found is None:
        return NewestTypeCurve(
            hardware=None, nights=[],
            note="every type is in the store from its first day: no newest type")
    name, first = found
    nights: list[CurveNight] = []
    for k in sorted({int(k) for k in days_of_history if k >= 0}):
        night = first + k * _DAY
        if night > until:
            break
        say(f"newest type {name}: night {night:%Y-%m-%d} ({k} days of history)")
        attempts = window_attempts(store, night, cfg)
        model = train_window(attempts, catalog, night, cfg)
        jobs = _type_jobs(model, name)
        held = model.metrics.held_out
        fleet_acc = held.accuracy if held is not None else math.nan
        accuracy: float | None = None
        gap: float | None = None
        if len(jobs):
            accuracy = score_block(model.artifact.predict(jobs), jobs)["accuracy"]
            gap = 100 * (fleet_acc - accuracy)
        nights.append(CurveNight(day=night.date().isoformat(), days_of_history=k, n=len(jobs),
                                 fleet_accuracy=fleet_acc, accuracy=accuracy, gap_points=gap))
    reached = [n.days_of_history for n in nights
               if n.accuracy is not None and n.fleet_accuracy - n.accuracy <= 0.02]
    return NewestTypeCurve(
        hardware=name, first_day=first.date().isoformat(), nights=nights,
        days_to_fleet_accuracy=reached[0] if reached else None,
        definition="days_to_fleet_accuracy: the first scored night whose accuracy on the "
                   "type is within 2 points of the fleet's")
