"""Launch-time ranking of accelerator types by value, with the premium filter and fail-open.

For one job (its launch-time fields, no outcome) and the eligible types (default: every type
in the cost catalog), :meth:`Ranker.rank` returns the preference list. For each type:

``predicted_throughput``
    samples/s of the whole job, from the published model.
``cost_per_hour``
    ``devices x cost_per_device_hour`` with ``devices = trainer_count x devices_per_trainer``
    (1 when absent), priced from the *cost catalog*: the artifact's catalog snapshot unless the
    Ranker was given the user's catalog (``costs=``), so new prices apply without retraining.
``value``
    ``predicted_throughput x 3600 / cost_per_hour``: samples per unit of cost.
``predicted_utilization``
    predicted model-FLOP utilization (MFU) =
    ``predicted_throughput x flops_per_sample / (devices x peak FLOP/s)``, with the peak for
    the job's precision (:func:`leap.features.physics.peak_flops`; fp32, tf32 or 16-bit) and
    ``flops_per_sample`` the job's training FLOPs per sample (forward + backward). ``None``
    when the job has no ``flops_per_sample``.
``speedup``
    predicted throughput over that of the fastest non-premium type the job fits on (among the
    candidates, or the whole model catalog when no non-premium candidate is left).

Premium types (``premium = true`` in the cost catalog) are kept only when one rule passes,
and the entry's flags say which: with ``flops_per_sample``, MFU must reach the type's
``min_utilization`` (catalog, overridable per type with ``min_utilization=``) ->
``premium_kept_mfu``; without it, the speed-up must reach ``premium_min_speedup`` (default
1.25, overridable per type with ``min_speedup=``) -> ``premium_kept_speedup``. Otherwise the
type is excluded with reason ``premium_below_threshold``.

Other exclusions, each listed with a reason and a detail: ``unknown_hardware`` (the model's
catalog does not have the type, or it is in no catalog at all when not ``strict``),
``invalid_cost`` (a cost of 0 in the catalog), ``does_not_fit_host`` (more devices per trainer
than the type has per host), ``does_not_fit_memory`` (the learner's physics estimate
``mem_fit`` > 1, and the family never succeeded on a type with at least that much device
memory: history overrules the conservative estimate) and ``over_budget`` (``cost_per_hour``
above ``max_cost_per_hour``). Flags: ``missing_family_history``, ``missing_hardware_history``
(the family never ran on the type in the history window), ``memory_fit_unknown`` (no
``num_params``), ``utilization_above_peak`` (MFU > 1: check ``flops_per_sample``),
``premium_kept_mfu``, ``premium_kept_speedup``, ``no_free_devices`` (with ``free_devices=``:
the type has too few free devices for the job now; it is ordered after the types with room).
When every candidate is left out the ranking is empty and ``reason`` is
``"no_eligible_type: ..."`` (an empty answer always says why; this one is not a failure and is
not counted as fail-open).

Objectives: ``value`` (default) sorts by value; ``throughput`` sorts by predicted throughput
(fastest within an optional ``max_cost_per_hour`` budget). Ties break by name, so the order
never depends on the order of the candidates. The ``risk`` rule (:func:`order_ranking`) says
how the 80% intervals enter: ``cautious`` (default) keeps the cheapest type first unless a
dearer one beats it confidently, ``neutral`` sorts by the median, ``averse`` by the low end.

Fail-open: any failure inside prediction (no model, a corrupt artifact, a bug, a non-finite
prediction) gives ``RankResult(ranking=[], reason="<code>: <detail>")`` and is counted in
:attr:`Ranker.fail_open_counts`; it never raises into the caller. Only with ``strict=True``
does a bad *request* (a job field of the wrong type or range, checked by the one validation
of :mod:`leap.data.jobs`; an unknown hardware name) raise
:class:`~leap.errors.DataError` / :class:`~leap.errors.CatalogError`: the HTTP layer turns
those into 422. Reason codes: ``no_model``, ``invalid_request``, ``prediction_failed``.

Features come from the one feature path, :func:`leap.features.encode.encode`, fed with typed
:class:`~leap.features.columns.Columns` (one row per candidate type); no DataFrame per call.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog, Hardware
from leap.data.jobs import REQUIRED_JOB, check_job, check_jobs_frame, expand_model_config
from leap.errors import (
    ArtifactError,
    CatalogError,
    ConfigError,
    DataError,
    LeapError,
    did_you_mean,
)
from leap.features.columns import Columns
from leap.features.encode import FEATURE_NAMES, NOVELTY_GROUPS, jobs_frame
from leap.features.physics import hardware_specs, peak_flops
from leap.model.artifact import LATEST, Artifact, Registry

log = logging.getLogger("leap.rank")

OBJECTIVES: tuple[str, ...] = ("value", "throughput")
#: How the order treats uncertainty: ``neutral`` sorts by the median prediction, ``averse`` by
#: the interval's lower bound (value at the 10th percentile of throughput), ``cautious`` keeps
#: the cheapest type first unless a dearer one's predicted value gain is at least
#: :data:`CAUTIOUS_Z` standard errors (from the two 80% intervals). Cautious is the default:
#: ranking by the largest point estimate picks overpredictions, and on the reference fleet
#: cautious ranked best of the three (README, "ranking vs the simulator's truth").
RISKS: tuple[str, ...] = ("neutral", "cautious", "averse")
DEFAULT_RISK = "cautious"
#: Standard errors of value gain a dearer type needs to rank above the cheapest (``cautious``).
#: Chosen on a validation day (day 30 of the reference fleet, a model trained before it) among
#: 0, 0.25, 0.5, 0.75, 1 and 1.5, then checked on the held-out day 31.
CAUTIOUS_Z = 0.75
# An 80% interval spans +-1.2816 standard deviations of a normal (log scale).
_Z80 = 1.2815515655446004
#: An entry whose 80% interval spans more than this factor (p90 / p10) is flagged uncertain.
UNCERTAIN_RATIO = 2.0
#: Fail-open reason codes (the prefix of :attr:`RankResult.reason`).
FAIL_OPEN_CODES: tuple[str, ...] = ("no_model", "invalid_request", "prediction_failed")
#: Exclusion reasons, in the order they are checked (a type gets the first that applies).
EXCLUSION_REASONS: tuple[str, ...] = ("unknown_hardware", "invalid_cost", "does_not_fit_host",
                                      "does_not_fit_memory", "premium_below_threshold",
                                      "over_budget")
DEFAULT_PREMIUM_MIN_SPEEDUP = 1.25

_REQUIRED_JOB = REQUIRED_JOB
# Feature columns the ranker reads for its fit filter and history flags.
_COL_MEM_FIT, _COL_FAM_N, _COL_FAM_HW_N = (FEATURE_NAMES.index(c)
                                           for c in ("mem_fit", "fam_n", "fam_hw_n"))


# Results ----------------------------------------------------------------------------------
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
            self.throughput_p10 * 3600.0 / self.cost_per_hour

    @property
    def value_p90(self) -> float | None:
        return None if self.throughput_p90 is None else \
            self.throughput_p90 * 3600.0 / self.cost_per_hour

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


# Request normalisation --------------------------------------------------------------------
#: The one job validation every entry point uses (:func:`leap.data.jobs.check_job`), under
#: the name the ranker has always exported.
normalize_job = check_job


# The serving model and its hot reload -------------------------------------------------------
@dataclass
class Serving:
    """A loaded artifact plus what ranking caches about it (swapped as one reference).

    Rows are encoded by the one feature path, :func:`leap.features.encode.encode`, with every
    feature column (:meth:`Artifact.encode_full`): the ranker reads ``mem_fit`` and the
    history counts for its flags, and the artifact scores them
    (:meth:`Artifact.predict_encoded`).
    """

    artifact: Artifact
    loaded_at: datetime
    pos: dict[str, int]
    specs: dict[str, np.ndarray]
    family_min_memory_gb: dict[str, float]
    _peaks: dict[str | None, np.ndarray] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.artifact.version

    @classmethod
    def prepare(cls, artifact: Artifact) -> Serving:
        """Build the per-model caches (hardware specs, feature column positions)."""
        names = list(artifact.catalog)
        unknown = [n for n in artifact.spec.names if n not in FEATURE_NAMES]
        if unknown:
            raise ArtifactError(f"model {artifact.version} uses features this leap cannot "
                                f"compute: {unknown}; retrain it")
        # The smallest device memory each family has succeeded on: a type with at least that
        # much memory fits the family, whatever the (conservative) physics estimate says.
        artifact.snapshot.warm()
        fam_hw = artifact.snapshot.tables["fam_hw"]
        memory = {n: h.memory_gb for n, h in artifact.catalog.items()}
        per_row = fam_hw["hardware"].astype(str).map(memory)
        family_min = per_row.groupby(fam_hw["family_id"].astype(str)).min().dropna()
        return cls(artifact=artifact, loaded_at=datetime.now(UTC),
                   family_min_memory_gb={str(k): float(v) for k, v in family_min.items()},
                   pos={n: i for i, n in enumerate(names)},
                   specs=hardware_specs(artifact.catalog, np.array(names, dtype=object)))

    def peak_flops(self, precision: str | None, hardware: Sequence[str]) -> np.ndarray:
        """Peak dense FLOP/s per device for ``precision`` on each of ``hardware``."""
        if precision not in self._peaks:
            n = len(self.pos)
            self._peaks[precision] = peak_flops(np.full(n, precision, dtype=object), self.specs)
        return self._peaks[precision][[self.pos[h] for h in hardware]]

    def encode(self, job: Mapping[str, Any], hardware: Sequence[str]) -> np.ndarray:
        """Every feature column of ``job`` (normalized) on each of ``hardware``."""
        return self.artifact.encode_full(Columns.from_request(job, hardware))


class ModelWatcher:
    """The serving model of a :class:`Registry`, swapped when ``LATEST`` changes.

    :meth:`current` is cheap: at most every ``check_interval_s`` it stats the ``LATEST``
    file; when that changed it loads the new version fully (in a background thread unless
    ``background=False``) and then swaps one reference, so requests in flight finish on the
    model they started with. A new version is first proven loadable and sane in a child
    process (:meth:`Registry.load` with its probe), so a malformed model cannot crash the
    server. A version that fails is refused: logged, counted (``reload_failures``), named in
    ``refused_version`` / ``refused_reason``, and the previous model keeps serving. With
    ``pin`` the watcher serves that one version and never follows ``LATEST``.

    Examples
    --------
    >>> # watcher = ModelWatcher(Registry(ws.models_dir)); serving = watcher.current()
    """

    def __init__(self, registry: Registry, *, check_interval_s: float = 1.0,
                 background: bool = True,
                 prepare: Callable[[Artifact], Serving] = Serving.prepare,
                 pin: str | None = None) -> None:
        self.registry = registry
        self.pin = pin
        self.check_interval_s = check_interval_s
        self.background = background
        self._prepare = prepare
        self._serving: Serving | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._last_check = -math.inf
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._loader: threading.Thread | None = None
        self.error: str | None = None
        self.reloads = 0
        self.reload_failures = 0
        self.refused_version: str | None = None
        self.refused_reason: str | None = None

    def _latest_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.registry.root / LATEST)
        except OSError:
            return None
        # os.replace gives a new inode; mtime and size catch an in-place rewrite.
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> Serving | None:
        """The model to serve now (checks for a new one at most every interval)."""
        if self.pin is not None and self._stamp is not None:
            return self._serving  # a pinned version is loaded (or refused) once
        now = time.monotonic()
        if now - self._last_check >= self.check_interval_s:
            self._last_check = now
            stamp = self._latest_stamp()
            if stamp != self._stamp:
                if self.background:
                    self._start_loader()
                else:
                    self._load(stamp)
        return self._serving

    def refresh(self) -> bool:
        """Check and load now, in this thread; True when a new model was swapped in."""
        self._last_check = time.monotonic()
        return self._load(self._latest_stamp())

    def _start_loader(self) -> None:
        with self._lock:
            if self._loader is not None and self._loader.is_alive():
                return
            self._loader = threading.Thread(target=lambda: self._load(self._latest_stamp()),
                                            name="leap-model-reload", daemon=True)
            self._loader.start()

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait for a background load to finish (tests and benchmarks)."""
        loader = self._loader
        if loader is not None:
            loader.join(timeout_s)

    def _load(self, stamp: tuple[int, int, int] | None) -> bool:
        with self._load_lock:
            return self._load_locked(stamp)

    def _load_locked(self, stamp: tuple[int, int, int] | None) -> bool:
        if self.pin is not None:
            version: str | None = self.pin
            stamp = stamp or (0, 0, 0)
        else:
            version = self.registry.latest_version() if stamp is not None else None
        if version is None:
            self._stamp = stamp
            if self._serving is None:
                self.error = (f"no published model in {self.registry.root}; run `leap train` "
                              "first")
            return False
        if self._serving is not None and self._serving.version == version:
            self._stamp = stamp
            return False
        try:
            # Registry.load proves the version in a child process first (load + probe), so
            # a model that would crash LightGBM is refused here instead of killing us.
            serving = self._prepare(self.registry.load(version))
        except Exception as exc:  # a corrupt artifact can raise anything
            # (LightGBM, Arrow, JSON ...); serving must go on with the old model or fail open.
            self.reload_failures += 1
            self.refused_version = version
            self.refused_reason = _describe(exc)
            self.error = f"model version {version} failed to load: {self.refused_reason}"
            log.error("%s", self.error, exc_info=not isinstance(exc, LeapError))
            self._stamp = stamp  # retried only when LATEST changes again
            return False
        self._serving = serving
        self._stamp = stamp
        self.error = None
        self.refused_version = self.refused_reason = None
        self.reloads += 1
        log.info("serving model %s", version)
        return True


def _log_sd(r: RankedType) -> float:
    """Standard deviation of the log prediction implied by the 80% interval (0 without one)."""
    if r.throughput_p10 is None or r.throughput_p90 is None:
        return 0.0
    return (math.log(r.throughput_p90) - math.log(r.throughput_p10)) / (2.0 * _Z80)


def order_ranking(ranking: list[RankedType], objective: str, risk: str) -> list[RankedType]:
    """The preference order of ``ranking`` for ``objective`` under the ``risk`` rule.

    ``cautious`` (value only; for throughput it is ``neutral``) starts from the neutral order
    and moves the cheapest type ahead of every type whose predicted value gain over it is
    below :data:`CAUTIOUS_Z` standard errors, ``log(value / value_cheapest) /
    sqrt(sd^2 + sd_cheapest^2)`` with each ``sd`` from its 80% interval: ranking by the
    largest point estimate picks overpredictions, and the cheapest type is the best value
    more often than any other. Without intervals it equals ``neutral``.

    Examples
    --------
    >>> a = RankedType("cheap", 10.0, 1.0, 36000.0, None, None, 1, 1.0, False, (), 5.0, 20.0)
    >>> b = RankedType("dear", 30.0, 2.5, 43200.0, None, None, 1, 2.5, False, (), 10.0, 90.0)
    >>> [r.hardware for r in order_ranking([a, b], "value", "neutral")]
    ['dear', 'cheap']
    >>> [r.hardware for r in order_ranking([a, b], "value", "cautious")]
    ['cheap', 'dear']
    """
    out = sorted(ranking, key=lambda r: _sort_key(r, objective, risk))
    if risk != "cautious" or objective != "value" or len(out) < 2:
        return out
    anchor = min(out, key=lambda r: (r.cost_per_hour, r.hardware))
    sd_a = _log_sd(anchor)

    def confident(r: RankedType) -> bool:
        gain = math.log(r.value / anchor.value)
        sd = math.hypot(_log_sd(r), sd_a)
        return gain > CAUTIOUS_Z * sd if sd > 0 else gain > 0

    ahead = [r for r in out if r is not anchor and confident(r)]
    return ahead + [anchor] + [r for r in out if r is not anchor and not confident(r)]


def _sort_key(r: RankedType, objective: str, risk: str) -> tuple[float, str]:
    """Best first; ties by name, so the order never depends on the candidates' order."""
    averse = risk == "averse" and r.throughput_p10 is not None
    tp = r.throughput_p10 if averse and r.throughput_p10 is not None else r.predicted_throughput
    return (-(tp / r.cost_per_hour if objective == "value" else tp), r.hardware)


def _check_objective(objective: str, max_cost_per_hour: float | None) -> None:
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got "
                          f"{objective!r}")
    if max_cost_per_hour is not None and not (
            isinstance(max_cost_per_hour, int | float) and not isinstance(max_cost_per_hour, bool)
            and 0 < max_cost_per_hour < math.inf):
        raise ConfigError(f"max_cost_per_hour must be a positive number, got "
                          f"{max_cost_per_hour!r}")


def _check_free_devices(free_devices: Mapping[str, float] | None) -> None:
    if free_devices is None:
        return
    if not isinstance(free_devices, Mapping):
        raise DataError(f"free_devices must map hardware names to device counts, got "
                        f"{free_devices!r}")
    for name, n in free_devices.items():
        if not isinstance(n, int | float | np.integer | np.floating) or isinstance(n, bool) \
                or not n >= 0:
            raise DataError(f"free_devices['{name}'] must be a number >= 0, got {n!r}")


def fold_availability(ranking: Sequence[RankedType], free_devices: Mapping[str, float]
                      ) -> list[RankedType]:
    """Types without room for the job after those with room (each part keeps its order).

    A type with fewer free devices than the job's ``devices`` gets the flag
    ``no_free_devices``; its value is unchanged (it is what the job would get once it runs),
    but a job sent there would wait, so advice that knows the fleet is finite offers the
    types with room first instead of herding every job onto the same best type.

    Examples
    --------
    >>> r = [RankedType("A40", 10.0, 1.0, 9.0, None, None, 4, 0.25, False),
    ...      RankedType("L4", 5.0, 1.0, 5.0, None, None, 4, 0.25, False)]
    >>> [(x.hardware, x.flags) for x in fold_availability(r, {"A40": 2.0})]
    [('L4', ()), ('A40', ('no_free_devices',))]
    """
    room = [r for r in ranking if free_devices.get(r.hardware, math.inf) >= r.devices]
    full = [dataclasses.replace(r, flags=(*r.flags, "no_free_devices")) for r in ranking
            if not free_devices.get(r.hardware, math.inf) >= r.devices]
    return room + full


def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if isinstance(exc, LeapError) else f"{type(exc).__name__}: {text}"


#: Called with ``(job, candidates, result)`` after every ranking a Ranker serves, when set as
#: :attr:`Ranker.decision_sink` (e.g. :meth:`leap.rank.decisions.DecisionLog.sink`). It must
#: be cheap and never block: it runs on the caller's thread, after the answer is computed.
DecisionSink = Callable[[Mapping[str, Any], "Sequence[str] | None", "RankResult"], None]


def _recorded(rank: Callable[..., RankResult]) -> Callable[..., RankResult]:
    """Hand every answer of ``rank`` to the Ranker's decision sink (a failing sink is logged,
    never raised: recording must not change or block an answer)."""

    @functools.wraps(rank)
    def wrapper(self: Ranker, job: Mapping[str, Any], candidates: Sequence[str] | None = None,
                **kwargs: Any) -> RankResult:
        result = rank(self, job, candidates, **kwargs)
        sink = self.decision_sink
        if sink is not None:
            try:
                sink(job, candidates, result)
            except Exception:  # a recording bug must not fail the launch it records
                log.exception("decision sink failed")
        return result

    return wrapper


class _Static:
    """A fixed artifact in place of a watcher (no reload)."""

    def __init__(self, artifact: Artifact) -> None:
        self._serving = Serving.prepare(artifact)
        self.error: str | None = None
        self.reloads = 1
        self.reload_failures = 0
        self.refused_version: str | None = None
        self.refused_reason: str | None = None

    def current(self) -> Serving | None:
        return self._serving

    def refresh(self) -> bool:
        return False

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        return None


# The ranker -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Price:
    hw: Hardware
    min_utilization: float
    min_speedup: float


def _premium_rule(price: _Price, mfu: float | None, speedup: float | None
                  ) -> tuple[str, str | None]:
    """``(flag, None)`` when the premium rule keeps the type, else ``("", why)``."""
    n = price.hw.name
    if mfu is not None:
        if mfu < price.min_utilization:
            return "", (f"predicted MFU {mfu:.3f} < min_utilization {price.min_utilization:g} "
                        f"of premium '{n}'")
        return "premium_kept_mfu", None
    if speedup is None or speedup < price.min_speedup:
        got = "no non-premium type to compare with" if speedup is None else \
            f"speed-up {speedup:.2f}x"
        return "", (f"no flops_per_sample for MFU, and {got} < {price.min_speedup:g}x needed "
                    f"by premium '{n}'")
    return "premium_kept_speedup", None


class Ranker:
    """Rank the eligible accelerator types of a job by value, failing open.

    Parameters
    ----------
    source : Registry, Artifact, Path or str
        A :class:`~leap.model.artifact.Registry` (or its ``models_dir``): the latest
        published model, reloaded when ``LATEST`` changes. An :class:`Artifact`: that model.
    costs : Catalog, optional
        The user's catalog for prices, premium flags and ``min_utilization`` thresholds;
        default the artifact's catalog snapshot. Default candidates are its types.
    min_utilization : mapping, optional
        Per-type MFU thresholds for premium types, overriding the catalog.
    premium_min_speedup : float
        Speed-up over the fastest non-premium type a premium type needs when the job has no
        ``flops_per_sample``.
    min_speedup : mapping, optional
        Per-type overrides of ``premium_min_speedup``.
    check_interval_s : float
        How often (at most) to look for a newly published model.
    background_reload : bool
        Load a new model in a background thread (requests keep the old one meanwhile).
    version : str, optional
        Serve this published version of the Registry (a name, never a path) instead of
        following ``LATEST``. One that fails verification fails open (``no_model``).

    Examples
    --------
    >>> # ranker = Ranker(Registry(ws.models_dir), costs=Catalog.load(my_catalog_toml))
    >>> # result = ranker.rank({"family_id": "f1", "model_type": "resnet50",
    >>> #                       "trainer_count": 2, "batch_size": 256})
    >>> # [(r.hardware, round(r.value)) for r in result.ranking[:3]]
    """

    #: Receives every answer of :meth:`rank` (see :data:`DecisionSink`); None records nothing.
    decision_sink: DecisionSink | None = None

    def __init__(self, source: Registry | Artifact | Path | str, *, costs: Catalog | None = None,
                 min_utilization: Mapping[str, float] | None = None,
                 premium_min_speedup: float = DEFAULT_PREMIUM_MIN_SPEEDUP,
                 min_speedup: Mapping[str, float] | None = None, check_interval_s: float = 1.0,
                 background_reload: bool = True, version: str | None = None) -> None:
        if isinstance(source, Path | str):
            source = Registry(Path(source))
        self.watcher: ModelWatcher | _Static
        if isinstance(source, Artifact):
            if version is not None:
                raise ConfigError("version= selects a version of a Registry; an Artifact is "
                                  "already one version")
            self.watcher = _Static(source)
        else:
            if version is not None:
                source.path(version)  # a name in the models folder, or a clear error
            self.watcher = ModelWatcher(source, check_interval_s=check_interval_s,
                                        background=background_reload, pin=version)
            self.watcher.refresh()
        self._configure(costs, min_utilization, premium_min_speedup, min_speedup)
        self._counts_lock = threading.Lock()
        self.fail_open_counts: dict[str, int] = dict.fromkeys(FAIL_OPEN_CODES, 0)

    def _configure(self, costs: Catalog | None, min_utilization: Mapping[str, float] | None,
                   premium_min_speedup: float, min_speedup: Mapping[str, float] | None) -> None:
        if not (math.isfinite(premium_min_speedup) and premium_min_speedup > 0):
            raise ConfigError(f"premium_min_speedup must be a positive number, got "
                              f"{premium_min_speedup!r}")
        if costs is not None:
            free = [h.name for h in costs.values() if h.cost_per_device_hour <= 0]
            if free:
                raise CatalogError(f"cost catalog: cost_per_device_hour is 0 for {free}; value "
                                   "is samples per unit cost, so set a positive price (or "
                                   "enabled = false to drop the type)")
        serving = self.watcher.current()
        known = costs if costs is not None else serving.artifact.catalog if serving else None
        for label, table in (("min_utilization", min_utilization), ("min_speedup", min_speedup)):
            for name, v in (table or {}).items():
                if known is not None and name not in known:
                    raise CatalogError(f"{label}: unknown hardware '{name}'"
                                       f"{did_you_mean(name, known)}")
                number = isinstance(v, int | float) and not isinstance(v, bool)
                if label == "min_utilization" and not (number and 0.0 <= v <= 1.0):
                    raise ConfigError(f"min_utilization['{name}'] must be within [0, 1] (a "
                                      f"share of peak FLOP/s), got {v!r}")
                if label == "min_speedup" and not (number and 0.0 < v < math.inf):
                    raise ConfigError(f"min_speedup['{name}'] must be a positive number, got "
                                      f"{v!r}")
        self.costs = costs
        self.min_utilization = dict(min_utilization or {})
        self.premium_min_speedup = float(premium_min_speedup)
        self.min_speedup = dict(min_speedup or {})

    def with_options(self, **changes: Any) -> Ranker:
        """A Ranker on the same model (and reload) with other prices or thresholds.

        Accepts ``costs``, ``min_utilization``, ``premium_min_speedup`` and ``min_speedup``
        (see the class); the rest is kept.

        Examples
        --------
        >>> # mine = ranker.with_options(costs=Catalog.load(Path("my_prices.toml")))
        """
        opts: dict[str, Any] = {"costs": self.costs, "min_utilization": self.min_utilization,
                                "premium_min_speedup": self.premium_min_speedup,
                                "min_speedup": self.min_speedup}
        for key in changes:
            if key not in opts:
                raise ConfigError(f"unknown Ranker option '{key}'{did_you_mean(key, opts)}; "
                                  f"options: {', '.join(opts)}")
        opts.update(changes)
        other = object.__new__(Ranker)
        other.watcher = self.watcher
        other._configure(opts["costs"], opts["min_utilization"], opts["premium_min_speedup"],
                         opts["min_speedup"])
        other._counts_lock = threading.Lock()
        other.decision_sink = self.decision_sink
        other.fail_open_counts = dict.fromkeys(FAIL_OPEN_CODES, 0)
        return other

    # Model state -------------------------------------------------------------------------
    @property
    def serving(self) -> Serving | None:
        """The model in use now (``None`` when none could be loaded)."""
        return self.watcher.current()

    @property
    def model_version(self) -> str | None:
        s = self.watcher.current()
        return s.version if s else None

    def refresh(self) -> bool:
        """Look for a newly published model now; True when one was swapped in."""
        return self.watcher.refresh()

    def model_info(self) -> dict[str, Any]:
        """Version, training window, metrics and catalog of the serving model."""
        s = self.watcher.current()
        info: dict[str, Any] = {"version": None, "reason": None, "reloads": self.watcher.reloads,
                                "reload_failures": self.watcher.reload_failures,
                                "reload_error": self.watcher.error,
                                "refused_version": self.watcher.refused_version,
                                "refused_reason": self.watcher.refused_reason}
        if s is None:
            info["reason"] = f"no_model: {self.watcher.error or 'no model loaded'}"
            return info
        m = s.artifact.manifest
        info.update({
            "version": s.version, "as_of": m.get("as_of"), "window_start": m.get("window_start"),
            "window_end": m.get("window_end"), "window_days": m.get("window_days"),
            "model_kind": m.get("model_kind"), "created_at": m.get("created_at"),
            "loaded_at": s.loaded_at.isoformat(), "metrics": m.get("metrics", {}),
            "catalog_fingerprint": m.get("catalog_fingerprint"),
            "hardware": list(s.artifact.catalog)})
        return info

    def record_fail_open(self, code: str, detail: str) -> str:
        """Count a fail-open answer under ``code`` and return its reason text."""
        with self._counts_lock:
            self.fail_open_counts[code] = self.fail_open_counts.get(code, 0) + 1
        return f"{code}: {detail}"

    # Ranking -----------------------------------------------------------------------------
    @_recorded
    def rank(self, job: Mapping[str, Any], candidates: Sequence[str] | None = None, *,
             objective: str = "value", max_cost_per_hour: float | None = None,
             risk: str = DEFAULT_RISK, strict: bool = False,
             free_devices: Mapping[str, float] | None = None) -> RankResult:
        """The preference list of ``candidates`` (default: every type) for ``job``.

        Parameters
        ----------
        job : mapping
            Launch-time fields (see :data:`~leap.data.schema.JOB_COLUMNS`); ``family_id``,
            ``model_type``, ``trainer_count`` and ``batch_size`` are required. Outcome and
            unknown fields are ignored (listed in ``ignored_fields``).
        candidates : sequence of str, optional
            Eligible types (duplicates are dropped); default every type of the cost catalog.
        objective : {"value", "throughput"}
            Sort by samples per unit cost, or by predicted samples/s.
        max_cost_per_hour : float, optional
            Budget: types whose ``cost_per_hour`` exceeds it are excluded (``over_budget``).
        risk : {"neutral", "cautious", "averse"}
            ``neutral`` orders by the median prediction; ``cautious`` (default) keeps the
            cheapest type first unless a dearer one is confidently better
            (:func:`order_ranking`);
            ``averse`` orders by the lower bound of each type's 80% interval (a type the
            family never ran on must be better even if it turns out near the low end).
        strict : bool
            Raise on a bad request (wrong field type, unknown hardware) instead of failing
            open. Failures of the model always fail open.
        free_devices : mapping of str to float, optional
            Devices of each type free for this job now (e.g. the scheduler's room). A type
            with fewer free devices than the job needs stays in the list, flagged
            ``no_free_devices``, after every type that has room (see
            :func:`fold_availability`). Types not named are taken to have room.

        Returns
        -------
        RankResult
            Never raises unless ``strict`` and the request is bad.

        Examples
        --------
        >>> # r = ranker.rank({"family_id": "f1", "model_type": "bert-base",
        >>> #                  "trainer_count": 1, "batch_size": 32}, ["H100-SXM", "L4"])
        >>> # r.ranking[0].hardware, r.reason
        """
        t0 = time.perf_counter()
        serving: Serving | None = None
        try:
            serving = self.watcher.current()
        except Exception as exc:  # fail-open (see below)
            log.exception("model watcher failed")
            return self._empty(t0, None, objective,
                               self.record_fail_open("prediction_failed", _describe(exc)))
        version = serving.version if serving else None
        try:
            values, ignored = normalize_job(job)
            names, unknown = self._candidates(serving, candidates, strict)
            _check_objective(objective, max_cost_per_hour)
            if risk not in RISKS:
                raise ConfigError(f"risk must be one of {', '.join(RISKS)}, got {risk!r}"
                                  f"{did_you_mean(str(risk), RISKS)}")
            _check_free_devices(free_devices)
        except Exception as exc:  # a bad request fails open; only `strict` raises it
            err = exc if isinstance(exc, LeapError) else DataError(
                f"invalid request: {_describe(exc)}")
            if strict:
                raise err from None
            return self._empty(t0, version, objective if isinstance(objective, str) else
                               "value", self.record_fail_open("invalid_request", str(err)))
        if serving is None:
            return self._empty(t0, None, objective, self.record_fail_open(
                "no_model", self.watcher.error or "no model loaded"))
        try:
            ranking, excluded = self._rank(serving, values, names, objective, max_cost_per_hour,
                                           risk)
            if free_devices is not None:
                ranking = fold_availability(ranking, free_devices)
        except Exception as exc:  # fail-open: a bug, a corrupt model or a NaN must never
            # block a launch; it is counted (fail_open_counts) and logged with its trace.
            log.exception("rank failed open")
            return self._empty(t0, version, objective,
                               self.record_fail_open("prediction_failed", _describe(exc)))
        excluded = sorted(unknown + excluded,
                          key=lambda e: (EXCLUSION_REASONS.index(e.reason), e.hardware))
        # An empty answer always says why: every candidate was left out (see `excluded`).
        reason = None if ranking else (
            f"no_eligible_type: all {len(excluded)} candidate(s) were left out ("
            + ", ".join(sorted({e.reason for e in excluded})) + "); see excluded")
        return RankResult(ranking=ranking, excluded=excluded, model_version=version,
                          reason=reason, objective=objective,
                          latency_ms=(time.perf_counter() - t0) * 1e3, ignored_fields=ignored,
                          risk=risk)

    def _empty(self, t0: float, version: str | None, objective: str, reason: str) -> RankResult:
        return RankResult(ranking=[], excluded=[], model_version=version, reason=reason,
                          objective=objective, latency_ms=(time.perf_counter() - t0) * 1e3)

    def check_candidates(self, candidates: Sequence[str] | None) -> list[str]:
        """Validate names against the cost and model catalogs (raises with a suggestion).

        Examples
        --------
        >>> # ranker.check_candidates(["H10O"])  # CatalogError: ... did you mean 'H100-SXM'?
        """
        names, _ = self._candidates(self.watcher.current(), candidates, strict=True)
        return names

    def _cost_catalog(self, serving: Serving | None) -> Catalog | None:
        return self.costs if self.costs is not None else (
            serving.artifact.catalog if serving else None)

    def _candidates(self, serving: Serving | None, candidates: Sequence[str] | None,
                    strict: bool) -> tuple[list[str], list[Excluded]]:
        costs = self._cost_catalog(serving)
        if candidates is None:
            return (list(costs) if costs is not None else []), []
        if isinstance(candidates, str) or not all(isinstance(c, str) for c in candidates):
            raise DataError("candidates must be a list of hardware names, got "
                            f"{candidates!r}")
        if len(candidates) == 0:
            raise DataError("candidates is empty; omit it to rank every catalog type")
        names = list(dict.fromkeys(candidates))
        if costs is None:
            return names, []
        # An ordered list (not a set): the did-you-mean suggestion must be deterministic.
        known = list(dict.fromkeys([*costs, *(serving.artifact.catalog if serving else [])]))
        out: list[str] = []
        unknown: list[Excluded] = []
        for n in names:
            if n in known:
                out.append(n)
                continue
            msg = f"unknown hardware '{n}'{did_you_mean(n, known)}"
            if strict:
                raise CatalogError(f"candidates: {msg}")
            unknown.append(Excluded(n, "unknown_hardware", msg))
        return out, unknown

    def keeps_premium(self, name: str, *, utilization: float | None,
                      speedup: float | None) -> bool:
        """Whether the premium rule keeps type ``name`` at this MFU / speed-up (True when
        the type is not premium). The ranking study applies it to the true figures."""
        costs = self._cost_catalog(self.serving)
        assert costs is not None
        price = self._price(costs, name)
        return not price.hw.premium or _premium_rule(price, utilization, speedup)[1] is None

    def _price(self, costs: Catalog, name: str) -> _Price:
        hw = costs[name]
        return _Price(hw, self.min_utilization.get(name, hw.min_utilization),
                      self.min_speedup.get(name, self.premium_min_speedup))

    def _rank(self, serving: Serving, job: dict[str, Any], names: list[str], objective: str,
              budget: float | None, risk: str = DEFAULT_RISK
              ) -> tuple[list[RankedType], list[Excluded]]:
        art = serving.artifact
        costs = self._cost_catalog(serving)
        assert costs is not None
        model_cat = art.catalog
        excluded: list[Excluded] = []
        dpt = job["devices_per_trainer"] or 1
        devices = int(job["trainer_count"]) * int(dpt)
        prices: dict[str, _Price] = {}
        runnable: list[str] = []
        for n in names:
            if n not in model_cat or n not in costs:
                where = "the model's catalog (retrain to include it)" if n not in model_cat \
                    else "the cost catalog (add its price)"
                excluded.append(Excluded(n, "unknown_hardware", f"'{n}' is not in {where}"))
                continue
            price = self._price(costs, n)
            if not price.hw.cost_per_device_hour > 0:
                excluded.append(Excluded(n, "invalid_cost", f"cost_per_device_hour of '{n}' is "
                                         f"{price.hw.cost_per_device_hour!r} in the catalog; "
                                         "set a positive price"))
                continue
            if dpt > model_cat[n].devices_per_host:
                excluded.append(Excluded(n, "does_not_fit_host", f"{dpt} devices per trainer "
                                         f"but '{n}' has {model_cat[n].devices_per_host} per "
                                         "host"))
                continue
            prices[n] = price
            runnable.append(n)

        flops = job["flops_per_sample"]
        mfu_rule = flops is not None and flops > 0
        # Without FLOPs, premium types are judged by speed-up over the fastest non-premium
        # type; when no such candidate is left, the model catalog's standard types stand in.
        need_ref = not mfu_rule and any(prices[n].hw.premium for n in runnable) and not any(
            not prices[n].hw.premium for n in runnable)
        refs = [n for n in model_cat if n not in prices and n in costs
                and not costs[n].premium and dpt <= model_cat[n].devices_per_host] \
            if need_ref else []
        rows = runnable + refs
        X = serving.encode(job, rows)
        mem_fit = X[:, _COL_MEM_FIT]
        fam_hw_n = X[:, _COL_FAM_HW_N]
        proven = serving.family_min_memory_gb.get(str(job["family_id"]), math.inf)
        fits = ~(mem_fit > 1.0) | (serving.specs["memory_gb"][[serving.pos[r] for r in rows]]
                                   >= proven)
        log_tp, log_lo, log_hi, fit_group = serving.artifact.predict_encoded(X[fits])
        bad = ~np.isfinite(log_tp)
        if bad.any():
            which = [r for r, f in zip(rows, fits, strict=True) if f]
            raise FloatingPointError(f"non-finite prediction for "
                                     f"{[which[i] for i in np.flatnonzero(bad)]}")
        tp = np.full(len(rows), np.nan)
        lo, hi = tp.copy(), tp.copy()
        with np.errstate(over="ignore"):
            tp[fits] = np.exp(log_tp)
            lo[fits], hi[fits] = np.exp(log_lo), np.exp(log_hi)
        group = np.full(len(rows), -1)
        group[fits] = fit_group
        if not np.all(np.isfinite(tp[fits] * 3600.0)):
            raise FloatingPointError("predicted throughput overflows")
        no_family = not np.isfinite(X[0, _COL_FAM_N]) if len(rows) else True
        # Plain Python lists: the loop below reads one value at a time, and NumPy scalar
        # access costs far more per read.
        peak = serving.peak_flops(job["precision"], rows).tolist()
        mem_fit, fam_hw_n = mem_fit.tolist(), fam_hw_n.tolist()
        tp_, fits_ = tp.tolist(), fits.tolist()
        lo_, hi_, group_ = lo.tolist(), hi.tolist(), group.tolist()
        standard = [tp_[i] for i, r in enumerate(rows) if fits_[i] and not costs[r].premium]
        best_standard = max(standard) if standard else None

        ranking: list[RankedType] = []
        for i, n in enumerate(runnable):
            if not fits_[i]:
                excluded.append(Excluded(n, "does_not_fit_memory", f"needs about "
                                         f"{mem_fit[i]:.2f}x the device memory of '{n}' "
                                         f"({model_cat[n].memory_gb:g} GB) and the family has "
                                         "never succeeded on a type with that much memory"))
                continue
            price = prices[n]
            flags: list[str] = []
            if no_family:
                flags.append("missing_family_history")
            if not math.isfinite(fam_hw_n[i]):
                flags.append("missing_hardware_history")
            if not math.isfinite(mem_fit[i]):
                flags.append("memory_fit_unknown")
            interval = math.isfinite(lo_[i]) and math.isfinite(hi_[i])
            if interval and hi_[i] > UNCERTAIN_RATIO * lo_[i]:
                flags.append("uncertain")
            mfu = tp_[i] * flops / (devices * peak[i]) if mfu_rule else None
            if mfu is not None and not mfu <= 1.0:
                flags.append("utilization_above_peak")
            speedup = tp_[i] / best_standard if best_standard else None
            if price.hw.premium:
                kept, why = _premium_rule(price, mfu, speedup)
                if why is not None:
                    excluded.append(Excluded(n, "premium_below_threshold", why))
                    continue
                flags.append(kept)
            cost_h = devices * price.hw.cost_per_device_hour
            if budget is not None and cost_h > budget:
                excluded.append(Excluded(n, "over_budget", f"cost_per_hour {cost_h:.2f} > "
                                         f"max_cost_per_hour {budget:g}"))
                continue
            ranking.append(RankedType(
                hardware=n, predicted_throughput=tp_[i], cost_per_hour=float(cost_h),
                value=tp_[i] * 3600.0 / cost_h,
                predicted_utilization=mfu if mfu is None or math.isfinite(mfu) else None,
                speedup=speedup if speedup is None or math.isfinite(speedup) else None,
                devices=devices,
                cost_per_device_hour=float(price.hw.cost_per_device_hour),
                premium=price.hw.premium, flags=tuple(flags),
                throughput_p10=lo_[i] if interval else None,
                throughput_p90=hi_[i] if interval else None,
                novelty=NOVELTY_GROUPS[group_[i]]))
        return order_ranking(ranking, objective, risk), excluded

    # Batch prediction ------------------------------------------------------------------------
    def predict(self, jobs: pd.DataFrame | Sequence[Mapping[str, Any]],
                candidates: Sequence[str] | None = None, *, strict: bool = False
                ) -> PredictResult:
        """Predicted samples/s for each (job, hardware) row, failing open like :meth:`rank`.

        Rows with a ``hardware`` value are scored on it; the others on every candidate
        (default: the model's whole catalog). See :func:`leap.model.predict.predict_frame`.

        Examples
        --------
        >>> # ranker.predict([{"family_id": "f1", "model_type": "m", "trainer_count": 1,
        >>> #                  "batch_size": 8}], ["H100-SXM"]).frame
        """
        from leap.model.predict import predict_frame

        t0 = time.perf_counter()
        serving = self.watcher.current()
        version = serving.version if serving else None

        def empty(reason: str) -> PredictResult:
            return PredictResult(pd.DataFrame(), version, reason,
                                 (time.perf_counter() - t0) * 1e3)
        try:
            if isinstance(jobs, pd.DataFrame):
                frame = check_jobs_frame(jobs)
            else:
                records = list(jobs)
                for i, rec in enumerate(records):
                    try:
                        records[i] = expand_model_config(rec)
                        check_job(records[i])
                    except DataError as exc:
                        raise DataError(f"jobs row {i}: {exc}") from None
                frame = jobs_frame(records)
            if serving is None:
                if strict and candidates is not None:
                    self._candidates(None, candidates, strict=True)
                return empty(self.record_fail_open("no_model",
                                                   self.watcher.error or "no model loaded"))
            cat = serving.artifact.catalog
            names = cat.resolve(list(candidates) if candidates is not None else None)
            if "hardware" in frame.columns:
                for hw in frame["hardware"].dropna().unique():
                    if str(hw) not in cat:
                        raise CatalogError(f"jobs: unknown hardware '{hw}'"
                                           f"{did_you_mean(str(hw), cat)}")
            missing = [c for c in _REQUIRED_JOB if c not in frame.columns]
            if missing:
                raise DataError(f"jobs lack required field(s) {', '.join(missing)}")
        except Exception as exc:  # a bad request fails open; only `strict` raises it
            err = exc if isinstance(exc, LeapError) else DataError(
                f"invalid request: {_describe(exc)}")
            if strict:
                raise err from None
            return empty(self.record_fail_open("invalid_request", str(err)))
        try:
            out = predict_frame(serving.artifact, frame, names)
            bad = ~np.isfinite(out["predicted_throughput"].to_numpy(dtype=np.float64))
            if bad.any():
                raise FloatingPointError(f"{int(bad.sum())} non-finite predictions")
        except Exception as exc:  # fail-open, counted and logged (see rank)
            log.exception("predict failed open")
            return empty(self.record_fail_open("prediction_failed", _describe(exc)))
        return PredictResult(out, version, None, (time.perf_counter() - t0) * 1e3)

