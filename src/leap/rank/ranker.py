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

The policy (the premium rule, every exclusion and flag, the objectives and the risk rules)
is :mod:`leap.rank.policy`'s.

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

import copy
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap.catalog import Catalog
from leap.errors import CatalogError, ConfigError, DataError, LeapError, did_you_mean
from leap.features.pair_rows import native_kernels
from leap.features.transfer import transfer_kernels
from leap.model.artifact import Artifact, Registry
from leap.rank.policy import (
    DEFAULT_PREMIUM_MIN_SPEEDUP,
    _premium_rule,
    _Price,
    fold_availability,
    rank_rows,
    rank_rows_many,
)
from leap.rank.requests import (
    _check_free_devices,
    _check_objective,
    check_jobs_for,
    jobs_request,
    normalize_job,
    resolve_candidates,
)
from leap.rank.results import (
    DEFAULT_RISK,
    EXCLUSION_REASONS,
    FAIL_OPEN_CODES,
    RISKS,
    Excluded,
    PredictResult,
    RankedType,
    RankResult,
)
from leap.rank.serving import ModelWatcher, Serving, _describe, _Static

log = logging.getLogger("leap.rank")

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
        self._record(job, candidates, result)
        return result

    return wrapper


def _request_error(exc: Exception) -> LeapError:
    """A bad request's error as :meth:`Ranker.rank` raises it with ``strict``."""
    return exc if isinstance(exc, LeapError) else DataError(f"invalid request: {_describe(exc)}")


def _answer(ranking: list[RankedType], excluded: list[Excluded], version: str | None,
            objective: str, risk: str, ignored: list[str], latency_ms: float) -> RankResult:
    """A ranking's answer: the left-out types in reason order, and why it is empty if so."""
    excluded = sorted(excluded, key=lambda e: (EXCLUSION_REASONS.index(e.reason), e.hardware))
    # An empty answer always says why: every candidate was left out (see `excluded`).
    reason = None if ranking else (
        f"no_eligible_type: all {len(excluded)} candidate(s) were left out ("
        + ", ".join(sorted({e.reason for e in excluded})) + "); see excluded")
    return RankResult(ranking=ranking, excluded=excluded, model_version=version,
                      reason=reason, objective=objective, latency_ms=latency_ms,
                      ignored_fields=ignored, risk=risk)


# The ranker -----------------------------------------------------------------------------------
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
    compiled : bool, optional
        Score with compiled trees (:mod:`leap.model.compiled`, the ``fast`` extra): ``True``
        compiles each model version once (in the background; cached beside the artifact),
        ``None`` (default) uses a compiled model only when one is cached already, ``False``
        never. Compiled code is used only when it reproduces LightGBM on the probe rows
        within 1e-9; predictions and rankings are the same either way.

    Examples
    --------
    Not run here (it needs a workspace)::

        ranker = Ranker(Registry(ws.models_dir), costs=Catalog.load(my_catalog_toml))
        result = ranker.rank({"family_id": "f1", "model_type": "resnet50",
                              "trainer_count": 2, "batch_size": 256})
        [(r.hardware, round(r.value)) for r in result.ranking[:3]]
    """

    #: Receives every answer of :meth:`rank` (see :data:`DecisionSink`); None records nothing.
    decision_sink: DecisionSink | None = None

    def __init__(self, source: Registry | Artifact | Path | str, *, costs: Catalog | None = None,
                 min_utilization: Mapping[str, float] | None = None,
                 premium_min_speedup: float = DEFAULT_PREMIUM_MIN_SPEEDUP,
                 min_speedup: Mapping[str, float] | None = None, check_interval_s: float = 1.0,
                 background_reload: bool = True, version: str | None = None,
                 compiled: bool | None = None) -> None:
        if isinstance(source, Path | str):
            source = Registry(Path(source))
        self.watcher: ModelWatcher | _Static
        prepare = functools.partial(Serving.prepare, compiled=compiled)
        if isinstance(source, Artifact):
            if version is not None:
                raise ConfigError("version= selects a version of a Registry; an Artifact is "
                                  "already one version")
            self.watcher = _Static(source, prepare)
        else:
            if version is not None:
                source.path(version)  # a name in the models folder, or a clear error
            self.watcher = ModelWatcher(source, check_interval_s=check_interval_s,
                                        background=background_reload, pin=version,
                                        prepare=prepare)
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
        Not run here (it needs a workspace)::

            mine = ranker.with_options(costs=Catalog.load(Path("my_prices.toml")))
        """
        opts: dict[str, Any] = {"costs": self.costs, "min_utilization": self.min_utilization,
                                "premium_min_speedup": self.premium_min_speedup,
                                "min_speedup": self.min_speedup}
        for key in changes:
            if key not in opts:
                raise ConfigError(f"unknown Ranker option '{key}'{did_you_mean(key, opts)}; "
                                  f"options: {', '.join(opts)}")
        opts.update(changes)
        # A shallow copy shares the watcher (model and reload) and the decision sink; the
        # options and the fail-open counts are its own.
        other = copy.copy(self)
        other._configure(opts["costs"], opts["min_utilization"], opts["premium_min_speedup"],
                         opts["min_speedup"])
        other._counts_lock = threading.Lock()
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
            "scoring": s.artifact.extra.get("scoring", "lightgbm"),
            "pair_rows": "compiled" if native_kernels() is not None else "numpy",
            "transfer_features": "compiled" if transfer_kernels() is not None else "numpy",
            "catalog_fingerprint": m.get("catalog_fingerprint"),
            "hardware": list(s.artifact.catalog)})
        return info

    def _record(self, job: Mapping[str, Any], candidates: Sequence[str] | None,
                result: RankResult) -> None:
        """Hand an answer to the decision sink (a failing sink is logged, never raised)."""
        sink = self.decision_sink
        if sink is not None:
            try:
                sink(job, candidates, result)
            except Exception:  # a recording bug must not fail the launch it records
                log.exception("decision sink failed")

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
        Not run here (it needs a workspace)::

            r = ranker.rank({"family_id": "f1", "model_type": "bert-base",
                             "trainer_count": 1, "batch_size": 32}, ["H100-SXM", "L4"])
            r.ranking[0].hardware, r.reason
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
            values, ignored, names, unknown = self._request(
                serving, job, candidates, objective, max_cost_per_hour, risk, free_devices,
                strict)
        except Exception as exc:  # a bad request fails open; only `strict` raises it
            err = _request_error(exc)
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
        return _answer(ranking, unknown + excluded, version, objective, risk, ignored,
                       (time.perf_counter() - t0) * 1e3)

    def _request(self, serving: Serving | None, job: Mapping[str, Any],
                 candidates: Sequence[str] | None, objective: str,
                 max_cost_per_hour: float | None, risk: str,
                 free_devices: Mapping[str, float] | None, strict: bool
                 ) -> tuple[dict[str, Any], list[str], list[str], list[Excluded]]:
        """The one validation of a ranking request: the job's values and ignored fields, the
        candidate names and the unknown ones (raises on a bad request)."""
        values, ignored = normalize_job(job)
        names, unknown = self._candidates(serving, candidates, strict)
        _check_objective(objective, max_cost_per_hour)
        if risk not in RISKS:
            raise ConfigError(f"risk must be one of {', '.join(RISKS)}, got {risk!r}"
                              f"{did_you_mean(str(risk), RISKS)}")
        _check_free_devices(free_devices)
        return values, ignored, names, unknown

    def check_request(self, job: Mapping[str, Any], candidates: Sequence[str] | None = None,
                      *, objective: str = "value", max_cost_per_hour: float | None = None,
                      risk: str = DEFAULT_RISK,
                      free_devices: Mapping[str, float] | None = None) -> None:
        """Raise what :meth:`rank` with ``strict=True`` raises for this request (nothing for a
        good one): for a caller that ranks requests together (:meth:`rank_many`) and must
        refuse a bad one alone, as the HTTP service does."""
        try:
            serving = self.watcher.current()
        except Exception:  # rank() fails open on it; the request itself may still be bad
            serving = None
        try:
            self._request(serving, job, candidates, objective, max_cost_per_hour, risk,
                          free_devices, True)
        except Exception as exc:
            raise _request_error(exc) from None

    def rank_many(self, jobs: Sequence[Mapping[str, Any]],
                  candidates: Sequence[Sequence[str] | None], *, objective: str = "value",
                  max_cost_per_hour: float | None = None, risk: str = DEFAULT_RISK,
                  free_devices: Sequence[Mapping[str, float] | None] | None = None
                  ) -> list[RankResult]:
        """:meth:`rank` of each job on its candidates (and its ``free_devices``, one mapping
        or None per job, when given): the same answers, with one feature encoding and one
        model call for the rows of all of them (for studies, batch callers and the HTTP
        service's concurrent requests; a few hundred jobs at a time keep the rows a few
        megabytes).

        A request that :meth:`rank` would refuse gets its fail-open answer, counted as
        there; if scoring the batch fails, every job is ranked on its own, so one bad job
        fails open alone. ``latency_ms`` of a batch answer is its share of the batch's time.
        Each answer goes to the decision sink, as from :meth:`rank`.

        Examples
        --------
        Not run here (it needs a workspace)::

            answers = ranker.rank_many([job_a, job_b], [["H100-SXM", "L4"], None])
        """
        if len(candidates) != len(jobs):
            raise ConfigError(f"rank_many got {len(candidates)} candidate lists for "
                              f"{len(jobs)} jobs; pass one list (or None) per job")
        if free_devices is not None and len(free_devices) != len(jobs):
            raise ConfigError(f"rank_many got {len(free_devices)} free_devices for "
                              f"{len(jobs)} jobs; pass one mapping (or None) per job")
        free = list(free_devices) if free_devices is not None else [None] * len(jobs)
        t0 = time.perf_counter()

        def alone(i: int) -> RankResult:
            return self.rank(jobs[i], candidates[i], objective=objective,
                             max_cost_per_hour=max_cost_per_hour, risk=risk,
                             free_devices=free[i])
        try:
            serving = self.watcher.current()
            _check_objective(objective, max_cost_per_hour)
        except Exception:  # rank() answers each with its own fail-open reason
            serving = None
        if serving is None or risk not in RISKS:
            return [alone(i) for i in range(len(jobs))]
        answers: dict[int, RankResult] = {}
        batch: list[tuple[int, dict[str, Any], list[str], list[Excluded], list[str]]] = []
        for i, (job, cands) in enumerate(zip(jobs, candidates, strict=True)):
            try:
                values, ignored, names, unknown = self._request(
                    serving, job, cands, objective, max_cost_per_hour, risk, free[i], False)
            except Exception:  # refused as rank() refuses it: its fail-open answer
                answers[i] = alone(i)
                continue
            batch.append((i, values, names, unknown, ignored))
        if not batch:
            return [answers[i] for i in range(len(jobs))]
        costs = self._cost_catalog(serving)
        assert costs is not None
        try:
            parts = rank_rows_many(serving, [b[1] for b in batch], [b[2] for b in batch], costs,
                                   lambda n: self._price(costs, n), objective,
                                   max_cost_per_hour, risk)
        except Exception:  # one job's failure must fail that job alone, as in rank()
            log.warning("batch ranking failed; ranking its jobs one by one", exc_info=True)
            answers.update((b[0], alone(b[0])) for b in batch)
            return [answers[i] for i in range(len(jobs))]
        share_ms = (time.perf_counter() - t0) * 1e3 / len(batch)
        for (i, _, _, unknown, ignored), (ranking, excluded) in zip(batch, parts, strict=True):
            if (room := free[i]) is not None:
                ranking = fold_availability(ranking, room)
            answers[i] = _answer(ranking, unknown + excluded, serving.version, objective, risk,
                                 ignored, share_ms)
            self._record(jobs[i], candidates[i], answers[i])
        return [answers[i] for i in range(len(jobs))]

    def _empty(self, t0: float, version: str | None, objective: str, reason: str) -> RankResult:
        return RankResult(ranking=[], excluded=[], model_version=version, reason=reason,
                          objective=objective, latency_ms=(time.perf_counter() - t0) * 1e3)

    def check_candidates(self, candidates: Sequence[str] | None) -> list[str]:
        """Validate names against the cost and model catalogs (raises with a suggestion).

        Examples
        --------
        Not run here (it needs a workspace)::

            ranker.check_candidates(["H10O"])  # CatalogError: ... did you mean 'H100-SXM'?
        """
        names, _ = self._candidates(self.watcher.current(), candidates, strict=True)
        return names

    def _cost_catalog(self, serving: Serving | None) -> Catalog | None:
        return self.costs if self.costs is not None else (
            serving.artifact.catalog if serving else None)

    def _candidates(self, serving: Serving | None, candidates: Sequence[str] | None,
                    strict: bool) -> tuple[list[str], list[Excluded]]:
        return resolve_candidates(self._cost_catalog(serving),
                                  serving.artifact.catalog if serving else None, candidates,
                                  strict)

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
        costs = self._cost_catalog(serving)
        assert costs is not None
        return rank_rows(serving, job, names, costs, lambda n: self._price(costs, n),
                         objective, budget, risk)

    # Batch prediction ------------------------------------------------------------------------
    def predict(self, jobs: pd.DataFrame | Sequence[Mapping[str, Any]],
                candidates: Sequence[str] | None = None, *, strict: bool = False
                ) -> PredictResult:
        """Predicted samples/s for each (job, hardware) row, failing open like :meth:`rank`.

        Rows with a ``hardware`` value are scored on it; the others on every candidate
        (default: the model's whole catalog). See :func:`leap.model.predict.predict_frame`.

        Examples
        --------
        Not run here (it needs a workspace)::

            ranker.predict([{"family_id": "f1", "model_type": "m", "trainer_count": 1,
                             "batch_size": 8}], ["H100-SXM"]).frame
        """
        from leap.model.predict import predict_checked

        t0 = time.perf_counter()
        serving = self.watcher.current()
        version = serving.version if serving else None

        def empty(reason: str) -> PredictResult:
            return PredictResult(pd.DataFrame(), version, reason,
                                 (time.perf_counter() - t0) * 1e3)
        try:
            frame = jobs_request(jobs)
            if serving is None:
                if strict and candidates is not None:
                    self._candidates(None, candidates, strict=True)
                return empty(self.record_fail_open("no_model",
                                                   self.watcher.error or "no model loaded"))
            cat = serving.artifact.catalog
            names = cat.resolve(list(candidates) if candidates is not None else None)
            check_jobs_for(frame, cat)
        except Exception as exc:  # a bad request fails open; only `strict` raises it
            err = exc if isinstance(exc, LeapError) else DataError(
                f"invalid request: {_describe(exc)}")
            if strict:
                raise err from None
            return empty(self.record_fail_open("invalid_request", str(err)))
        try:
            out = predict_checked(serving.artifact, frame, names)  # checked above
            bad = ~np.isfinite(out["predicted_throughput"].to_numpy(dtype=np.float64))
            if bad.any():
                raise FloatingPointError(f"{int(bad.sum())} non-finite predictions")
        except Exception as exc:  # fail-open, counted and logged (see rank)
            log.exception("predict failed open")
            return empty(self.record_fail_open("prediction_failed", _describe(exc)))
        return PredictResult(out, version, None, (time.perf_counter() - t0) * 1e3)

