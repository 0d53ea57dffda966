"""What a ranking returns: the preference list's entries, the left-out types and the answer.

These are the result types of :class:`~leap.rank.ranker.Ranker` (``to_dict()`` is the HTTP
response body) and the vocabulary their fields use (objectives, risk rules, reason codes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

V = TypeVar("V", float, np.ndarray)

OBJECTIVES: tuple[str, ...] = ("value", "throughput")
#: How the order treats uncertainty: ``neutral`` sorts by the median prediction, ``averse`` by
#: the interval's lower bound (value at the 10th percentile of throughput), ``cautious`` keeps
#: the cheapest type first unless a dearer one's predicted value gain is at least
#: :data:`CAUTIOUS_Z` standard errors (from the two 80% intervals). Cautious is the default:
#: ranking by the largest point estimate picks overpredictions, and on the reference fleet
#: cautious ranked best of the three (README, "ranking vs the simulator's truth").
RISKS: tuple[str, ...] = ("neutral", "cautious", "averse")
DEFAULT_RISK = "cautious"
#: Fail-open reason codes (the prefix of :attr:`RankResult.reason`).
FAIL_OPEN_CODES: tuple[str, ...] = ("no_model", "invalid_request", "prediction_failed")
#: Exclusion reasons, in the order they are checked (a type gets the first that applies).
EXCLUSION_REASONS: tuple[str, ...] = ("unknown_hardware", "invalid_cost", "does_not_fit_host",
                                      "does_not_fit_memory", "premium_below_threshold",
                                      "over_budget")


def value(throughput: V, cost_per_hour: V | float) -> V:
    """What leap ranks by: samples per unit of cost, ``throughput x 3600 / cost_per_hour``
    (samples/s and the catalog's currency per hour; scalars or arrays).

    >>> value(10.0, 2.0)
    18000.0
    """
    return throughput * 3600.0 / cost_per_hour


@dataclass(frozen=True)
class RankedType:
    """One entry of the preference list (units in the names; cost in the catalog's currency)."""

    hardware: str
    predicted_throughput: float
    cost_per_hour: float
    value: float
    predicted_utilization: float | None
    speedup: float | None
    devices: int
    cost_per_device_hour: float
    premium: bool
    flags: tuple[str, ...] = ()
    throughput_p10: float | None = None
    throughput_p90: float | None = None
    novelty: str | None = None

    @property
    def value_p10(self) -> float | None:
        """Value at the interval's lower bound (what the ``averse`` order sorts by)."""
        return None if self.throughput_p10 is None else \
            value(self.throughput_p10, self.cost_per_hour)

    @property
    def value_p90(self) -> float | None:
        return None if self.throughput_p90 is None else \
            value(self.throughput_p90, self.cost_per_hour)

    def to_dict(self) -> dict[str, Any]:
        # Spelled out: dataclasses.asdict deep-copies, which costs ~40 us per entry per call.
        return {"hardware": self.hardware, "predicted_throughput": self.predicted_throughput,
                "throughput_p10": self.throughput_p10, "throughput_p90": self.throughput_p90,
                "cost_per_hour": self.cost_per_hour, "value": self.value,
                "value_p10": self.value_p10, "value_p90": self.value_p90,
                "predicted_utilization": self.predicted_utilization, "speedup": self.speedup,
                "devices": self.devices, "cost_per_device_hour": self.cost_per_device_hour,
                "premium": self.premium, "novelty": self.novelty, "flags": list(self.flags)}


@dataclass(frozen=True)
class Excluded:
    """A candidate left out of the ranking, with a reason code and a readable detail."""

    hardware: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"hardware": self.hardware, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True)
class RankResult:
    """The answer of :meth:`Ranker.rank`: the ordered preference list and what was left out.

    ``reason`` is ``None`` when ranking worked; otherwise ``"<code>: <detail>"`` and the
    ranking is empty (fail-open). ``to_dict()`` is the HTTP response body.
    """

    ranking: list[RankedType]
    excluded: list[Excluded] = field(default_factory=list)
    model_version: str | None = None
    reason: str | None = None
    objective: str = "value"
    latency_ms: float = 0.0
    ignored_fields: list[str] = field(default_factory=list)
    risk: str = DEFAULT_RISK

    @property
    def ok(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict[str, Any]:
        return {"ranking": [r.to_dict() for r in self.ranking],
                "excluded": [e.to_dict() for e in self.excluded],
                "model_version": self.model_version, "reason": self.reason,
                "objective": self.objective, "risk": self.risk, "latency_ms": self.latency_ms,
                "ignored_fields": list(self.ignored_fields)}


@dataclass(frozen=True)
class PredictResult:
    """Batch predictions: one row per (job, hardware); empty with a ``reason`` on failure."""

    frame: pd.DataFrame
    model_version: str | None = None
    reason: str | None = None
    latency_ms: float = 0.0
