"""Real-data evaluation: leak-free protocols on public measurements, baselines, LEAP's hook.

Four protocols, each run per source (units and harnesses differ between sources):

``held_out_cells``
    Predict a (model, hardware, devices, batch) cell from all other rows. Cells are dealt into
    ``n_folds`` folds (seeded); every table version and precision of a cell leaves together.
``unseen_hardware``
    Hold each accelerator type out entirely; predict all its rows.
``unseen_model``
    Hold each model out entirely.
``scaling``
    For each type with single-device rows, predict its multi-device rows from everything
    else: its own single-device rows plus other types' rows of any size.
``newest_types``
    What a user meets when a new generation arrives: hold out the source's newest types
    together (by release year, newest first, until at least :data:`NEWEST_MIN_TYPES` are
    out while two older types stay) and predict them from the older ones only.

A predictor is a :data:`FitPredict`: ``fn(train, test, catalog) -> predicted throughput`` per
test row, NaN where it has no estimate (reported as lost coverage). ``test`` never carries
the outcome columns (:data:`leap.datasets.OUTCOME_COLUMNS`). Accuracy is the share of
covered test rows within ±20%; ``accuracy_within_20pct_all`` counts uncovered rows as misses.

The learned predictor plugs in through :func:`learned_predictor` (the hook) or by passing
``predictors={"leap": fn, ...}`` to :func:`run_protocols`; :class:`AttemptsPredictor` adapts
a function of attempt tables (the store's format) to a :data:`FitPredict`.

This module is the driver (:func:`run_real_data`, :class:`RealDataResult`, the verdicts);
the pieces live by job and are importable from here too: the splits, the fold runner and the
scorer in :mod:`leap.eval.real_splits`; the baselines (each a
:class:`~leap.eval.real_splits.RowPredictor`: ``fit(rows, catalog)`` / ``predict(rows)``) in
:mod:`leap.eval.real_baselines`; the reference and price-ranking checks in
:mod:`leap.eval.real_reference`; the tables in :mod:`leap.eval.tables` and the HTML in
:mod:`leap.eval.report`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from leap.catalog import Catalog
from leap.datasets import SOURCES, benchmark_catalog, data_checksum, to_attempts
from leap.eval.parallel import Parallel
from leap.eval.real_baselines import (
    BenchmarkLookup,
    LinearScaling,
    NearestNeighbors,
    SpecRatio,
    baseline_predictors,
    catalog_peaks,
    published_peaks,
)
from leap.eval.real_reference import (
    RankingCheck,
    RankScore,
    ReferenceCheck,
    ranking_check,
    reference_check,
    reference_rows,
    reference_variants,
)
from leap.eval.real_splits import (
    CELL_KEY,
    CONFIG_KEY,
    NEWEST_MIN_TYPES,
    PROTOCOLS,
    TARGET,
    FitPredict,
    FoldScores,
    Progress,
    ProtocolSettings,
    RowPredictor,
    Score,
    Scores,
    Split,
    held_out_predictions,
    make_splits,
    newest_types,
    run_protocols,
    without_outcome,
)
from leap.eval.report import real_data_section
from leap.records import Record

#: ``fn(train_attempts, test_attempts, catalog) -> predicted throughput`` on attempt tables.
AttemptsFitPredict = Callable[[pa.Table, pa.Table, Catalog], np.ndarray]
#: The name the learned predictor is registered under.
LEAP = "leap"
#: The learned predictor with the rows' architecture summaries left blank.
LEAP_NO_ARCHITECTURE = "leap_no_architecture"

__all__ = [
    "CELL_KEY",
    "CONFIG_KEY",
    "EVAL_DAY",
    "EVAL_HISTORY_DAYS",
    "LEAP",
    "LEAP_NO_ARCHITECTURE",
    "NEWEST_MIN_TYPES",
    "PROTOCOLS",
    "TARGET",
    "AttemptsFitPredict",
    "AttemptsPredictor",
    "BenchmarkLookup",
    "FitPredict",
    "FoldScores",
    "LinearScaling",
    "NearestNeighbors",
    "Progress",
    "RankScore",
    "RankingCheck",
    "RealDataResult",
    "ReferenceCheck",
    "RowPredictor",
    "Score",
    "SpecRatio",
    "Split",
    "baseline_predictors",
    "catalog_peaks",
    "default_predictors",
    "flat_results",
    "held_out_predictions",
    "html_section",
    "leap_train_and_predict",
    "learned_predictor",
    "make_splits",
    "newest_types",
    "published_peaks",
    "ranking_check",
    "reference_check",
    "reference_rows",
    "reference_variants",
    "run_protocols",
    "run_real_data",
    "verdicts",
]


# The learned predictor ------------------------------------------------------------------------
#: The as-of time of :class:`AttemptsPredictor`: test attempts sit here, training before it.
EVAL_DAY = datetime(2026, 1, 1, tzinfo=UTC)
#: Days before :data:`EVAL_DAY` the training attempts are spread over.
EVAL_HISTORY_DAYS = 28


@dataclass
class AttemptsPredictor(RowPredictor):
    """``fn(train_attempts, test_attempts, catalog)`` as a :data:`FitPredict`.

    Both tables follow :data:`leap.data.schema.ATTEMPTS_SCHEMA` (via
    :func:`leap.datasets.to_attempts`); the test table's ``throughput`` is null. The
    sources' snapshot dates span 2021-2025, which a 30-day training window would cut, so the
    training attempts are re-timed: each goes to one of the :data:`EVAL_HISTORY_DAYS` days
    before :data:`EVAL_DAY` (the day and time of day come from its attempt id, so they are
    deterministic). Nightly-style training that builds each row's history as of its own day
    then sees a growing share of the others, as in production; the test attempts sit at
    :data:`EVAL_DAY`, where a snapshot sees every training row and no test row. ``fn``
    returns whole-job samples/s per test attempt (or rows of ``(median, p10, p90)``). With
    ``architecture`` False the rows' architecture summaries (parameters, FLOPs per sample
    ...) are left blank, as the sources publish them (:func:`leap.datasets.to_attempts`).

    A module-level ``fn`` makes the predictor picklable, so its folds can run on worker
    processes (``workers`` of :func:`run_real_data`).
    """

    fn: AttemptsFitPredict
    architecture: bool = True

    def _predict(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        tr = to_attempts(train, architecture=self.architecture)
        te = to_attempts(without_outcome(test), architecture=self.architecture)
        col = tr.schema.get_field_index("submitted_at")
        kind = tr.schema.field("submitted_at").type
        stamps = tr.column("submitted_at").to_pandas()
        time_of_day = (stamps - stamps.dt.floor("D")).to_numpy()
        ids = tr.column("attempt_id").to_pylist()
        # attempt ids are "bench-" + hex digits of a hash: a deterministic, uniform day.
        days_back = np.array([1 + int(i[6:14], 16) % EVAL_HISTORY_DAYS for i in ids])
        when_tr = (np.datetime64(EVAL_DAY.replace(tzinfo=None), "us")
                   - days_back.astype("timedelta64[D]") + time_of_day)
        tr = tr.set_column(col, "submitted_at", pa.array(when_tr, type=pa.timestamp("us"))
                           .cast(kind))
        te = te.set_column(col, "submitted_at",
                           pa.array([EVAL_DAY] * te.num_rows, type=kind))
        return np.asarray(self.fn(tr, te, catalog), dtype=float)


def leap_train_and_predict(train: pa.Table, test: pa.Table, catalog: Catalog, *,
                           threads: int = 2) -> np.ndarray:
    """Train leap's nightly model on ``train`` attempts; predict samples/s of ``test`` rows,
    with their 80% intervals: rows of ``(median, p10, p90)`` (NaN bounds where the window
    was too small to calibrate them). ``threads``: the cores the fit uses (the same model
    whatever it is; see :class:`~leap.model.window.TrainConfig`).

    The same code as ``leap train`` (:func:`leap.model.train.train_window`): history as of
    each training row's day, the one feature path, the median objective. The tables are
    small, so the single global model is used (a 13-way cascade over a few hundred rows
    would leave each specialist a handful).
    """
    from leap.model.train import train_window
    from leap.model.window import TrainConfig

    frame = pd.concat([train.to_pandas(), test.to_pandas()], ignore_index=True)
    frame["submitted_at"] = pd.to_datetime(frame["submitted_at"], utc=True)
    frame = frame.sort_values(["submitted_at", "attempt_id"], kind="stable")
    cfg = TrainConfig(window_days=EVAL_HISTORY_DAYS, model_kind="global", threads=threads)
    wm = train_window(frame.reset_index(drop=True), catalog, EVAL_DAY, cfg)
    pred = wm.artifact.predict_interval(test.to_pandas())
    return np.exp(np.column_stack([pred.log, pred.lo, pred.hi]))


def learned_predictor(threads: int = 2) -> FitPredict | None:
    """The learned LEAP predictor as a :data:`FitPredict` (see :func:`leap_train_and_predict`),
    each fit on ``threads`` cores.

    ``leap experiment real-data`` adds it to the baselines under the name :data:`LEAP`.
    """
    return AttemptsPredictor(partial(leap_train_and_predict, threads=threads))


def default_predictors(*, without_architecture: bool = False,
                       threads: int = 2) -> dict[str, FitPredict]:
    """The baselines plus the learned predictor when :func:`learned_predictor` provides one;
    with ``without_architecture`` also leap trained on rows whose architecture summaries are
    blank, as :data:`LEAP_NO_ARCHITECTURE` (what the filled-in public architectures change).
    ``threads``: the cores each of the learned predictor's fits uses; where folds run side by
    side, :meth:`Parallel.task_threads <leap.eval.parallel.Parallel.task_threads>` (two
    processes of two LightGBM threads each on two cores took 1.7-2.1x the CPU of one thread
    each)."""
    preds = baseline_predictors()
    leap = learned_predictor(threads)
    if leap is not None:
        preds[LEAP] = leap
        if without_architecture:
            preds[LEAP_NO_ARCHITECTURE] = AttemptsPredictor(
                partial(leap_train_and_predict, threads=threads), architecture=False)
    return preds


# Reporting ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceProvenance(Record):
    """Where one source's rows come from: count, repository, licence, commits."""

    rows: int
    repo: str
    license: str
    commits: list[str]


@dataclass(frozen=True)
class RealDataProvenance(Record):
    """The data evaluated: the packaged data's checksum, rows, and each source."""

    checksum: str
    rows: int
    include_flagged: bool
    sources: dict[str, SourceProvenance]


@dataclass(frozen=True)
class RealDataResult(Record):
    """The real-data evaluation: data provenance, settings, scores per source, protocol and
    method, the Lambda-only checks (None when Lambda PyTorch was not evaluated), the
    verdicts, and the scores per fold (``by_fold[source][protocol][fold][method]``; a fold
    of ``unseen_hardware`` is the type held out). :meth:`to_dict` is the JSON ``leap
    experiment real-data`` writes."""

    OMIT_NONE = frozenset({"reference_check", "ranking_check"})

    generated_at: str
    data: RealDataProvenance
    settings: ProtocolSettings
    results: Scores
    reference_check: ReferenceCheck | None = None
    ranking_check: RankingCheck | None = None
    verdicts: list[str] = field(default_factory=list)
    by_fold: FoldScores = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": "real-data", **super().to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RealDataResult:
        """Read :meth:`to_dict` back (a saved ``real_data.json``).

        Files written before the ranking check's regret took the name every study uses
        (``mean_regret``) are read with the older name (``mean_value_regret``) renamed.
        """
        ranking = data.get("ranking_check")
        if ranking is not None:
            ranking = {**ranking, "methods": {m: {_RENAMED.get(k, k): v for k, v in r.items()}
                                              for m, r in ranking["methods"].items()}}
        read = super().from_dict({**data, "ranking_check": ranking})
        return read


#: Metric names of older saved results and the names they have now.
_RENAMED = {"mean_value_regret": "mean_regret", "median_value_regret": "median_regret"}


def run_real_data(df: pd.DataFrame, *, predictors: Mapping[str, FitPredict] | None = None,
                  sources: Sequence[str] | None = None, protocols: Sequence[str] = PROTOCOLS,
                  n_folds: int = 10, seed: int = 0, include_flagged: bool = False,
                  parallel: Parallel | None = None,
                  progress: Progress | None = None) -> RealDataResult:
    """The whole experiment (its JSON: :meth:`RealDataResult.to_dict`).

    Protocols per source (:func:`run_protocols`) and, when Lambda PyTorch is among the
    sources, the reference spec-ratio check (:func:`reference_check`) and the ranking check
    on public prices (:func:`ranking_check`), plus data provenance and :func:`verdicts`.
    The folds run on ``parallel`` (default: this process); see :func:`held_out_predictions`.
    """
    preds = dict(predictors) if predictors is not None else default_predictors(
        threads=(parallel or Parallel()).task_threads(2))
    data = df if include_flagged else df[~df["flagged"]].reset_index(drop=True)
    catalog = benchmark_catalog()
    out = run_protocols(data, preds, sources=sources, protocols=protocols, catalog=catalog,
                        n_folds=n_folds, seed=seed, parallel=parallel, progress=progress)
    used = out.settings.sources
    result = RealDataResult(
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        data=RealDataProvenance(
            checksum=data_checksum(), rows=len(data), include_flagged=include_flagged,
            sources={s: SourceProvenance(rows=int((data["source"] == s).sum()),
                                         repo=SOURCES[s].repo, license=SOURCES[s].license,
                                         commits=sorted({t.commit for t in SOURCES[s].tables}))
                     for s in used}),
        settings=out.settings, results=out.results, by_fold=out.by_fold)
    if "lambda_pytorch" in used:
        learned = {m: preds[m] for m in (LEAP, LEAP_NO_ARCHITECTURE) if m in preds} or None
        # The lookup table and linear scaling never predict an unseen single-GPU type.
        ranked = {m: p for m, p in preds.items() if m not in ("lookup", "linear_scaling")}
        # Both checks hold each type out of the same rows: fit each method once for both.
        shared = held_out_predictions(reference_rows(df), ranked, "unseen_hardware", catalog,
                                      parallel=parallel, progress=progress)
        result = replace(
            result, reference_check=reference_check(df, catalog, learned, predictions=shared),
            ranking_check=ranking_check(df, ranked, catalog, predictions=shared))
    return replace(result, verdicts=verdicts(result))


def verdicts(result: RealDataResult) -> list[str]:
    """Plain sentences comparing the learned predictor with the best baseline per cell."""
    lines: list[str] = []
    for source, by_protocol in result.results.items():
        for protocol, by_method in by_protocol.items():
            if LEAP not in by_method:
                continue
            ours = by_method[LEAP].accuracy_within_20pct_all
            base = {m: r.accuracy_within_20pct_all for m, r in by_method.items()
                    if m != LEAP and np.isfinite(r.accuracy_within_20pct_all)}
            if not base:
                continue
            best = max(base, key=lambda m: base[m])
            word = ("beats" if ours > base[best] + 0.05 else
                    "does NOT clearly beat" if ours > base[best] else "is WORSE than")
            lines.append(f"{source} / {protocol}: leap {ours:.0%} {word} the best baseline "
                         f"{best} {base[best]:.0%} (within ±20%, uncovered rows count as misses)")
    ref = result.reference_check
    if ref is not None and LEAP in ref.matched_geomean:
        matched = ref.matched_geomean[LEAP]
        ours = matched.accuracy_within_20pct
        theirs = ref.methods["spec_ratio_geomean"].accuracy_within_20pct
        word = ("beats" if ours > theirs + 0.05 else
                "does NOT clearly beat" if ours > theirs else "is WORSE than")
        lines.append(f"reference protocol (Lambda PyTorch, 1 GPU, type held out): leap "
                     f"{ours:.0%} {word} spec-ratio geomean {theirs:.0%} on the same "
                     f"{matched.n} rows")
    return lines


def flat_results(result: RealDataResult) -> list[dict[str, str | float | int]]:
    """The nested results as rows: source, protocol, method and the scores."""
    return [{"source": s, "protocol": p, "method": m, **r.to_dict()}
            for s, by_p in result.results.items() for p, by_m in by_p.items()
            for m, r in by_m.items()]


def html_section(result: RealDataResult) -> str:
    """The evaluation as an HTML ``<section>`` (:func:`leap.eval.report.real_data_section`)."""
    return real_data_section(result)
