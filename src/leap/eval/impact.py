"""Impact study: replay days through the capacity-limited scheduler with and without advice.

Every attempt of the replayed days is placed three times by the simulator's
:class:`~leap.sim.scheduler.CapacityScheduler`, under the same daily device-hour budgets:

``baseline``
    no advice (reproduces the stored placements: checked and reported);
``leap``
    LEAP's preference list of the job's eligible types (first available choice);
``oracle``
    the types ordered by true value (the best any advice could do under capacity).

Then each arm is scored on the attempts that succeeded in history (their run time is known),
with the oracle's true median throughput of the type the arm chose (the replay moves jobs
to types they never ran on). Two cost views:

``fixed_time``
    each attempt runs its recorded ``duration_hours`` wherever it lands:
    cost = devices x hours x cost_per_device_hour, samples = true samples/s x hours x 3600;
``fixed_work``
    each attempt processes the samples it processed in the baseline arm; its hours on the
    arm's type are ``samples / (true samples/s x 3600)``. Total samples are equal across
    arms, so the total costs compare directly (the paper's "fleet cost" view).

An attempt placed on a type its shape does not fit (true throughput NaN, it would run out
of memory) processes nothing: in ``fixed_time`` it costs its hours; in ``fixed_work`` it
costs its hours plus the baseline cost of redoing its work. Counted as ``not_fit``.

Coverage is the share of attempts (and of device-hours, "GPU-hours") with at least one
eligible type that received a non-empty LEAP ranking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.errors import DataError
from leap.eval.baselines import gpu_hours, job_devices
from leap.eval.ranking import eligible_names, leap_rankings, oracle_order, true_values

if TYPE_CHECKING:
    from leap.rank.ranker import Ranker
    from leap.sim.fleet import Fleet
    from leap.sim.scheduler import Placement

ARMS: tuple[str, ...] = ("baseline", "leap", "oracle")
Progress = Callable[[str, int, int], None]


def _share(mask: np.ndarray, weights: np.ndarray | None = None) -> float:
    w = np.ones(len(mask)) if weights is None else weights
    total = float(w.sum())
    return float((w * mask).sum() / total) if total > 0 else math.nan


def arm_costs(fleet: Fleet, jobs: pd.DataFrame, hardware: np.ndarray, costs: Catalog,
              baseline_samples: np.ndarray | None = None,
              baseline_cost: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-attempt true throughput, cost and samples of one arm (see the module docstring).

    Parameters
    ----------
    fleet : Fleet
        The oracle.
    jobs : pandas.DataFrame
        Succeeded attempts (``duration_hours`` is their full run time).
    hardware : numpy.ndarray of str
        The type the arm placed each attempt on.
    costs : Catalog
        Prices.
    baseline_samples, baseline_cost : numpy.ndarray, optional
        The baseline arm's samples and fixed-time cost per attempt (for ``fixed_work``);
        omitted for the baseline arm itself.

    Returns
    -------
    dict of numpy.ndarray
        ``samples_per_s``, ``price`` (per device-hour), ``devices``, ``hours``, ``cost_fixed_time``,
        ``samples_fixed_time``, ``cost_fixed_work``, ``not_fit``.

    Examples
    --------
    >>> # arm_costs(fleet, succeeded, placement.hardware[ok], Catalog.default())
    """
    hours = np.nan_to_num(pd.to_numeric(jobs["duration_hours"], errors="coerce")
                          .astype("float64").to_numpy()) if "duration_hours" in jobs.columns \
        else np.zeros(len(jobs))
    devices = job_devices(jobs)
    at = jobs["submitted_at"].to_numpy()
    tp = fleet.true_throughput(jobs.reset_index(drop=True), np.asarray(hardware, dtype=object),
                               at) if len(jobs) else np.empty(0)
    price = np.array([costs[str(h)].cost_per_device_hour for h in hardware], dtype=np.float64)
    not_fit = ~np.isfinite(tp)
    cost_time = devices * hours * price
    samples = np.where(not_fit, 0.0, np.nan_to_num(tp) * hours * 3600.0)
    if baseline_samples is None:
        baseline_samples = samples
        baseline_cost = cost_time
    assert baseline_cost is not None
    with np.errstate(divide="ignore", invalid="ignore"):
        work_hours = np.where(not_fit, 0.0, baseline_samples / (np.nan_to_num(tp) * 3600.0))
    work_hours = np.where(np.isfinite(work_hours), work_hours, 0.0)
    cost_work = np.where(not_fit, cost_time + baseline_cost, devices * work_hours * price)
    return {"samples_per_s": tp, "price": price, "devices": devices, "hours": hours,
            "cost_fixed_time": cost_time, "samples_fixed_time": samples,
            "cost_fixed_work": cost_work, "not_fit": not_fit}


def impact_study(ranker: Ranker, fleet: Fleet, jobs: pd.DataFrame, costs: Catalog, *,
                 advice_depth: int | None = 3, oracle_arm: bool = True,
                 sweep_depths: Sequence[int | None] = (1, 3, None),
                 progress: Progress | None = None) -> dict[str, Any]:
    """Replay ``jobs`` (whole days of attempts) without advice, with LEAP's, and with the oracle's.

    Parameters
    ----------
    ranker : Ranker
        LEAP's ranker (a model trained before the first replayed day).
    fleet : Fleet
        The simulated fleet of the store (scheduler and oracle).
    jobs : pandas.DataFrame
        Every attempt of the replayed days, all statuses (they compete for capacity).
    costs : Catalog
        Prices (the ranker's cost catalog).
    advice_depth : int or None
        How many of the list's first types the scheduler tries before its usual choices
        (None: the whole list). A full list sends a job that finds its good types full to
        any eligible type, however slow; a short one falls back to the job's home types.
    oracle_arm : bool
        Also replay with the oracle's value order as advice (same depth).
    sweep_depths : sequence of int or None
        Depths also replayed for LEAP and the oracle (``depth_sweep`` in the result).
    progress : callable, optional
        ``progress(stage, done, total)``.

    Returns
    -------
    dict
        ``coverage`` (attempt and GPU-hour shares ranked), per arm the ``top_choice`` shares,
        ``placement`` breakdown, totals in both cost views and their changes against the
        baseline; ``depth_sweep``; ``replay_matches_history``; the definitions.

    Examples
    --------
    >>> # impact_study(Ranker(wm.artifact), Fleet.from_store(store), day_attempts, catalog)
    """
    from leap.sim.scheduler import CapacityScheduler

    if len(jobs) == 0:
        raise DataError("no attempts to replay; pick days the store has (see `leap stats`)")
    for col in ("attempt_id", "submitted_at", "status", "hardware"):
        if col not in jobs.columns:
            raise DataError(f"impact study: the attempts lack column '{col}'")
    if advice_depth is not None and advice_depth < 1:
        raise DataError(f"advice_depth must be >= 1 (or None for the whole list), got "
                        f"{advice_depth}")
    jobs = jobs.sort_values(["submitted_at", "attempt_id"], kind="stable").reset_index(drop=True)
    model_known = set(ranker.serving.artifact.catalog) if ranker.serving else set(costs)
    known = [n for n in fleet.hardware_names if n in costs and n in model_known]
    cands = eligible_names(fleet, jobs, known)
    results = leap_rankings(ranker, jobs, cands,
                            None if progress is None else (lambda d, t: progress("rank", d, t)))
    lists = {"leap": [[r.hardware for r in res.ranking] for res in results]}
    if oracle_arm:
        lists["oracle"] = [oracle_order(v) for v in true_values(fleet, jobs, cands, costs)]
    top = np.array([a[0] if a else "" for a in lists["leap"]], dtype=object)
    best = np.array([a[0] if a else "" for a in lists["oracle"]], dtype=object) \
        if oracle_arm else np.full(len(jobs), "", dtype=object)

    hours_all = gpu_hours(jobs)
    has_cands = np.array([len(c) > 0 for c in cands], dtype=bool)
    ranked = np.array([len(a) > 0 for a in lists["leap"]], dtype=bool)
    ok = (jobs["status"] == "succeeded").to_numpy()
    succeeded = jobs[ok].reset_index(drop=True)
    scheduler = CapacityScheduler(fleet)

    base_place = scheduler.place(jobs)
    base_cost = arm_costs(fleet, succeeded, base_place.hardware[ok], costs)

    def score(placed: Placement) -> dict[str, Any]:
        hw = placed.hardware.astype(object)
        c = arm_costs(fleet, succeeded, hw[ok], costs, base_cost["samples_fixed_time"],
                      base_cost["cost_fixed_time"])
        return _arm_summary(c, base_cost, hw, placed, top, ranked, best, hours_all,
                            oracle_arm)

    plan = [("baseline", None, None)] + [(name, name, advice_depth) for name in lists]
    plan += [(f"{name}@{d or 'all'}", name, d) for name in lists for d in sweep_depths
             if d != advice_depth]
    arms: dict[str, Any] = {}
    for step, (label, source, depth) in enumerate(plan):
        if progress:
            progress("replay", step, len(plan))
        if source is None:
            arms[label] = score(base_place)
            continue
        advice = [a[:depth] if depth else a for a in lists[source]]
        arms[label] = score(scheduler.place(jobs, advice=advice)) | {
            "advice_depth": depth or "all"}
    if progress:
        progress("replay", len(plan), len(plan))
    main = {k: v for k, v in arms.items() if "@" not in k}
    sweep = {k: {"advice_depth": v.get("advice_depth"),
                 "top_choice_attempts": v["top_choice_attempts"],
                 "top_choice_gpu_hours": v["top_choice_gpu_hours"],
                 "cost_change_fixed_work": v["fixed_work"]["total_cost_change"],
                 "value_ratio_geomean_gpu_hours": v["value_ratio_geomean_gpu_hours"],
                 "cost_per_sample_change_fixed_time": v["fixed_time"]["cost_per_sample_change"]}
             for k, v in arms.items() if k != "baseline"}

    history = jobs["hardware"].astype(str).to_numpy()
    days = pd.to_datetime(jobs["submitted_at"], utc=True).dt.strftime("%Y-%m-%d")
    reasons = pd.Series([r.reason.split(":")[0] for r in results if r.reason],
                        dtype=object).value_counts()
    return {
        "days": sorted(days.unique().tolist()),
        "n_attempts": len(jobs),
        "n_succeeded": int(ok.sum()),
        "gpu_hours": float(hours_all.sum()),
        "advice_depth": advice_depth or "all",
        "coverage": {
            "attempts": _share(ranked[has_cands]),
            "gpu_hours": _share(ranked[has_cands], hours_all[has_cands]),
            "eligible_attempts": int(has_cands.sum()),
            "unranked_reasons": {str(k): int(v) for k, v in reasons.items()},
        },
        "replay_matches_history": _share(base_place.hardware.astype(str) == history),
        "arms": main,
        "depth_sweep": sweep,
        "currency": "catalog cost units (USD in the default catalog)",
        "definitions": {
            "coverage": "share of attempts (GPU-hours) with an eligible type that got a "
                        "non-empty LEAP ranking",
            "top_choice": "share of all attempts (GPU-hours) placed on LEAP's first choice",
            "advice_depth": "types of the list the scheduler tries before the job's home "
                            "types",
            "fixed_time": "each succeeded attempt runs its recorded hours on the chosen type",
            "fixed_work": "each succeeded attempt processes its baseline samples on the chosen "
                          "type; hours = samples / true throughput",
            "gpu_hours": "devices x recorded duration_hours",
        },
    }


def _arm_summary(c: dict[str, np.ndarray], base: dict[str, np.ndarray], hw: np.ndarray,
                 placed: Placement, top: np.ndarray, ranked: np.ndarray, best: np.ndarray,
                 hours_all: np.ndarray, oracle_arm: bool) -> dict[str, Any]:
    on_top = (hw == top) & ranked
    on_best = (hw == best) & (best != "")
    cost_t = float(c["cost_fixed_time"].sum())
    samples_t = float(c["samples_fixed_time"].sum())
    cost_w = float(c["cost_fixed_work"].sum())
    base_t = float(base["cost_fixed_time"].sum())
    base_samples = float(base["samples_fixed_time"].sum())
    per_m_t = 1e6 * cost_t / samples_t if samples_t > 0 else math.nan
    # Per attempt: true value on the arm's type over that on the baseline's (devices cancel).
    # Robust to the heavy tail that dominates the totals (one 2,000-device job can).
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (c["samples_per_s"] / c["price"]) / (base["samples_per_s"] / base["price"])
    runs = np.isfinite(ratio) & (ratio > 0)
    w = base["hours"] * base["devices"]
    log_r = np.log(np.where(runs, ratio, 1.0))
    base_per_m = 1e6 * base_t / base_samples if base_samples > 0 else math.nan
    return {
        "top_choice_attempts": _share(on_top),
        "top_choice_gpu_hours": _share(on_top, hours_all),
        "oracle_best_attempts": _share(on_best) if oracle_arm else math.nan,
        "oracle_best_gpu_hours": _share(on_best, hours_all) if oracle_arm else math.nan,
        "placement": {str(k): int(v) for k, v in
                      pd.Series(placed.choice).value_counts().sort_index().items()},
        "not_fit": int(c["not_fit"].sum()),
        "value_ratio_median": float(np.median(ratio[runs])) if runs.any() else math.nan,
        "value_ratio_geomean_gpu_hours": float(np.exp((w[runs] * log_r[runs]).sum()
                                                      / w[runs].sum()))
        if runs.any() and w[runs].sum() > 0 else math.nan,
        "share_better": _share(runs & (ratio > 1.0 + 1e-9)),
        "share_worse": _share(~runs | (ratio < 1.0 - 1e-9)),
        "fixed_time": {
            "total_cost": cost_t, "total_samples": samples_t,
            "cost_per_million_samples": per_m_t,
            "cost_per_sample_change": per_m_t / base_per_m - 1.0 if base_per_m > 0
            else math.nan,
            "samples_change": samples_t / base_samples - 1.0 if base_samples > 0 else math.nan,
        },
        "fixed_work": {
            "total_cost": cost_w, "total_samples": base_samples,
            "cost_per_million_samples": 1e6 * cost_w / base_samples if base_samples > 0
            else math.nan,
            "total_cost_change": cost_w / base_t - 1.0 if base_t > 0 else math.nan,
        },
    }


def top_choice_table(study: dict[str, Any], arms: Sequence[str] = ARMS) -> list[dict[str, Any]]:
    """Flat rows (one per arm) of the headline impact numbers, for tables and plots.

    Examples
    --------
    >>> # for row in top_choice_table(study): print(row["arm"], row["cost_change_fixed_work"])
    """
    rows = []
    for name in arms:
        if name not in study["arms"]:
            continue
        a = study["arms"][name]
        rows.append({"arm": name, "top_choice_attempts": a["top_choice_attempts"],
                     "top_choice_gpu_hours": a["top_choice_gpu_hours"],
                     "total_cost_fixed_time": a["fixed_time"]["total_cost"],
                     "cost_per_million_samples_fixed_time":
                         a["fixed_time"]["cost_per_million_samples"],
                     "cost_change_fixed_time": a["fixed_time"]["cost_per_sample_change"],
                     "total_cost_fixed_work": a["fixed_work"]["total_cost"],
                     "cost_change_fixed_work": a["fixed_work"]["total_cost_change"],
                     "not_fit": a["not_fit"]})
    return rows
