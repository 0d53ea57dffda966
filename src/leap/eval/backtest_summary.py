"""A backtest's nights summarised: the median, min, max and mean of each night figure
(:func:`summarize`), beside the paper's 30 nights."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from leap.features.encode import NOVELTY_GROUPS
from leap.records import Record

#: The paper's 30-night figures (share within ±20%, attempt-weighted).
PAPER = {"accuracy_median": 0.770, "accuracy_min": 0.735, "accuracy_max": 0.806}


#: Night figures summarised over the nights: name -> path in the night record.
SUMMARY_FIELDS: dict[str, tuple[str, ...]] = {
    "accuracy": ("held_out", "accuracy"),
    "accuracy_gpu_hours": ("held_out", "accuracy_gpu_hours"),
    "median_ape": ("held_out", "median_ape"),
    "coverage": ("held_out", "coverage"),
    "accuracy_seen_families": ("held_out", "seen_families", "accuracy"),
    "accuracy_unseen_families": ("held_out", "unseen_families", "accuracy"),
    "unseen_share": ("held_out", "unseen_share"),
    "oracle_ceiling": ("oracle_ceiling", "accuracy"),
    "oracle_ceiling_gpu_hours": ("oracle_ceiling", "accuracy_gpu_hours"),
    "lookup_coverage": ("lookup", "table_coverage"),
    "lookup_accuracy_covered": ("lookup", "table_accuracy_covered"),
    "leap_accuracy_lookup_covered": ("lookup", "leap_accuracy_covered"),
    "held_out_attempts": ("held_out", "n"),
    "train_rows": ("train_rows",),
    "interval_coverage": ("held_out", "interval_coverage"),
    # Per novelty group: the held-out day's attempts as they came, and the same attempts with
    # their own (family, type) history masked (what types a family never ran on look like).
    **{f"{kind}_{what}_{group}": ("held_out", key, group, what)
       for kind, key in (("novelty", "novelty"), ("masked", "masked_pairs"))
       for group in NOVELTY_GROUPS for what in ("accuracy", "interval_coverage")},
    "night_s": ("timings_s", "night_s"),
    "fit_s": ("timings_s", "fit_s"),
}
#: Figures also pooled over the nights' rows: name -> path of each night's row count.
POOL_WEIGHTS: dict[str, tuple[str, ...]] = {
    f"{kind}_{what}_{group}": ("held_out", key, group, "n")
    for kind, key in (("novelty", "novelty"), ("masked", "masked_pairs"))
    for group in NOVELTY_GROUPS for what in ("accuracy", "interval_coverage")}


@dataclass(frozen=True)
class Spread(Record):
    """One night figure over the nights (nights without it skipped); for a share of rows
    (:data:`POOL_WEIGHTS`), ``pooled`` is its share of all the nights' rows together."""

    OMIT_NONE = frozenset({"pooled"})

    median: float
    min: float
    max: float
    mean: float
    n: int
    pooled: float | None = None


@dataclass(frozen=True)
class BacktestSummary(Record):
    """:func:`summarize`: each of :data:`SUMMARY_FIELDS` over the nights (None where no night
    has it) and the paper's figures. Its JSON keeps the figures at the top level:
    ``{"nights": ..., "accuracy": {...}, ..., "paper": {...}}``."""

    nights: int
    figures: dict[str, Spread | None]
    paper: dict[str, float]

    def figure(self, name: str) -> Spread | None:
        """The spread of the figure ``name`` (a key of :data:`SUMMARY_FIELDS`), if any."""
        return self.figures.get(name)

    def to_dict(self) -> dict[str, Any]:
        return {"nights": self.nights,
                **{k: None if v is None else v.to_dict() for k, v in self.figures.items()},
                "paper": dict(self.paper)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BacktestSummary:
        return cls(nights=int(data.get("nights", 0)),
                   figures={k: None if data[k] is None else Spread.from_dict(data[k])
                            for k in SUMMARY_FIELDS if k in data},
                   paper=dict(data.get("paper", {})))


def _get(rec: Mapping[str, Any], path: Iterable[str]) -> float:
    cur: Any = rec
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur or cur[key] is None:
            return float("nan")
        cur = cur[key]
    try:
        return float(cur)
    except (TypeError, ValueError):
        return float("nan")


def summarize(nights: Sequence[Mapping[str, Any]]) -> BacktestSummary:
    """Median, min, max and mean of each night figure (NaN nights skipped), and the paper's,
    over night records as JSON (:meth:`Night.to_dict`; :data:`SUMMARY_FIELDS` are paths in it).

    Examples
    --------
    >>> s = summarize([{"held_out": {"accuracy": a}} for a in (0.7, 0.8, 0.75)])
    >>> s.figure("accuracy")
    Spread(median=0.75, min=0.7, max=0.8, mean=0.75, n=3, pooled=None)
    >>> g = [{"held_out": {"novelty": {"new_family": {"n": n, "interval_coverage": c}}}}
    ...      for n, c in ((100, 0.9), (300, 0.7))]
    >>> summarize(g).figure("novelty_interval_coverage_new_family").pooled
    0.75
    """
    figures: dict[str, Spread | None] = {}
    for name, path in SUMMARY_FIELDS.items():
        weight = POOL_WEIGHTS.get(name)
        kept = [(v, _get(night, weight) if weight else 1.0)
                for night in nights if np.isfinite(v := _get(night, path))]
        vals = [v for v, _ in kept]
        w = np.array([n for _, n in kept])
        pooled = float(np.dot(vals, w) / w.sum()) \
            if weight and vals and np.isfinite(w).all() and w.sum() > 0 else None
        figures[name] = Spread(median=statistics.median(vals), min=min(vals), max=max(vals),
                               mean=statistics.fmean(vals), n=len(vals),
                               pooled=pooled) if vals else None
    return BacktestSummary(nights=len(nights), figures=figures, paper=dict(PAPER))
