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
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.usage import device_hours
from leap.errors import CatalogError, ConfigError, ParamError, did_you_mean
from leap.eval.new_families import score_block
from leap.eval.oracle import oracle_fleet
from leap.eval.rank_quality import order_quality, summarize_quality
from leap.model.train import WindowModel, train_window
from leap.model.window import TrainConfig, day_start, window_attempts

if TYPE_CHECKING:
    from leap.data.store import Store
    from leap.sim.fleet import Fleet

_DAY = timedelta(days=1)
#: Days of history at which the newest type's curve is scored (capped by the store).
DEFAULT_CURVE_DAYS: tuple[int, ...] = (0, 1, 2, 3, 5, 7, 10, 14, 20)
Progress = Callable[[str], None]


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
                 hardware: str, costs: Catalog, *, sample: int, seed: int) -> dict[str, Any]:
    """Ranking quality of each model on sampled ``jobs`` whose eligible types include
    ``hardware`` (and at least one other), against the oracle's true values.

    Returns per model the :func:`~leap.eval.rank_quality.summarize_quality` figures plus
    ``picks_type`` (share of lists whose first type is ``hardware``); ``type_is_best`` is the
    share of jobs whose best true value is on ``hardware``.
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
        return {"n_sampled": 0}
    known = [n for n in fleet.hardware_names if n in costs]
    cands = eligible_names(fleet, jobs, known)
    pool = np.flatnonzero([hardware in c and len(c) >= 2 for c in cands])
    rng = np.random.default_rng(seed)
    pick = np.sort(rng.choice(pool, min(sample, len(pool)), replace=False)) if len(pool) \
        else pool
    picked = jobs.iloc[pick].reset_index(drop=True)
    cand = [cands[i] for i in pick]
    out: dict[str, Any] = {"n_eligible": len(pool), "n_sampled": len(picked)}
    if not len(picked):
        return out
    truth = true_throughputs(fleet, picked, cand)
    values = true_values(fleet, picked, cand, costs)
    rankers = {k: Ranker(m.artifact, costs=costs) for k, m in models.items()}
    first = next(iter(rankers.values()))
    vals = policy_values(first, picked, truth, values)
    hours = device_hours(picked)
    out["type_is_best"] = float(np.mean([bool(v) and oracle_order(v)[0] == hardware
                                         for v in vals]))
    for key, ranker in rankers.items():
        orders = [[r.hardware for r in res.ranking]
                  for res in leap_rankings(ranker, picked, cand)]
        ranked = np.array([len(o) > 0 for o in orders])
        per_job = [order_quality(orders[i], vals[i]) for i in np.flatnonzero(ranked)]
        block = summarize_quality(per_job, hours[ranked])
        block["coverage"] = float(ranked.mean())
        block["picks_type"] = float(np.mean([o[0] == hardware for o in orders if o])) \
            if ranked.any() else math.nan
        out[key] = block
    return out


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
                       progress: Progress | None = None) -> dict[str, Any]:
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
    dict
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
    types: dict[str, Any] = {}
    for name in names:
        say(f"training without {name}")
        t1 = time.perf_counter()
        held = held_out_type(attempts, catalog, day, cfg, name)
        jobs = _type_jobs(seen, name)
        window = attempts[(attempts["submitted_at"] < day)]
        block: dict[str, Any] = {"n": len(jobs),
                                 "training_attempts_left_out": int(
                                     (window["hardware"] == name).sum())}
        if len(jobs):
            block["seen"] = score_block(seen.artifact.predict(jobs), jobs)
            block["held_out"] = score_block(held.artifact.predict(jobs), jobs)
            block["drop_points"] = 100 * (block["seen"]["accuracy"]
                                          - block["held_out"]["accuracy"])
        if fleet is not None:
            say(f"ranking jobs that could run on {name}")
            block["ranking"] = rank_on_type({"seen": seen, "held_out": held}, fleet, day_rows,
                                            name, costs, sample=sample, seed=seed)
        timings[f"{name}_s"] = time.perf_counter() - t1
        types[name] = block
    result: dict[str, Any] = {
        "day": day.date().isoformat(), "window_days": cfg.window_days, "seed": seed,
        "sample": sample, "simulated": fleet is not None,
        "overall_seen": score_block(np.exp(seen.eval_pred_log), seen.eval_jobs),
        "types": types,
    }
    if curve_days:
        t2 = time.perf_counter()
        result["curve"] = newest_type_curve(store, catalog, cfg, until=day,
                                            days_of_history=curve_days, progress=say)
        timings["curve_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    result["timings"] = timings
    result["train_config"] = {"window_days": cfg.window_days, "model_kind": cfg.model_kind,
                              "n_specialists": cfg.n_specialists, "pair_model": cfg.pair_model}
    result["definitions"] = {
        "held_out": "trained without any attempt on the type (window and lookback); the "
                    "catalog still knows its specs, so leap predicts it from specs and the "
                    "transfer from other types",
        "ranking": "sampled jobs of the day whose eligible types (oracle) include the type "
                   "and one other; regret = 1 - true value of the pick / best true value",
        "curve": "the newest type's attempts of each night, scored by the model trained on "
                 "the window before that night, beside the fleet's accuracy that night",
    }
    return result


def newest_type_curve(store: Store, catalog: Catalog, cfg: TrainConfig, *, until: datetime,
                      days_of_history: Sequence[int] = DEFAULT_CURVE_DAYS,
                      progress: Progress | None = None) -> dict[str, Any]:
    """Accuracy on the newest type per night since its first day, beside the fleet's.

    Night ``k`` (``k`` in ``days_of_history``, at most ``until``) is the type's first day
    plus ``k``: its model has ``k`` days of the type's history.
    """
    say = progress or (lambda _stage: None)
    found = newest_type(store)
    if found is None:
        return {"hardware": None, "nights": [],
                "note": "every type is in the store from its first day: no newest type"}
    name, first = found
    nights: list[dict[str, Any]] = []
    for k in sorted({int(k) for k in days_of_history if k >= 0}):
        night = first + k * _DAY
        if night > until:
            break
        say(f"newest type {name}: night {night:%Y-%m-%d} ({k} days of history)")
        attempts = window_attempts(store, night, cfg)
        model = train_window(attempts, catalog, night, cfg)
        jobs = _type_jobs(model, name)
        fleet_acc = model.metrics.get("held_out", {}).get("accuracy", math.nan)
        row: dict[str, Any] = {"day": night.date().isoformat(), "days_of_history": k,
                               "n": len(jobs), "fleet_accuracy": fleet_acc}
        if len(jobs):
            row["accuracy"] = score_block(model.artifact.predict(jobs), jobs)["accuracy"]
            row["gap_points"] = 100 * (fleet_acc - row["accuracy"])
        nights.append(row)
    reached = [n["days_of_history"] for n in nights
               if "accuracy" in n and n["fleet_accuracy"] - n["accuracy"] <= 0.02]
    return {"hardware": name, "first_day": first.date().isoformat(), "nights": nights,
            "days_to_fleet_accuracy": reached[0] if reached else None,
            "definition": "days_to_fleet_accuracy: the first scored night whose accuracy on "
                          "the type is within 2 points of the fleet's"}
