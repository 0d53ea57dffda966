"""The simulator's check of trial planning (:func:`trials_study`): planned trials against
random ones of the same number and about the same cost.

``H`` leaves the training window (a new type) or keeps its few attempts; the planned trials
(:func:`leap.eval.trials.plan_trials`) and random trials of the same number and about the
same cost are "run" by the simulator (:func:`leap.sim.measure.measure_jobs`) on the last day
of the window, added to the history as attempts whose ``attempt_id`` starts with ``trial-``,
and the model is retrained; accuracy on ``H``'s attempts of the held-out day and ranking
regret of jobs that could run on ``H`` are compared for each ``N``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.errors import ParamError
from leap.eval.baselines import CHEAPEST
from leap.eval.new_families import TrainSettings, score_block
from leap.eval.new_hardware import TypeRanking, check_hardware, rank_on_type
from leap.eval.oracle import oracle_fleet
from leap.eval.trials import PlanSummary, Progress, plan_trials, random_choice
from leap.model.train import train_window
from leap.model.window import TrainConfig, day_start, window_attempts
from leap.records import Record

if TYPE_CHECKING:
    from leap.data.store import Store

_DAY = timedelta(days=1)


@dataclass(frozen=True)
class TrialArm(Record):
    """Trials of one choice (planned or random) and the retrained model's figures on the
    type: ``accuracy`` (:func:`~leap.eval.new_families.score_block`, empty without attempts)
    and ``ranking`` (:func:`~leap.eval.new_hardware.rank_on_type`, empty when none ranked).
    The arm without trials has no ``succeeded`` nor ``model_types``."""

    OMIT_NONE = frozenset({"succeeded", "model_types"})

    trials: int
    cost: float
    accuracy: dict[str, float]
    ranking: dict[str, float]
    succeeded: int | None = None
    model_types: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trials": self.trials}
        if self.succeeded is not None:
            out["succeeded"] = self.succeeded
        out["cost"] = self.cost
        if self.model_types is not None:
            out["model_types"] = self.model_types
        return out | {"accuracy": dict(self.accuracy), "ranking": dict(self.ranking)}


@dataclass(frozen=True)
class TrialArms(Record):
    """The planned trials of one number and (above 0) random ones of the same number."""

    OMIT_NONE = frozenset({"random"})

    planned: TrialArm
    random: TrialArm | None = None


@dataclass(frozen=True)
class TrialsResult(Record):
    """:func:`trials_study`: per number of trials (``"0"``, ``"5"`` ...) its arms, the plan
    for the largest number, and ``cheapest``: the cheapest-type rule's ranking figures on the
    same jobs (absent in results saved before it was added)."""

    OMIT_NONE = frozenset({"cheapest"})

    day: str
    hardware: str
    new_type: bool
    budgets: list[int]
    seed: int
    sample: int
    type_attempts_on_day: int
    candidates: int
    arms: dict[str, TrialArms]
    plan: PlanSummary
    wall_s: float
    train_config: TrainSettings
    definitions: dict[str, str]
    cheapest: dict[str, float] | None = None


def trials_study(store: Store, catalog: Catalog, cfg: TrainConfig | None = None, *,
                 hardware: str = "B200", budgets: Sequence[int] = (0, 5, 10, 25, 50),
                 as_of: datetime | None = None, new_type: bool = True, sample: int = 500,
                 seed: int = 0, trial_hours: float = 0.5, type_discount: float = 0.5,
                 costs: Catalog | None = None,
                 progress: Progress | None = None) -> TrialsResult:
    """Planned trials against random trials of the same number and cost, in the simulator.

    Parameters
    ----------
    store : Store
        A simulated store (the simulator measures the trials).
    catalog : Catalog
    cfg : TrainConfig, optional
    hardware : str
        The type trials run on.
    budgets : sequence of int
        Numbers of trials compared (0 is the model without trials).
    as_of : datetime, optional
        The held-out day (default: the last full day).
    new_type : bool
        True: ``hardware`` leaves the training history (a new type); False: it keeps its
        attempts (a little-used type).
    sample : int
        Jobs of the day ranked against the oracle per model.
    seed : int
        Seed of the measurements, the random plans and the job sample.
    trial_hours, type_discount : float
        See :func:`plan_trials`.
    costs : Catalog, optional
        Prices (default ``catalog``).
    progress : callable, optional

    Returns
    -------
    TrialsResult
        ``arms``: per budget ``planned`` and ``random`` (cost, trials that succeeded,
        accuracy block on the type's attempts of the day, ranking block); ``plan``: the plan
        for the largest budget.
    """
    from leap.eval.backtest import last_full_day
    from leap.sim.measure import measure_jobs

    budgets = sorted({int(b) for b in budgets})
    if not budgets or budgets[0] < 0:
        raise ParamError(f"{{budgets}} must be numbers >= 0, got {list(budgets)}")
    costs = costs or catalog
    (hardware,) = check_hardware([hardware], catalog)
    fleet = oracle_fleet(store, strict=True)
    if fleet is None:
        raise ParamError("the trials check needs a simulated store (the simulator measures "
                         "the trials); simulate a fleet into a fresh {home}")
    say = progress or (lambda _stage: None)
    day = day_start(as_of) if as_of is not None else last_full_day(store)
    t0 = time.perf_counter()
    cfg = cfg or TrainConfig()
    attempts = window_attempts(store, day, cfg)
    if new_type:
        drop = (attempts["submitted_at"] < day) & (attempts["hardware"] == hardware)
        attempts = attempts[~drop].reset_index(drop=True)
    say("training without trials")
    base = train_window(attempts, catalog, day, cfg)
    window = attempts[(attempts["submitted_at"] >= day - cfg.window_days * _DAY)
                      & (attempts["submitted_at"] < day)]
    top = max(budgets)
    plan = plan_trials(base.artifact, window, hardware, max(top, 1), costs=costs,
                       trial_hours=trial_hours, type_discount=type_discount)
    day_rows = attempts[attempts["submitted_at"] >= day].reset_index(drop=True)
    jobs_h = base.eval_jobs[(base.eval_jobs["hardware"] == hardware).to_numpy()] \
        .reset_index(drop=True)
    at = day - _DAY / 2  # the trials run on the last day of the window

    def score(model: Any) -> tuple[dict[str, float], TypeRanking]:
        accuracy = score_block(model.artifact.predict(jobs_h), jobs_h) if len(jobs_h) else {}
        return accuracy, rank_on_type({"leap": model}, fleet, day_rows, hardware, costs,
                                      sample=sample, seed=seed)

    def run(chosen: pd.DataFrame, tag: str) -> tuple[TrialArm, pd.DataFrame]:
        rng = np.random.default_rng([seed, len(chosen), 0 if tag == "planned" else 1])
        rows = measure_jobs(fleet, chosen, hardware, at, rng, id_prefix=f"trial-{tag}-",
                            duration_hours=trial_hours)
        rows = rows[[c for c in attempts.columns if c in rows.columns]]
        grown = pd.concat([attempts, rows], ignore_index=True).sort_values(
            ["submitted_at", "attempt_id"], kind="stable").reset_index(drop=True)
        model = train_window(grown, catalog, day, cfg)
        accuracy, ranking = score(model)
        arm = TrialArm(trials=len(chosen), succeeded=int((rows["status"] == "succeeded").sum()),
                       cost=float(chosen["estimated_cost"].sum()),
                       model_types=int(chosen["model_type"].nunique()), accuracy=accuracy,
                       ranking=ranking.model("leap"))
        return arm, rows

    # The rule does not depend on the model: the jobs are the same for every arm.
    base_accuracy, base_ranking = score(base)
    arms: dict[str, TrialArms] = {}
    for n in budgets:
        if n == 0:
            arms["0"] = TrialArms(TrialArm(trials=0, cost=0.0, accuracy=base_accuracy,
                                           ranking=base_ranking.model("leap")))
            continue
        chosen = plan.rows.head(n)
        say(f"{n} planned trials: measure, retrain")
        planned, _ = run(chosen, "planned")
        rng = np.random.default_rng([seed, n, 2])
        pick = random_choice(plan.candidates, n, planned.cost, rng)
        say(f"{n} random trials: measure, retrain")
        rand, _ = run(pick, "random")
        arms[str(n)] = TrialArms(planned, rand)
    return TrialsResult(
        day=day.date().isoformat(), hardware=hardware, new_type=new_type,
        budgets=budgets, seed=seed, sample=sample,
        type_attempts_on_day=len(jobs_h), candidates=len(plan.candidates),
        arms=arms, plan=plan.summary(),
        wall_s=time.perf_counter() - t0,
        train_config={"window_days": cfg.window_days, "model_kind": cfg.model_kind,
                      "n_specialists": cfg.n_specialists, "pair_model": cfg.pair_model},
        definitions={
            "planned": "the first N trials of the plan (see leap.eval.trials)",
            "random": "N random families of the same candidate pool, the draw (of 50) whose "
                      "total cost is closest to the planned trials' cost",
            "accuracy": "share of the type's succeeded attempts of the held-out day within "
                        "±20%, by the model retrained with the trials in its history",
            "ranking": "jobs of the day that could run on the type, ranked against the oracle",
            "cheapest": "the same jobs ranked by the simple rule: cheapest type per "
                        "device-hour first",
        },
        cheapest=base_ranking.model(CHEAPEST),
    )
