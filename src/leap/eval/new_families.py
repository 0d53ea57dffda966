"""New families: leave families out of training and measure the accuracy lost on them.

The paper names new model families as a boundary (one single-family experiment lost 49.7
points). :func:`new_families_study` measures it on one held-out day, twice over:

* **model-type groups**: a share of the model types that run on the day is drawn (seeded);
  every family of a drawn type leaves the training window together, so no sibling family of
  the same architecture is left to borrow history from, and the type-level history goes too;
* **one large family**, as the paper did: the family with the most succeeded attempts on the
  day (among those with history, of a type not drawn above) leaves alone; its model type's
  other families stay.

Both leave in one retraining (the single family's type keeps its other families, so the two
do not interact beyond one family's rows in a 30-day window). The same attempts are scored by
the model trained on everything ("seen") and by the one trained without them ("held out"),
the latter twice: with the attempts' architecture columns as recorded ("with prior") and with
them blanked at prediction time ("without prior"; training keeps them for every other
family): what the architecture summary (:mod:`leap.arch`, a job's ``model_config``) is worth
to a family leap has never seen. The
families that are new on the day anyway (no history in either model) get the same with /
without comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from leap import metrics
from leap.arch import SUMMARY_COLUMNS
from leap.catalog import Catalog
from leap.data.usage import recorded_device_hours
from leap.errors import ConfigError, ParamError
from leap.model.train import WindowModel, family_seen, train_window
from leap.model.window import TrainConfig, day_start, window_attempts
from leap.records import Record

#: Architecture columns blanked for the "without prior" predictions.
ARCHITECTURE_COLUMNS: tuple[str, ...] = (*SUMMARY_COLUMNS, "num_dense_features",
                                         "num_sparse_features")
_DAY = timedelta(days=1)

Progress = Callable[[str], None]
#: A model's training settings as the studies record them (window, kind, specialists ...).
TrainSettings = dict[str, int | str | bool]


@dataclass(frozen=True)
class FamilyComparison(Record):
    """The same attempts scored seen, held out with prior and held out without prior
    (accuracy blocks of :func:`score_block`); only ``n`` when there are none."""

    OMIT_NONE = frozenset({"families", "model_types", "seen", "held_out_with_prior",
                           "held_out_without_prior", "new_to_held_out_model", "drop_points",
                           "prior_recovers_points"})

    n: int
    families: int | None = None
    model_types: int | None = None
    seen: dict[str, float] | None = None
    held_out_with_prior: dict[str, float] | None = None
    held_out_without_prior: dict[str, float] | None = None
    new_to_held_out_model: float | None = None
    drop_points: float | None = None
    prior_recovers_points: float | None = None


@dataclass(frozen=True)
class NewFamiliesResult(Record):
    """:func:`new_families_study`: what was left out, and each group's comparison."""

    day: str
    window_days: int
    seed: int
    type_share: float
    held_out_attempts: int
    left_out_model_types: list[str]
    left_out_families: int
    left_out_training_attempts: int
    single_family_id: str | None
    overall_seen: dict[str, float]
    model_type_groups: FamilyComparison
    model_type_groups_by_category: dict[str, FamilyComparison]
    single_family: FamilyComparison
    new_on_the_day: FamilyComparison
    timings: dict[str, float]
    train_config: TrainSettings


def choose_left_out(past: pd.DataFrame, held: pd.DataFrame, *, type_share: float, seed: int
                    ) -> tuple[list[str], str | None]:
    """The model types left out together, and the single large family left out alone.

    Types are drawn (``seed``) from those with succeeded attempts on the held-out day and
    history in ``past``; the large family is the one with the most attempts on the day
    among families with history whose type is not drawn.

    Examples
    --------
    >>> past = pd.DataFrame({"model_type": ["a", "b", "c"], "family_id": ["fa", "fb", "fc"]})
    >>> held = pd.DataFrame({"model_type": ["a", "b", "b", "c"],
    ...                      "family_id": ["fa", "fb", "fb", "fc"]})
    >>> types, family = choose_left_out(past, held, type_share=0.34, seed=0)
    >>> len(types), family not in (None, *[f"f{t}" for t in types])
    (1, True)
    """
    if not 0 < type_share < 1:
        raise ParamError(f"{{type_share}} must be between 0 and 1, got {type_share}")
    seen_types = set(past["model_type"].unique())
    candidates = sorted(t for t in held["model_type"].unique() if t in seen_types)
    if len(candidates) < 2:
        raise ConfigError("the held-out day has fewer than two model types with history; "
                          "simulate or ingest more days")
    rng = np.random.default_rng(seed)
    k = min(len(candidates) - 1, max(1, round(type_share * len(candidates))))
    types = sorted(str(t) for t in rng.choice(candidates, size=k, replace=False))
    seen_families = set(past["family_id"].unique())
    rest = held[~held["model_type"].isin(types) & held["family_id"].isin(seen_families)]
    counts = rest.groupby("family_id").size().sort_values(ascending=False, kind="stable")
    family = str(counts.index[0]) if len(counts) else None
    return types, family


def _blank(jobs: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in ARCHITECTURE_COLUMNS if c in jobs.columns]
    return jobs.assign(**{c: np.nan for c in cols})


def score_block(pred: np.ndarray, jobs: pd.DataFrame,
                interval: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, float]:
    """Accuracy figures of ``pred`` against the measured throughput of ``jobs``, with the
    median (absolute) log ratio: the sign and size of the typical miss; with ``interval``
    (each row's 80% bounds, samples/s) also ``interval_coverage``, the share of rows with
    bounds whose measured figure lies inside (NaN when no row has them)."""
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    out: dict[str, float] = metrics.summary(pred, actual, recorded_device_hours(jobs)).to_dict()
    if interval is not None:
        covered = metrics.interval_coverage(actual, *interval)
        out["interval_coverage"] = float("nan") if covered is None else covered
    # The sign of the miss: MdAPE caps an under-prediction at 100% but not an over-prediction,
    # so a model that predicts ~0 can "beat" one that predicts 2x on MdAPE alone.
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(pred / actual)
    finite = np.isfinite(log_ratio)
    out["median_log_ratio"] = float(np.median(log_ratio[finite])) if finite.any() \
        else float("nan")
    out["median_abs_log_ratio"] = float(np.median(np.abs(log_ratio[finite]))) \
        if finite.any() else float("nan")
    return out


def score_model(model: WindowModel, jobs: pd.DataFrame) -> dict[str, float]:
    """:func:`score_block` of ``model``'s predictions for ``jobs``, with their 80% intervals
    (``interval_coverage``)."""
    pred = model.artifact.predict_interval(jobs)
    return score_block(np.exp(pred.log), jobs, (np.exp(pred.lo), np.exp(pred.hi)))


def _compare(seen: WindowModel, held_out: WindowModel, jobs: pd.DataFrame) -> FamilyComparison:
    """Seen / held out with prior / held out without prior on the same ``jobs``."""
    if not len(jobs):
        return FamilyComparison(n=0)
    seen_block = score_model(seen, jobs)
    with_prior = score_model(held_out, jobs)
    without_prior = score_block(held_out.artifact.predict(_blank(jobs)), jobs)
    return FamilyComparison(
        n=len(jobs),
        families=int(jobs["family_id"].nunique()),
        model_types=int(jobs["model_type"].nunique()),
        seen=seen_block,
        held_out_with_prior=with_prior,
        held_out_without_prior=without_prior,
        new_to_held_out_model=float((~family_seen(held_out.artifact.snapshot, jobs)).mean()),
        drop_points=100 * (seen_block["accuracy"] - with_prior["accuracy"]),
        prior_recovers_points=100 * (with_prior["accuracy"] - without_prior["accuracy"]),
    )


def _by_category(seen: WindowModel, held_out: WindowModel, jobs: pd.DataFrame
                 ) -> dict[str, FamilyComparison]:
    if "model_category" not in jobs.columns:
        return {}
    return {str(cat): _compare(seen, held_out, part.reset_index(drop=True))
            for cat, part in jobs.groupby("model_category", sort=True)}


def new_families_study(store: Any, catalog: Catalog, cfg: TrainConfig | None = None, *,
                       as_of: datetime | None = None, type_share: float = 0.1, seed: int = 0,
                       progress: Progress | None = None) -> NewFamiliesResult:
    """Accuracy on families left out of training, beside the same families seen.

    Parameters
    ----------
    store : Store
        Attempts (a simulated fleet carries architecture columns on every attempt).
    catalog : Catalog
    cfg : TrainConfig, optional
        Training settings of both models (default :class:`TrainConfig`).
    as_of : datetime, optional
        The held-out day (default: the last full day in the store).
    type_share : float
        Share of the day's model types whose families all leave together.
    seed : int
        Seed of the draw of model types.
    progress : callable, optional
        Called with a short stage name before each step.

    Returns
    -------
    NewFamiliesResult
        ``model_type_groups`` and ``single_family`` blocks (``seen``,
        ``held_out_with_prior``, ``held_out_without_prior``, ``drop_points``,
        ``prior_recovers_points``), per category for the groups, ``new_on_the_day`` (the
        families new to both models) and the wall time of each step.
    """
    from leap.eval.backtest import last_full_day

    cfg = cfg or TrainConfig()
    say = progress or (lambda _stage: None)
    day = day_start(as_of) if as_of is not None else last_full_day(store)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    attempts = window_attempts(store, day, cfg)
    if not len(attempts):
        raise ConfigError(f"no attempts in the window before {day:%Y-%m-%d}")
    before = attempts["submitted_at"] < day
    say("training on every family")
    seen = train_window(attempts, catalog, day, cfg)
    timings["train_seen_s"] = time.perf_counter() - t0
    held = seen.eval_jobs
    types, family = choose_left_out(attempts[before], held, type_share=type_share, seed=seed)
    out_families = set(attempts.loc[attempts["model_type"].isin(types), "family_id"])
    if family is not None:
        out_families.add(family)
    dropped = before & attempts["family_id"].isin(out_families)
    say(f"training without {len(out_families):,} families")
    t1 = time.perf_counter()
    held_out = train_window(attempts[~dropped].reset_index(drop=True), catalog, day, cfg)
    timings["train_held_out_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    in_types = held["model_type"].isin(types).to_numpy()
    group_jobs = held[in_types].reset_index(drop=True)
    single_jobs = held[(held["family_id"] == family).to_numpy()].reset_index(drop=True)
    fresh = ~family_seen(seen.artifact.snapshot, held) & ~in_types
    new_jobs = held[fresh].reset_index(drop=True)
    groups = _compare(seen, held_out, group_jobs)
    by_category = _by_category(seen, held_out, group_jobs)
    single = _compare(seen, held_out, single_jobs)
    new_on_the_day = _compare(seen, held_out, new_jobs)
    overall = score_block(seen.artifact.predict(held), held)
    timings["score_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    return NewFamiliesResult(
        day=day.date().isoformat(),
        window_days=cfg.window_days,
        seed=seed,
        type_share=type_share,
        held_out_attempts=len(held),
        left_out_model_types=types,
        left_out_families=len(out_families),
        left_out_training_attempts=int(dropped.sum()),
        single_family_id=family,
        overall_seen=overall,
        model_type_groups=groups,
        model_type_groups_by_category=by_category,
        single_family=single,
        new_on_the_day=new_on_the_day,
        timings=timings,
        train_config={"window_days": cfg.window_days, "model_kind": cfg.model_kind,
                      "n_specialists": cfg.n_specialists},
    )
