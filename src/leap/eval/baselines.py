"""Baselines LEAP is measured against: the lookup table (the previous system) and simple rankers.

Every predictor a study compares follows one contract, :class:`Predictor`:
``fit(attempts, catalog)`` then ``predict(jobs)``. The held-out-day studies use it here
(:class:`LookupTable`, :class:`SpecRatioTransfer`), and the real-data protocols through
:class:`leap.eval.real_splits.RowPredictor` (the same contract on benchmark rows).

:class:`LookupTable` is the system the paper replaced: the median measured throughput of past
attempts with exactly the same configuration on the same hardware, keyed by
``(family_id, hardware, trainer_count, batch_size)``; a job whose key never ran has no
estimate. :func:`lookup_comparison` puts it beside LEAP on one held-out day.

The ranking baselines order a job's eligible types without a model: :func:`cheapest_order`
(lowest cost per device-hour first), :func:`fastest_peak_order` (highest peak dense 16-bit
FLOP/s first) and :func:`most_used_order` (the family's most-used types in the training
window first, then cheapest). Every order breaks ties by name, so it never depends on the
order of the candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Self, runtime_checkable

import numpy as np
import pandas as pd

from leap import metrics
from leap.catalog import Catalog
from leap.data.usage import device_hours, usable_mask
from leap.errors import DataError, ModelError
from leap.records import Record

#: The lookup table's key: the exact job configuration and the hardware.
LOOKUP_KEY: tuple[str, ...] = ("family_id", "hardware", "trainer_count", "batch_size")


@runtime_checkable
class Predictor(Protocol):
    """The contract of every predictor a study compares (scikit-learn style).

    ``fit(attempts, catalog)`` learns from past attempts (with their measured throughput)
    and the hardware catalog and returns the fitted predictor; ``predict(jobs)`` gives the
    predicted samples/s of each job row, NaN where it has no estimate (lost coverage). The
    jobs' own outcome is never read.
    """

    def fit(self, attempts: pd.DataFrame, catalog: Catalog, /) -> Self:
        ...

    def predict(self, jobs: pd.DataFrame, /) -> np.ndarray:
        ...


#: Device-hours of each attempt (the one rule, :func:`leap.data.usage.device_hours`).
gpu_hours = device_hours


@dataclass(frozen=True)
class TransferGroup(Record):
    """The spec-ratio rule beside LEAP on one group of unobserved pairs (its covered rows)."""

    n: int
    rule_coverage: float
    rule_accuracy: float
    leap_accuracy: float
    rule_median_ape: float
    leap_median_ape: float


@dataclass(frozen=True)
class TransferComparison(Record):
    """:func:`transfer_comparison`: the rule, and each group of families by the number of
    types they ran on (``all``: every unobserved pair)."""

    rule: str
    unobserved_pair_1: TransferGroup
    unobserved_pair_2: TransferGroup
    unobserved_pair_3plus: TransferGroup
    all: TransferGroup


@dataclass(frozen=True)
class LookupComparison(Record):
    """:func:`lookup_comparison`: the lookup table beside LEAP on one held-out day."""

    OMIT_NONE = frozenset({"spec_ratio_transfer"})

    n: int
    n_covered: int
    keys: list[str]
    table_coverage: float
    table_coverage_gpu_hours: float
    leap_coverage: float
    table_accuracy_covered: float
    leap_accuracy_covered: float
    table_accuracy_covered_gpu_hours: float
    leap_accuracy_covered_gpu_hours: float
    table_median_ape_covered: float
    leap_median_ape_covered: float
    leap_accuracy_all: float
    leap_accuracy_all_gpu_hours: float
    table_accuracy_all: float
    spec_ratio_transfer: TransferComparison | None = None


class LookupTable:
    """The previous system: median throughput of past attempts of the exact configuration.

    Parameters
    ----------
    keys : sequence of str
        Columns that must match exactly (default :data:`LOOKUP_KEY`).
    min_count : int
        Past succeeded attempts a key needs before the table answers for it.

    Attributes
    ----------
    table_ : pandas.DataFrame
        One row per key seen in training: ``median_throughput`` and ``count``.

    Examples
    --------
    >>> past = pd.DataFrame({"family_id": ["f", "f", "g"], "hardware": ["A", "A", "A"],
    ...                      "trainer_count": [1, 1, 1], "batch_size": [8, 8, 8],
    ...                      "status": ["succeeded"] * 3, "throughput": [10.0, 30.0, 5.0]})
    >>> new = past.iloc[[0]].assign(hardware="B")
    >>> table = LookupTable().fit(past, Catalog.default())
    >>> table.predict(pd.concat([past.iloc[[0]], new])).tolist()
    [20.0, nan]
    """

    def __init__(self, *, keys: Sequence[str] = LOOKUP_KEY, min_count: int = 1) -> None:
        self.keys = tuple(keys)
        self.min_count = min_count

    def fit(self, attempts: pd.DataFrame, catalog: Catalog | None = None) -> LookupTable:
        """Learn the median of each key from the succeeded attempts with a throughput (the
        table needs no ``catalog``: it matches hardware by name)."""
        if self.min_count < 1:
            raise ModelError(f"min_count must be >= 1, got {self.min_count}")
        missing = [k for k in (*self.keys, "status", "throughput") if k not in attempts.columns]
        if missing:
            raise DataError(f"lookup table: the attempts lack column(s) {', '.join(missing)}; "
                            "pass attempt rows as loaded from the store")
        tp = pd.to_numeric(attempts["throughput"], errors="coerce")
        ok = attempts[usable_mask(attempts)]
        grouped = ok.assign(throughput=tp[ok.index]).groupby(list(self.keys), sort=True,
                                                              observed=True)["throughput"]
        table = pd.DataFrame({"median_throughput": grouped.median(), "count": grouped.size()})
        self.table_ = table[table["count"] >= self.min_count]
        self.fitted_ = True
        return self

    def predict(self, jobs: pd.DataFrame) -> np.ndarray:
        """Median samples/s of each job's key; NaN where the key never ran (not covered)."""
        if not getattr(self, "fitted_", False):
            raise ModelError("this LookupTable is not fitted yet; call fit(past_attempts, catalog) "
                             "first")
        missing = [k for k in self.keys if k not in jobs.columns]
        if missing:
            raise DataError(f"lookup table: the jobs lack key column(s) {', '.join(missing)}")
        if len(jobs) == 0:
            return np.empty(0)
        index = pd.MultiIndex.from_frame(jobs[list(self.keys)]) if len(self.keys) > 1 \
            else pd.Index(jobs[self.keys[0]])
        return self.table_["median_throughput"].reindex(index).to_numpy(dtype=np.float64)


def lookup_comparison(past: pd.DataFrame, jobs: pd.DataFrame, leap_pred: np.ndarray,
                      catalog: Catalog | None = None) -> LookupComparison:
    """The lookup table beside LEAP on one held-out day (the paper's 13.3% / 53.2% vs 85.1%).

    Parameters
    ----------
    past : pandas.DataFrame
        Attempts of the training window (the table's memory).
    jobs : pandas.DataFrame
        The held-out day's succeeded attempts (with ``throughput``).
    leap_pred : numpy.ndarray
        LEAP's predicted samples/s for each row of ``jobs`` (NaN = no prediction).
    catalog : Catalog, optional
        With it, ``spec_ratio_transfer`` adds :func:`transfer_comparison` (the spec-ratio
        rule beside LEAP on the pairs without history, where the table has no answer).

    Returns
    -------
    LookupComparison
        ``n``; ``table_coverage`` (share of attempts whose key ran before) and
        ``leap_coverage``; ``table_accuracy_covered`` and ``leap_accuracy_covered`` (within
        ±20% on the table's covered subset), ``leap_accuracy_all``; the same GPU-hour
        weighted (``*_gpu_hours``); median APEs on the covered subset.

    Examples
    --------
    >>> past = pd.DataFrame({"family_id": ["f"], "hardware": ["A"], "trainer_count": [1],
    ...                      "batch_size": [8], "status": ["succeeded"], "throughput": [10.0]})
    >>> day = pd.concat([past, past.assign(hardware="B")]).assign(throughput=[11.0, 20.0])
    >>> r = lookup_comparison(past, day, np.array([11.0, 30.0]))
    >>> r.table_coverage, r.table_accuracy_covered, r.leap_accuracy_all
    (0.5, 1.0, 0.5)
    """
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    leap_pred = np.asarray(leap_pred, dtype=np.float64)
    if len(leap_pred) != len(jobs):
        raise DataError(f"got {len(leap_pred)} LEAP predictions for {len(jobs)} jobs; pass one "
                        "per held-out attempt")
    table = LookupTable().fit(past, catalog).predict(jobs)
    covered = np.isfinite(table)
    hours = gpu_hours(jobs)

    def share(mask: np.ndarray, w: np.ndarray | None = None) -> float:
        w = np.ones(len(mask)) if w is None else w
        return float((w * mask).sum() / w.sum()) if len(mask) and w.sum() > 0 else float("nan")

    return LookupComparison(
        n=len(jobs),
        n_covered=int(covered.sum()),
        keys=list(LOOKUP_KEY),
        table_coverage=share(covered),
        table_coverage_gpu_hours=share(covered, hours),
        leap_coverage=share(np.isfinite(leap_pred)),
        table_accuracy_covered=metrics.accuracy(table[covered], actual[covered]),
        leap_accuracy_covered=metrics.accuracy(leap_pred[covered], actual[covered]),
        table_accuracy_covered_gpu_hours=metrics.accuracy(table[covered], actual[covered],
                                                          hours[covered]),
        leap_accuracy_covered_gpu_hours=metrics.accuracy(leap_pred[covered],
                                                         actual[covered], hours[covered]),
        table_median_ape_covered=metrics.median_ape(table[covered], actual[covered]),
        leap_median_ape_covered=metrics.median_ape(leap_pred[covered], actual[covered]),
        leap_accuracy_all=metrics.accuracy(leap_pred, actual),
        leap_accuracy_all_gpu_hours=metrics.accuracy(leap_pred, actual, hours),
        # The table answers nothing for uncovered rows: as a whole-day system it scores this.
        table_accuracy_all=metrics.accuracy(table, actual),
        spec_ratio_transfer=None if catalog is None else transfer_comparison(
            past, jobs, leap_pred, catalog))


# Transfer to a type a family never ran on -----------------------------------------------------
#: The job shape the spec-ratio rule matches on (with the family) when it can.
_SHAPE_KEY: tuple[str, ...] = ("trainer_count", "devices_per_trainer", "batch_size",
                               "precision")


class SpecRatioTransfer:
    """The simple rule for a (family, type) pair without history: spec ratios.

    For a job on type ``h``, each other type ``g`` the family succeeded on in the past gives
    ``median samples/s on g x sqrt(peak(h) / peak(g) x bandwidth(h) / bandwidth(g))``, with
    the peak FLOP/s of the job's precision (:func:`leap.features.physics.peak_flops`) and the
    median taken at the job's own shape (trainers, devices per trainer, batch, precision)
    when the family ran that shape on ``g``, else over all its runs there. The prediction is
    the median over the types ``g``; NaN when the family ran on no other type.

    Examples
    --------
    >>> from leap.catalog import Catalog
    >>> past = pd.DataFrame({"family_id": ["f"], "hardware": ["A100-SXM4-80GB"],
    ...                      "trainer_count": [1], "devices_per_trainer": [1],
    ...                      "batch_size": [8], "precision": ["bf16"],
    ...                      "status": ["succeeded"], "throughput": [100.0]})
    >>> rule = SpecRatioTransfer().fit(past, Catalog.default())
    >>> est = rule.predict(past.assign(hardware="H100-SXM"))
    >>> round(float(est[0]))  # sqrt(989 / 312 x 3350 / 2039) = 2.28
    228
    """

    def fit(self, attempts: pd.DataFrame, catalog: Catalog) -> SpecRatioTransfer:
        """Remember each family's median samples/s per type (and per shape and type) and the
        ``catalog``'s specs."""
        self.catalog = catalog
        tp = pd.to_numeric(attempts["throughput"], errors="coerce")
        ok = attempts[usable_mask(attempts)] \
            .assign(throughput=tp, hardware=lambda d: d["hardware"].astype(str),
                    family_id=lambda d: d["family_id"].astype(str))
        ok = ok[ok["hardware"].isin(set(self.catalog.names))]
        self.by_type_ = ok.groupby(["family_id", "hardware"])["throughput"].median() \
            .rename("y_any").reset_index()
        shape = [c for c in _SHAPE_KEY if c in ok.columns]
        self.shape_ = shape
        self.by_shape_ = ok.assign(_s=_shape_text(ok, shape)).groupby(
            ["family_id", "_s", "hardware"])["throughput"].median().rename("y_shape") \
            .reset_index()
        return self

    def predict(self, jobs: pd.DataFrame) -> np.ndarray:
        """Spec-ratio estimate per job row (NaN where the family ran on no other type)."""
        from leap.features.physics import hardware_specs, peak_flops

        if not hasattr(self, "by_type_"):
            raise ModelError("this SpecRatioTransfer is not fitted yet; call fit(past, catalog) "
                             "first")
        te = pd.DataFrame({"_row": np.arange(len(jobs)),
                           "family_id": jobs["family_id"].astype(str).to_numpy(),
                           "h": jobs["hardware"].astype(str).to_numpy(),
                           "_s": _shape_text(jobs, self.shape_),
                           "precision": jobs["precision"].astype(object).to_numpy()
                           if "precision" in jobs.columns else None})
        te = te[te["h"].isin(set(self.catalog.names))]
        pairs = te.merge(self.by_type_.rename(columns={"hardware": "g"}), on="family_id")
        pairs = pairs[pairs["g"] != pairs["h"]]
        out = np.full(len(jobs), np.nan)
        if pairs.empty:
            return out
        pairs = pairs.merge(self.by_shape_.rename(columns={"hardware": "g"}),
                            on=["family_id", "_s", "g"], how="left")
        ref = pairs["y_shape"].fillna(pairs["y_any"]).to_numpy(dtype=np.float64)
        prec = pairs["precision"].to_numpy(dtype=object)
        h = hardware_specs(self.catalog, pairs["h"].to_numpy(dtype=object))
        g = hardware_specs(self.catalog, pairs["g"].to_numpy(dtype=object))
        ratio = np.sqrt(peak_flops(prec, h) / peak_flops(prec, g)
                        * h["mem_bw_gb_per_s"] / g["mem_bw_gb_per_s"])
        est = pd.Series(ref * ratio).groupby(pairs["_row"].to_numpy()).median()
        out[est.index.to_numpy(dtype=np.int64)] = est.to_numpy()
        return out


def _shape_text(frame: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    from leap.features.columns import key_texts

    out = np.full(len(frame), "", dtype=object)
    for c in columns:
        out = out + "/" + key_texts(frame[c])
    return out


def transfer_comparison(past: pd.DataFrame, jobs: pd.DataFrame, leap_pred: np.ndarray,
                        catalog: Catalog) -> TransferComparison:
    """LEAP beside the spec-ratio rule on held-out attempts of pairs without history.

    The rows are the held-out day's succeeded attempts whose family ran in the window but
    never on the attempt's type (the unobserved pairs), grouped by how many types the family
    ran on (1, 2, 3+). Both are scored on the rows the rule can answer.

    Returns
    -------
    TransferComparison
        Per group (``unobserved_pair_1``, ``_2``, ``_3plus``, ``all``): ``n``,
        ``rule_coverage``, and within ±20% and median APE of the rule and of LEAP on the
        covered rows.
    """
    rule = SpecRatioTransfer().fit(past, catalog)
    est = rule.predict(jobs)
    actual = jobs["throughput"].to_numpy(dtype=np.float64)
    leap_pred = np.asarray(leap_pred, dtype=np.float64)
    types = rule.by_type_.groupby("family_id")["hardware"].agg(set)
    fam = jobs["family_id"].astype(str).to_numpy()
    hw = jobs["hardware"].astype(str).to_numpy()
    ran = [types.get(f, set()) for f in fam]
    unobserved = np.array([bool(r) and h not in r for r, h in zip(ran, hw, strict=True)])
    n_types = np.array([len(r) for r in ran])
    groups = {"unobserved_pair_1": unobserved & (n_types == 1),
              "unobserved_pair_2": unobserved & (n_types == 2),
              "unobserved_pair_3plus": unobserved & (n_types >= 3), "all": unobserved}
    out: dict[str, TransferGroup] = {}
    for name, m in groups.items():
        cov = m & np.isfinite(est)
        out[name] = TransferGroup(
            n=int(m.sum()),
            rule_coverage=float(cov.sum() / m.sum()) if m.any() else float("nan"),
            rule_accuracy=metrics.accuracy(est[cov], actual[cov]),
            leap_accuracy=metrics.accuracy(leap_pred[cov], actual[cov]),
            rule_median_ape=metrics.median_ape(est[cov], actual[cov]),
            leap_median_ape=metrics.median_ape(leap_pred[cov], actual[cov]))
    return TransferComparison(rule="spec ratio: the family's median on each type it ran on "
                                   "x sqrt(peak FLOP/s ratio x memory bandwidth ratio), median "
                                   "over those types",
                              unobserved_pair_1=out["unobserved_pair_1"],
                              unobserved_pair_2=out["unobserved_pair_2"],
                              unobserved_pair_3plus=out["unobserved_pair_3plus"], all=out["all"])


# Ranking baselines ----------------------------------------------------------------------------
#: The name the rankings of :func:`cheapest_order` go by in study results.
CHEAPEST = "cheapest"


def cheapest_order(candidates: Sequence[str], costs: Catalog | Mapping[str, float]) -> list[str]:
    """Candidates by cost per device-hour, cheapest first (ties by name): the cheapest-type
    rule of every study. ``costs``: a catalog, or a price per device-hour by type name.

    Examples
    --------
    >>> cat = Catalog.default()
    >>> cheapest_order(["H100-SXM", "T4", "L4"], cat)[0]
    'L4'
    >>> cheapest_order(["B", "A", "C"], {"A": 2.0, "B": 1.0, "C": 1.0})
    ['B', 'C', 'A']
    """
    if isinstance(costs, Catalog):
        return sorted(candidates, key=lambda n: (costs[n].cost_per_device_hour, n))
    return sorted(candidates, key=lambda n: (costs[n], n))


def fastest_peak_order(candidates: Sequence[str], costs: Catalog) -> list[str]:
    """Candidates by peak dense 16-bit FLOP/s per device, fastest first (ties by name).

    Examples
    --------
    >>> fastest_peak_order(["T4", "H100-SXM", "L4"], Catalog.default())[0]
    'H100-SXM'
    """
    return sorted(candidates, key=lambda n: (-costs[n].peak_bf16_tflops, n))


def family_usage(past: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Attempts per hardware type of each family in ``past`` (all statuses count as use).

    Examples
    --------
    >>> family_usage(pd.DataFrame({"family_id": ["f", "f", "g"], "hardware": ["A", "A", "B"]}))
    {'f': {'A': 2}, 'g': {'B': 1}}
    """
    counts = past.groupby(["family_id", "hardware"], sort=True, observed=True).size()
    out: dict[str, dict[str, int]] = {}
    for (fam, hw), n in counts.items():
        out.setdefault(str(fam), {})[str(hw)] = int(n)
    return out


def most_used_order(candidates: Sequence[str], usage: Mapping[str, int],
                    costs: Catalog) -> list[str]:
    """The family's most-used candidates first, the never-used ones after them by cost.

    A family with no history (or none on the candidates) falls back to :func:`cheapest_order`.

    Examples
    --------
    >>> most_used_order(["T4", "L4", "H100-SXM"], {"H100-SXM": 3, "L4": 1}, Catalog.default())
    ['H100-SXM', 'L4', 'T4']
    """
    return sorted(candidates, key=lambda n: (-usage.get(n, 0), costs[n].cost_per_device_hour, n))
