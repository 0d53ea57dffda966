"""The real-data protocols' splits and fold runner: which rows each fold holds out, and
every predictor's held-out predictions and scores (see :mod:`leap.eval.real_data`).

A predictor is a :data:`FitPredict`: ``fn(train, test, catalog) -> predicted throughput`` per
test row, NaN where it has no estimate (reported as lost coverage). ``test`` never carries
the outcome columns (:data:`leap.datasets.OUTCOME_COLUMNS`). A predictor with intervals
returns three columns instead, the median and the 80% interval's ``p10`` and ``p90`` (see
:func:`point`); scores read the median.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.datasets import OUTCOME_COLUMNS, benchmark_catalog
from leap.errors import ConfigError, ModelError, did_you_mean
from leap.eval.parallel import Parallel
from leap.records import Record

#: ``fn(train_rows, test_rows_without_outcome, catalog) -> predicted whole-job throughput``:
#: one value per test row, or rows of ``(median, p10, p90)``.
FitPredict = Callable[[pd.DataFrame, pd.DataFrame, Catalog], np.ndarray]


def point(pred: np.ndarray) -> np.ndarray:
    """The median of a :data:`FitPredict` answer, one value per row (its first column when it
    carries an interval)."""
    return pred[:, 0] if pred.ndim == 2 else pred


class RowPredictor:
    """The predictor contract (:class:`leap.eval.baselines.Predictor`) on benchmark rows,
    and the :data:`FitPredict` it implies.

    ``fit(rows, catalog)`` learns from training rows and returns the predictor;
    ``predict(rows)`` estimates each row (NaN: no estimate); calling the predictor,
    ``p(train, test, catalog)``, is ``p.fit(train, catalog).predict(test)``, the form the fold
    runner uses. The baselines here are lazy learners (a lookup, a nearest neighbour, a spec
    ratio): ``fit`` keeps the rows and the catalog (``train_``, ``catalog_``) and
    :meth:`_predict` does the work.
    """

    def fit(self, rows: pd.DataFrame, catalog: Catalog) -> RowPredictor:
        """Learn from ``rows`` (with their outcome) and the hardware ``catalog``."""
        self.train_ = rows
        self.catalog_ = catalog
        return self

    def predict(self, rows: pd.DataFrame) -> np.ndarray:
        """Predicted whole-job throughput of each of ``rows`` (their outcome is not read)."""
        if not hasattr(self, "train_"):
            raise ModelError(f"this {type(self).__name__} is not fitted yet; call "
                             "fit(rows, catalog) first")
        return self._predict(self.train_, rows, self.catalog_)

    def _predict(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, train: pd.DataFrame, test: pd.DataFrame, catalog: Catalog) -> np.ndarray:
        return self.fit(train, catalog).predict(test)

PROTOCOLS: tuple[str, ...] = ("held_out_cells", "unseen_hardware", "unseen_model", "scaling",
                              "newest_types")
#: Types ``newest_types`` holds out at least (fewer when only two older types would stay).
NEWEST_MIN_TYPES = 3
TARGET = "throughput_samples_per_s"
#: A measurement cell: what ``held_out_cells`` holds out together.
CELL_KEY: tuple[str, ...] = ("source", "model", "hardware", "num_devices", "batch_size")
#: One benchmark configuration (the attempt mapping's family), hardware-independent.
CONFIG_KEY: tuple[str, ...] = ("source", "table", "model", "precision")


# Splits ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """One fold: positional row indices of one source's frame for training and testing."""

    protocol: str
    source: str
    fold: str
    train: np.ndarray
    test: np.ndarray


def group_codes(df: pd.DataFrame, cols: Sequence[str]) -> np.ndarray:
    # Missing batch sizes / precisions form their own group rather than vanishing.
    return df.groupby(list(cols), dropna=False, sort=True).ngroup().to_numpy()


def newest_types(types: Sequence[str], catalog: Catalog) -> list[str]:
    """The types ``newest_types`` holds out: whole release years, newest first, until at
    least :data:`NEWEST_MIN_TYPES` are out, never leaving fewer than two older types.

    Examples
    --------
    >>> from leap.datasets import benchmark_catalog
    >>> newest_types(["K80", "P100", "V100-SXM2-16GB"], benchmark_catalog())
    ['V100-SXM2-16GB']
    """
    year = {h: catalog[h].year for h in types}
    held: list[str] = []
    for y in sorted(set(year.values()), reverse=True):
        more = held + sorted(h for h in types if year[h] == y)
        if len(types) - len(more) < 2:
            break
        held = more
        if len(held) >= NEWEST_MIN_TYPES:
            break
    return held


def make_splits(df: pd.DataFrame, protocol: str, *, n_folds: int = 10,
                seed: int = 0, catalog: Catalog | None = None) -> list[Split]:
    """The folds of ``protocol`` on ``df`` (rows of ONE source), deterministic for a seed.

    ``catalog`` gives the release years ``newest_types`` needs (default
    :func:`leap.datasets.benchmark_catalog`).

    Examples
    --------
    >>> from leap.datasets import load_throughput
    >>> df = load_throughput("gavel", include_flagged=False)
    >>> [s.fold for s in make_splits(df, "unseen_hardware")]
    ['K80', 'P100', 'V100-SXM2-16GB']
    """
    if protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol '{protocol}'{did_you_mean(protocol, PROTOCOLS)}; "
                          f"choose from {', '.join(PROTOCOLS)}")
    sources = df["source"].unique()
    if len(sources) > 1:
        raise ConfigError(f"make_splits takes one source at a time, got {sorted(sources)}")
    source = str(sources[0]) if len(sources) else ""
    idx = np.arange(len(df))
    out: list[Split] = []

    def add(fold: str, test: np.ndarray) -> None:
        if test.any() and (~test).any():
            out.append(Split(protocol, source, fold, idx[~test], idx[test]))

    if protocol == "held_out_cells":
        cells = group_codes(df, CELL_KEY)
        n_cells = int(cells.max()) + 1 if len(cells) else 0
        k = max(1, min(n_folds, n_cells))
        order = np.random.default_rng(seed).permutation(n_cells)
        fold_of_cell = np.empty(n_cells, dtype=np.int64)
        fold_of_cell[order] = np.arange(n_cells) % k
        folds = fold_of_cell[cells]
        for f in range(k):
            add(f"fold{f}", folds == f)
    elif protocol in ("unseen_hardware", "unseen_model"):
        col = "hardware" if protocol == "unseen_hardware" else "model"
        values = df[col].to_numpy()
        for v in sorted(pd.unique(values)):
            add(str(v), values == v)
    elif protocol == "newest_types":
        hw = df["hardware"].to_numpy()
        held = newest_types(sorted(pd.unique(hw)), catalog or benchmark_catalog())
        add("newest: " + ", ".join(held), np.isin(hw, held))
    else:  # scaling
        hw = df["hardware"].to_numpy()
        multi = df["num_devices"].to_numpy() > 1
        single_hw = set(hw[~multi])
        for h in sorted(pd.unique(hw[multi])):
            if h in single_hw:
                add(str(h), (hw == h) & multi)
    return out


def without_outcome(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in OUTCOME_COLUMNS if c in df.columns])


# Running ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Score(Record):
    """One method's held-out score on one protocol of one source (:func:`score`).

    ``accuracy_within_20pct`` scores the covered rows, ``accuracy_within_20pct_all`` counts
    the others as misses; ``folds``: the fits behind it; ``interval_coverage``: for a method
    with 80% intervals, the share of the rows it gave one whose measured figure lies inside
    (written only then).
    """

    OMIT_NONE = frozenset({"interval_coverage"})

    n: int
    n_covered: int
    coverage: float
    accuracy_within_20pct: float
    accuracy_within_20pct_all: float
    median_ape: float
    folds: int
    interval_coverage: float | None = None


def score(pred: np.ndarray, actual: np.ndarray, folds: int) -> Score:
    """:func:`leap.metrics.summary` of a held-out prediction (its median: :func:`point`), in
    the real-data names.

    A prediction that is not a positive number is no estimate (lost coverage).

    Examples
    --------
    >>> s = score(np.array([100.0, np.nan, 150.0]), np.array([110.0, 50.0, 100.0]), folds=3)
    >>> s.n_covered, s.accuracy_within_20pct, round(s.accuracy_within_20pct_all, 3)
    (2, 0.5, 0.333)
    >>> score(np.array([[100.0, 90.0, 120.0], [100.0, 90.0, 120.0]]), np.array([110.0, 80.0]),
    ...       folds=1).interval_coverage
    0.5
    """
    bounded = metrics.interval_coverage(actual, pred[:, 1], pred[:, 2]) \
        if pred.ndim == 2 else None
    pred = point(pred)
    covered = np.isfinite(pred) & (pred > 0)
    p = np.where(covered, pred, np.nan)
    every = metrics.summary(p, actual)
    return Score(
        n=len(actual), n_covered=int(covered.sum()), coverage=every.coverage,
        accuracy_within_20pct=(metrics.accuracy(p[covered], actual[covered])
                               if covered.any() else float("nan")),
        accuracy_within_20pct_all=every.accuracy, median_ape=every.median_ape,
        folds=int(folds), interval_coverage=bounded)


#: ``progress(done, total, label)``: called as folds finish.
Progress = Callable[[int, int, str], None]
#: Scores per source, protocol and method.
Scores = dict[str, dict[str, dict[str, Score]]]
#: Scores per source, protocol, fold (e.g. the type held out) and method.
FoldScores = dict[str, dict[str, dict[str, dict[str, Score]]]]


@dataclass(frozen=True)
class ProtocolSettings(Record):
    """What :func:`run_protocols` ran: folds, seed, protocols, methods, sources, catalog."""

    n_folds: int
    seed: int
    protocols: list[str]
    methods: list[str]
    sources: list[str]
    catalog_fingerprint: str


@dataclass(frozen=True)
class ProtocolResults(Record):
    """:func:`run_protocols`: its settings, the scores per source, protocol and method, and
    the same per fold (``by_fold``: which held-out types, models or cells a method misses)."""

    settings: ProtocolSettings
    results: Scores
    by_fold: FoldScores = field(default_factory=dict)


@dataclass(frozen=True)
class _Fold:
    """One fit-and-predict: a predictor, its training rows and the test rows (no outcome)."""

    predictor: FitPredict
    train: pd.DataFrame
    test: pd.DataFrame
    catalog: Catalog
    where: str


def _fit_predict(fold: _Fold) -> np.ndarray:
    pred = np.asarray(fold.predictor(fold.train, fold.test, fold.catalog), dtype=float)
    if pred.ndim != 2 or pred.shape[1] != 3:
        pred = pred.reshape(-1)
    if len(pred) != len(fold.test):
        raise ModelError(f"predictor returned {len(pred)} values for {len(fold.test)} "
                         f"test rows ({fold.where})")
    return pred


def _picklable(obj: object) -> bool:
    """Whether ``obj`` can travel to a worker process (a lambda or closure cannot)."""
    try:
        pickle.dumps(obj)
    except Exception:
        return False
    return True


def held_out_predictions(frame: pd.DataFrame, predictors: Mapping[str, FitPredict],
                         protocol: str, catalog: Catalog, *, n_folds: int = 10, seed: int = 0,
                         parallel: Parallel | None = None, progress: Progress | None = None
                         ) -> dict[str, tuple[np.ndarray, int]]:
    """Every predictor's held-out prediction for each row of ``frame`` (one source).

    Returns ``{name: (prediction per row, folds)}``, with the ``(median, p10, p90)`` columns
    of a predictor that returns them (:func:`point` reads the median); a row no fold tests
    stays NaN. The folds of picklable predictors run on ``parallel`` (worker processes or
    Dask); the others (lambdas, closures) run in this process.
    """
    frame = frame.reset_index(drop=True)
    splits = make_splits(frame, protocol, n_folds=n_folds, seed=seed, catalog=catalog)
    remote = parallel is not None and parallel.backend != "serial"
    tasks: dict[bool, list[tuple[str, Split, _Fold]]] = {True: [], False: []}
    for name, predictor in predictors.items():
        where = remote and _picklable(predictor)
        for split in splits:
            fold = _Fold(predictor, frame.iloc[split.train].reset_index(drop=True),
                         without_outcome(frame.iloc[split.test]).reset_index(drop=True),
                         catalog, f"{split.source}, {protocol}, fold {split.fold}")
            tasks[where].append((name, split, fold))
    out: dict[str, tuple[np.ndarray, int]] = {}
    total, done = len(tasks[True]) + len(tasks[False]), 0
    for where, runner in ((True, parallel), (False, Parallel())):
        if not tasks[where] or runner is None:
            continue
        for i, pred in runner.map(_fit_predict, [t[2] for t in tasks[where]]):
            name, split, _ = tasks[where][i]
            if name not in out:
                out[name] = (np.full((len(frame), *pred.shape[1:]), np.nan), len(splits))
            out[name][0][split.test] = pred
            done += 1
            if progress is not None:
                progress(done, total, f"{split.source} {protocol} {name}")
    return {name: out.get(name, (np.full(len(frame), np.nan), len(splits)))
            for name in predictors}


def run_protocols(
    df: pd.DataFrame,
    predictors: Mapping[str, FitPredict],
    *,
    sources: Sequence[str] | None = None,
    protocols: Sequence[str] = PROTOCOLS,
    catalog: Catalog | None = None,
    n_folds: int = 10,
    seed: int = 0,
    parallel: Parallel | None = None,
    progress: Progress | None = None,
) -> ProtocolResults:
    """Score every predictor on every protocol, per source.

    Parameters
    ----------
    df : pandas.DataFrame
        Rows of :func:`leap.datasets.load_throughput` (drop flagged rows first if wanted).
    predictors : mapping of str to FitPredict
        E.g. :func:`default_predictors`.
    sources : sequence of str, optional
        Sources to evaluate; all sources present in ``df`` by default.
    protocols : sequence of str
        A subset of :data:`PROTOCOLS`.
    catalog : Catalog, optional
        Hardware specs for the predictors; :func:`leap.datasets.benchmark_catalog` by default.
    n_folds, seed : int
        Folds of ``held_out_cells`` and the seed that deals cells into them.
    parallel : Parallel, optional
        Where the folds run (default: in this process, one after another).
    progress : callable, optional
        ``progress(done, total, label)`` as folds finish (per source and protocol).

    Returns
    -------
    ProtocolResults
        ``results[source][protocol][method]``: a :class:`Score`;
        ``by_fold[source][protocol][fold][method]``: the same on one fold's rows; and the
        ``settings``.

    Examples
    --------
    >>> from leap.datasets import load_throughput
    >>> df = load_throughput("gavel", include_flagged=False)
    >>> from leap.eval.real_baselines import NearestNeighbors
    >>> out = run_protocols(df, {"knn": NearestNeighbors()}, protocols=["unseen_hardware"])
    >>> out.results["gavel"]["unseen_hardware"]["knn"].coverage
    1.0
    """
    for p in protocols:
        if p not in PROTOCOLS:
            raise ConfigError(f"unknown protocol '{p}'{did_you_mean(p, PROTOCOLS)}; "
                              f"choose from {', '.join(PROTOCOLS)}")
    present = list(dict.fromkeys(df["source"]))
    chosen = list(sources) if sources is not None else present
    for s in chosen:
        if s not in present:
            raise ConfigError(f"source '{s}' has no rows here{did_you_mean(s, present)}; "
                              f"sources present: {', '.join(present)}")
    cat = catalog if catalog is not None else benchmark_catalog()
    results: Scores = {}
    by_fold: FoldScores = {}
    for source in chosen:
        frame = df[df["source"] == source].reset_index(drop=True)
        actual = frame[TARGET].to_numpy(float)
        results[source], by_fold[source] = {}, {}
        for protocol in protocols:
            preds = held_out_predictions(frame, predictors, protocol, cat, n_folds=n_folds,
                                         seed=seed, parallel=parallel, progress=progress)
            splits = make_splits(frame, protocol, n_folds=n_folds, seed=seed, catalog=cat)
            tested = np.zeros(len(frame), dtype=bool)
            for split in splits:
                tested[split.test] = True
            results[source][protocol] = {
                name: score(pred[tested], actual[tested], folds)
                for name, (pred, folds) in preds.items()}
            by_fold[source][protocol] = {
                split.fold: {name: score(pred[split.test], actual[split.test], 1)
                             for name, (pred, _) in preds.items()}
                for split in splits}
    return ProtocolResults(
        settings=ProtocolSettings(n_folds=n_folds, seed=seed, protocols=list(protocols),
                                  methods=list(predictors), sources=chosen,
                                  catalog_fingerprint=cat.fingerprint()),
        results=results, by_fold=by_fold)
