"""Trial jobs: which families to run on a new (or little-used) type so rankings improve most
per trial dollar.

**The choice** (:func:`plan_trials`): for each family of the window, on its usual shape,
leap's model predicts the value (samples per unit cost) on the new type ``H`` with an 80%
interval, and on the types the family ran on. Write ``X = log(true value on H / best
predicted value elsewhere)``, taken as normal with mean ``mu`` (the prediction) and standard
deviation ``sigma`` (the interval's width / 2.563). Ranking by the mean loses, in expected
log value, ``sigma * pdf(mu / sigma) - |mu| * cdf(-|mu| / sigma)`` (the expected loss of a
decision under a normal belief). A trial measures the family on ``H``, so it removes that
loss (its expected value of perfect information) over the family's future spend, taken as
its spend in the window. The score is

    benefit = window spend ($) x expected loss removed,  cost = devices x hours x $/device-hour

and trials are chosen greedily by ``benefit / cost``. A family whose type is already covered
by a chosen trial counts ``type_discount`` times (0.5) per chosen sibling: after one trial the
model type x hardware history exists and transfers to its siblings, so coverage of model types
is rewarded. The plan for ``N`` trials is the first ``N`` of the plan for more.

**The check** of the choice in the simulator: :mod:`leap.eval.trials_check`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.data.usage import device_hours, job_devices
from leap.errors import ConfigError, ParamError
from leap.eval.new_hardware import check_hardware
from leap.records import Record

if TYPE_CHECKING:
    from leap.model.artifact import Artifact

#: z of the 90th percentile: an 80% interval spans 2 x 1.2816 standard deviations.
_Z80 = 1.2815515655446004
#: The spread assumed where the model has no calibrated interval (log scale).
_FALLBACK_SIGMA = 0.5
#: Shape columns of a trial (a family's usual configuration).
SHAPE_COLUMNS: tuple[str, ...] = ("trainer_count", "batch_size", "devices_per_trainer",
                                  "precision", "tensor_parallel", "pipeline_parallel")
#: Columns of a plan, in order (CSV and JSON).
PLAN_COLUMNS: tuple[str, ...] = (
    "rank", "family_id", "model_type", *SHAPE_COLUMNS, "devices", "hardware",
    "predicted_samples_per_s", "throughput_p10", "throughput_p90", "best_other_type",
    "value_ratio", "interval_ratio", "window_spend", "expected_loss", "benefit",
    "estimated_hours", "estimated_cost", "score", "why")
Progress = Callable[[str], None]


def expected_loss(mu: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Expected loss (log value) of ranking by the mean when ``X ~ N(mu, sigma)``.

    Examples
    --------
    >>> [round(float(x), 4) for x in expected_loss(np.array([0.0, 1.0]), np.array([0.3, 0.1]))]
    [0.1197, 0.0]
    """
    from scipy.stats import norm

    a = np.abs(mu)
    s = np.maximum(sigma, 1e-9)
    # Clipped: for |mu| >> sigma the two terms cancel to rounding error.
    return np.maximum(s * norm.pdf(a / s) - a * norm.cdf(-a / s), 0.0)


def _usual_shapes(history: pd.DataFrame) -> pd.DataFrame:
    """One row per family: its latest attempt among those with its most common shape.

    Examples
    --------
    >>> h = pd.DataFrame({"family_id": ["f", "f", "f"], "trainer_count": [1, 2, 2],
    ...                   "batch_size": [8, 8, 8], "submitted_at": [1, 2, 3]})
    >>> _usual_shapes(h)[["trainer_count", "submitted_at"]].values.tolist()
    [[2, 3]]
    """
    h = history.copy()
    for c in SHAPE_COLUMNS:
        if c not in h.columns:
            h[c] = np.nan
    keys = ["family_id", *SHAPE_COLUMNS]
    counts = h.groupby(keys, dropna=False, sort=True).size().rename("_n").reset_index()
    counts = counts.sort_values(["family_id", "_n"], ascending=[True, False],
                                kind="stable").drop_duplicates("family_id")
    h = h.merge(counts[keys], on=keys)
    h = h.sort_values(["family_id", "submitted_at"], kind="stable").drop_duplicates(
        "family_id", keep="last")
    return h.reset_index(drop=True)


def _fits(jobs: pd.DataFrame, catalog: Catalog, hardware: str) -> np.ndarray:
    """The planner's eligibility (no oracle): a trainer fits a host and memory estimate <= 1."""
    from leap.features.physics import estimates

    dpt = jobs["devices_per_trainer"].fillna(1).to_numpy(dtype=np.float64)
    ok = dpt <= catalog[hardware].devices_per_host
    mem = estimates(jobs.assign(hardware=hardware), catalog)["mem_fit"]
    return ok & ~(np.isfinite(mem) & (mem > 1.0))


@dataclass(frozen=True)
class PlanRow(Record):
    """One chosen trial: a row of :data:`PLAN_COLUMNS` (None where a figure is missing)."""

    rank: int
    family_id: str
    model_type: str
    trainer_count: int | None
    batch_size: int | None
    devices_per_trainer: int | None
    precision: str | None
    tensor_parallel: int | None
    pipeline_parallel: int | None
    devices: int
    hardware: str
    predicted_samples_per_s: float | None
    throughput_p10: float | None
    throughput_p90: float | None
    best_other_type: str | None
    value_ratio: float | None
    interval_ratio: float | None
    window_spend: float | None
    expected_loss: float | None
    benefit: float | None
    estimated_hours: float
    estimated_cost: float | None
    score: float | None
    why: str


@dataclass(frozen=True)
class PlanSummary(Record):
    """:meth:`TrialPlan.to_dict` read back: the settings, the totals and the chosen rows."""

    hardware: str
    budget: int
    trial_hours: float
    type_discount: float
    model_as_of: str
    choice: str
    planned: int
    candidates: int
    total_cost: float
    total_benefit: float
    trials: list[PlanRow] = field(default_factory=list)


@dataclass(frozen=True)
class TrialPlan:
    """The chosen trials (rows of :data:`PLAN_COLUMNS`) and the pool they were chosen from.

    ``candidates`` holds every eligible family with its score before discounts (the pool a
    random plan draws from); ``rows`` the chosen ones in order.
    """

    hardware: str
    budget: int
    rows: pd.DataFrame
    candidates: pd.DataFrame
    settings: dict[str, float | str]

    def summary(self) -> PlanSummary:
        """The plan as a record (its JSON is :meth:`to_dict`)."""
        return PlanSummary.from_dict(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able plan: settings, totals and the rows."""
        rows = self.rows[list(PLAN_COLUMNS)]
        return {"hardware": self.hardware, "budget": self.budget, **self.settings,
                "planned": len(rows), "candidates": len(self.candidates),
                "total_cost": float(rows["estimated_cost"].sum()),
                "total_benefit": float(rows["benefit"].sum()),
                "trials": [{k: _plain(v) for k, v in r.items()}
                           for r in rows.to_dict("records")]}


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def trial_candidates(artifact: Artifact, history: pd.DataFrame, hardware: str, *,
                     costs: Catalog, trial_hours: float = 0.5) -> pd.DataFrame:
    """Every family of ``history`` that fits ``hardware``, scored for a trial on it.

    Columns: the family's usual shape, the prediction on ``hardware`` and its interval, the
    best other type the family ran on and the value ratio, the window spend, the expected loss
    a trial removes, its benefit, cost and ``score`` (benefit / cost).
    """
    from leap.data.usage import usable_mask

    if trial_hours <= 0:
        raise ParamError(f"{{trial_hours}} must be > 0, got {trial_hours}")
    hist = history[usable_mask(history)] if len(history) else history
    if not len(hist):
        raise ConfigError("no attempts in the history to plan trials from; ingest or simulate "
                          "attempts and train first")
    spend_by_type = hist.assign(
        _dh=device_hours(hist),
        _cost=hist["hardware"].map(lambda n: costs[n].cost_per_device_hour if n in costs
                                   else np.nan))
    spend_by_type["_spend"] = spend_by_type["_dh"] * spend_by_type["_cost"]
    spend = spend_by_type.groupby("family_id")["_spend"].sum()
    used = hist.groupby("family_id")["hardware"].agg(lambda s: sorted(set(s) - {hardware}))
    jobs = _usual_shapes(hist)
    jobs = jobs[_fits(jobs, costs, hardware)].reset_index(drop=True)
    if not len(jobs):
        return jobs
    on_h = artifact.predict_interval(jobs.assign(hardware=hardware))
    devices = job_devices(jobs)
    price_h = costs[hardware].cost_per_device_hour
    log_value_h = on_h.log - np.log(devices * price_h)
    # The best predicted value among the types the family ran on (the alternative it has).
    alt = [[n for n in used.get(f, []) if n in costs and n in artifact.catalog]
           for f in jobs["family_id"]]
    rows = np.repeat(np.arange(len(jobs)), [len(a) for a in alt])
    flat = [n for a in alt for n in a]
    best_name = np.full(len(jobs), None, dtype=object)
    best_log_value = np.full(len(jobs), np.nan)
    if flat:
        other = jobs.iloc[rows].reset_index(drop=True).assign(hardware=flat)
        lv = artifact.predict_log(other) - np.log(devices[rows] * np.array(
            [costs[n].cost_per_device_hour for n in flat]))
        for r, n, v in zip(rows, flat, lv, strict=True):
            if not np.isfinite(best_log_value[r]) or v > best_log_value[r]:
                best_log_value[r], best_name[r] = v, n
    sigma = (on_h.hi - on_h.lo) / (2 * _Z80)
    sigma = np.where(np.isfinite(sigma) & (sigma > 0), sigma, _FALLBACK_SIGMA)
    # No alternative known: the type's value alone is uncertain, the whole spread is at stake.
    mu = np.where(np.isfinite(best_log_value), log_value_h - best_log_value, 0.0)
    loss = expected_loss(mu, sigma)
    window_spend = jobs["family_id"].map(spend).fillna(0.0).to_numpy(dtype=np.float64)
    cost = devices * trial_hours * price_h
    out = jobs[["family_id", "model_type", *SHAPE_COLUMNS]].copy()
    for c in [c for c in history.columns if c not in out.columns and c not in (
            "attempt_id", "status", "throughput", "hardware", "submitted_at",
            "duration_hours", "family_id", "model_type")]:
        out[c] = jobs[c].to_numpy()
    out["devices"] = devices.astype(np.int64)
    out["hardware"] = hardware
    out["predicted_samples_per_s"] = np.exp(on_h.log)
    out["throughput_p10"] = np.exp(on_h.lo)
    out["throughput_p90"] = np.exp(on_h.hi)
    out["best_other_type"] = best_name
    out["value_ratio"] = np.exp(mu)
    out["interval_ratio"] = np.exp(2 * _Z80 * sigma)
    out["window_spend"] = window_spend
    out["expected_loss"] = loss
    out["benefit"] = window_spend * loss
    out["estimated_hours"] = float(trial_hours)
    out["estimated_cost"] = cost
    out["score"] = out["benefit"] / cost
    return out.sort_values(["score", "family_id"], ascending=[False, True],
                           kind="stable").reset_index(drop=True)


def choose(candidates: pd.DataFrame, budget: int, *, type_discount: float = 0.5
           ) -> pd.DataFrame:
    """Greedy choice of ``budget`` rows by score, each chosen row discounting its model
    type's other rows by ``type_discount``.

    Examples
    --------
    >>> c = pd.DataFrame({"family_id": list("abc"), "model_type": ["x", "x", "y"],
    ...                   "score": [10.0, 9.0, 6.0]})
    >>> list(choose(c, 2)["family_id"])
    ['a', 'c']
    """
    if budget < 1:
        raise ParamError(f"{{budget}} must be >= 1, got {budget}")
    if not 0 <= type_discount <= 1:
        raise ParamError(f"{{type_discount}} must be within [0, 1], got {type_discount}")
    score = candidates["score"].to_numpy(dtype=np.float64).copy()
    types = candidates["model_type"].astype(str).to_numpy()
    taken = np.zeros(len(candidates), dtype=bool)
    order: list[int] = []
    effective: list[float] = []
    for _ in range(min(budget, len(candidates))):
        left = np.where(taken, -np.inf, score)
        i = int(np.argmax(left))
        order.append(i)
        effective.append(float(score[i]))
        taken[i] = True
        score = np.where(types == types[i], score * type_discount, score)
    out = candidates.iloc[order].reset_index(drop=True)
    out.insert(0, "rank", np.arange(1, len(out) + 1))
    out["score"] = effective
    return out


def _why(row: pd.Series, sibling: int) -> str:
    alt = row["best_other_type"]
    vs = (f"predicted value {row['value_ratio']:.2f}x its best type so far ({alt})"
          if isinstance(alt, str) else "no other type to compare with")
    extra = f"; {sibling} earlier trial(s) of its model type" if sibling else \
        "; first trial of its model type"
    return (f"${row['window_spend']:,.0f} spent in the window; {vs}; 80% interval spans "
            f"{row['interval_ratio']:.1f}x; expected ranking loss removed "
            f"{100 * row['expected_loss']:.1f}% of its value{extra}")


def plan_trials(artifact: Artifact, history: pd.DataFrame, hardware: str, budget: int, *,
                costs: Catalog | None = None, trial_hours: float = 0.5,
                type_discount: float = 0.5) -> TrialPlan:
    """The ``budget`` trials on ``hardware`` that remove most expected ranking loss per dollar.

    Parameters
    ----------
    artifact : Artifact
        The model (published or in memory) whose predictions and intervals are used.
    history : pandas.DataFrame
        Attempts of the window (the families that run, their shapes and spend).
    hardware : str
        The new or little-used type.
    budget : int
        Number of trials (>= 1).
    costs : Catalog, optional
        Prices (default the artifact's catalog).
    trial_hours : float
        Length of each trial (a throughput measurement needs minutes of steady state).
    type_discount : float
        Factor on a family's score per chosen trial of its model type.

    Returns
    -------
    TrialPlan
    """
    costs = costs or artifact.catalog
    (hardware,) = check_hardware([hardware], costs)
    if budget < 1:
        raise ParamError(f"{{budget}} must be >= 1, got {budget}")
    cands = trial_candidates(artifact, history, hardware, costs=costs, trial_hours=trial_hours)
    rows = choose(cands, budget, type_discount=type_discount) if len(cands) else \
        cands.assign(rank=np.empty(0, dtype=np.int64))
    seen: dict[str, int] = {}
    why = []
    for _, r in rows.iterrows():
        t = str(r["model_type"])
        why.append(_why(r, seen.get(t, 0)))
        seen[t] = seen.get(t, 0) + 1
    rows = rows.assign(why=why)
    settings: dict[str, float | str] = {"trial_hours": trial_hours, "type_discount": type_discount,
                "model_as_of": str(artifact.manifest.get("as_of")),
                "choice": "greedy by window spend x expected ranking loss removed / trial "
                          "cost; a model type's families discounted per chosen sibling"}
    return TrialPlan(hardware, budget, rows, cands, settings)


def random_choice(candidates: pd.DataFrame, n: int, target_cost: float,
                  rng: np.random.Generator, *, draws: int = 50) -> pd.DataFrame:
    """``n`` random candidates whose total cost is the closest to ``target_cost`` among
    ``draws`` random draws (random trials of the same number and about the same cost)."""
    n = min(n, len(candidates))
    cost = candidates["estimated_cost"].to_numpy(dtype=np.float64)
    best, gap = None, math.inf
    for _ in range(draws):
        idx = rng.choice(len(candidates), n, replace=False)
        g = abs(float(cost[idx].sum()) - target_cost)
        if g < gap:
            best, gap = idx, g
    assert best is not None
    return candidates.iloc[np.sort(best)].reset_index(drop=True)
