"""Prediction intervals: split-conformal residual quantiles per novelty group (Mondrian).

The median model gives log throughput; how far the truth lands from it depends mostly on
what history the row had (:data:`leap.features.encode.NOVELTY_GROUPS`): a configuration the
family ran is predicted within a few percent, a type it never ran on within tens of percent.
So the interval is calibrated separately per group on held-out rows (the last day of the
training window, never fitted on), including rows whose own (family, type) history was
masked, so that unobserved pairs are calibrated on rows that look like them.

For coverage ``1 - alpha`` the interval of a row in group ``g`` is
``[pred + q_lo(g), pred + q_hi(g)]`` in log space, with ``q_lo`` and ``q_hi`` the
``alpha / 2`` and ``1 - alpha / 2`` conformal quantiles of ``y - pred`` in that group (the
finite-sample rank ``ceil((n + 1) p)``). A group with fewer than ``min_rows`` calibration
rows borrows the quantiles of all unobserved-pair rows, then of every row.

An unobserved pair on a vendor whose hardware the family never ran on is far less certain
than one on another type of a vendor it knows (a family's fit to a vendor's software stack
shows only in its own runs there): on the default fleet's held-out day one interval per
group covered 80–89% of the first kind and 63–70% of the second. So, given ``new_vendor``,
each unobserved-pair group is calibrated again per kind (cells ``<group>/vendor_seen`` and
``<group>/new_vendor``, the same rules within each), and a cell with fewer than
``min_rows`` rows keeps its group's interval.

A type nobody ran on in the window is less certain again: the transfer tables know it only
through its specs. The validation day's rows on some of the window's types, each type's rows
encoded as if nobody had run on it (:func:`leap.model.window.new_type_rows`), calibrate one
more cell, ``new_type``; a row on such a type takes, on each side, the wider of its group's
interval and that cell's. On the default fleet the 80% intervals of a type held out of
training entirely covered 66–77% of its attempts without that cell and 81–85% with it.

A model type nobody ran in the window is less certain than a new family of a known one: the
family levels are missing either way, but the model-type levels (``mt_hw``, ``mt``) are what
a new family of a known architecture is read from. The validation day's rows of ten or more
model types, each encoded as if none of its families had run
(:func:`leap.model.window.new_model_type_rows`), calibrate the ``new_model_type`` cell,
applied as ``new_type`` is: a row whose model type has no history in the window takes the
wider of its group's interval and that cell's.

A trainer count new to its (family, type) pair (:func:`leap.features.encode.new_trainer_count`:
the family ran on the type, never at that count) is a new shape, but a farther one than a new
batch size at a known count: on the held-out day such rows were covered 77.4% (default fleet,
398 rows) and 68.4% (harder fleet, 2,359 rows) by their group's interval, against 81-82% for
the group's other rows. They calibrate one more cell, ``new_trainer_count``, applied as
``new_type`` is, from two kinds of validation rows never fitted on: the natural rows of that
kind, and rows whose trainer count, and every larger one of their pair, was hidden from it (a
job scaled out: :func:`leap.model.window.new_trainer_count_rows`; a public table whose
multi-device rows are held out has no natural ones). The cell is the union of the two
intervals, each where it has ``min_rows`` rows: 80.4% and 80.5% on those days, and 53.8% of
Sia's multi-device rows held out by type (35.6% before; session 45).

Masked rows stand in for unobserved pairs, but they are the family's own chosen types, and
a new family is not the same as an established family masked on its only type. So, given
which rows were masked, a group calibrated on both kinds takes the union of the two
intervals, whichever is wider on each side: ``new_family`` the union of natural new families
and families masked whole, each when it has ``min_rows`` rows (a day's natural new families
are a handful of families with many attempts each, too few to set a quantile alone); each
unobserved-pair group the union of its own interval and that of the natural unobserved pairs
(types a family ran on for the first time), when the group's rows include masked ones.

A new family's attempts share its efficiency, so they miss or land together, and a few busy
families make most of a day's new-family attempts (on the default fleet the top five
families made 26–48% of them, worth 13–42 independent families a day). Given each row's
family, both halves of the ``new_family`` cell therefore weigh each family once
(:func:`_conformal_by_cluster`): the busy families of the calibration day no longer set the
interval the next day's families meet.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from leap.errors import ArtifactError, ModelError
from leap.features.encode import NOVELTY_GROUPS

_UNOBSERVED = tuple(i for i, g in enumerate(NOVELTY_GROUPS) if g.startswith("unobserved"))
#: Suffixes of an unobserved-pair group's two cells: the family ran on the target's vendor
#: (another of its types), or never did.
VENDOR_CELLS = ("vendor_seen", "new_vendor")
#: The cell of rows on a type nobody ran on in the window (every group).
NEW_TYPE = "new_type"
#: The cell of rows of a model type nobody ran in the window (every group).
NEW_MODEL_TYPE = "new_model_type"
#: The cell of rows at a trainer count new to their (family, type) pair (every group).
NEW_TRAINER_COUNT = "new_trainer_count"


def _conformal(resid: np.ndarray, alpha: float) -> tuple[float, float]:
    """Lower and upper conformal quantiles of residuals (finite-sample ranks)."""
    r = np.sort(resid)
    n = len(r)
    hi = min(n - 1, math.ceil((n + 1) * (1 - alpha / 2)) - 1)
    lo = max(0, math.floor((n + 1) * (alpha / 2)) - 1)
    return float(r[lo]), float(r[hi])


def _conformal_by_cluster(resid: np.ndarray, cluster: np.ndarray, alpha: float
                          ) -> tuple[float, float]:
    """:func:`_conformal` with each cluster's rows weighing one observation in all (so the
    sample size in the finite-sample correction is the number of clusters); with one row per
    cluster, exactly :func:`_conformal`."""
    order = np.argsort(resid, kind="stable")
    r = resid[order]
    _, inv, count = np.unique(cluster[order], return_inverse=True, return_counts=True)
    w = 1.0 / count[inv]
    k = float(len(count))
    need = (1 - alpha / 2) * (k + 1)   # weight at or below the upper bound, at or above the lower
    hi = min(len(r) - 1, int(np.searchsorted(np.cumsum(w), need - 1e-9)))
    enough = np.cumsum(w[::-1])[::-1] >= need - 1e-9   # weight at or above each row
    lo = int(np.flatnonzero(enough)[-1]) if enough.any() else 0
    return float(r[lo]), float(r[hi])


@dataclass
class IntervalCalibrator:
    """Per-group log-residual quantiles for a central ``coverage`` interval.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> groups = np.repeat([0, 2], 500)
    >>> resid = np.r_[rng.normal(0, 0.05, 500), rng.normal(0, 0.5, 500)]
    >>> cal = IntervalCalibrator(coverage=0.8).fit(resid, groups)
    >>> lo, hi = cal.offsets(np.array([0, 2]))
    >>> bool(hi[1] - lo[1] > 5 * (hi[0] - lo[0]))
    True
    """

    coverage: float = 0.8
    min_rows: int = 30
    quantiles_: dict[str, tuple[float, float, int]] = field(default_factory=dict)

    def fit(self, resid: np.ndarray, groups: np.ndarray, masked: np.ndarray | None = None,
            new_vendor: np.ndarray | None = None,
            new_type_resid: np.ndarray | None = None,
            family: np.ndarray | None = None,
            new_model_type_resid: np.ndarray | None = None,
            new_trainer_count_resid: np.ndarray | None = None,
            new_trainer_count_hidden: np.ndarray | None = None) -> IntervalCalibrator:
        """Calibrate on log residuals ``y - pred`` of held-out rows and their novelty groups;
        ``masked`` marks rows encoded with their own pair history removed, ``new_vendor``
        rows whose family never ran on their type's vendor; ``new_type_resid`` are the
        residuals of rows encoded as if nobody had run on their type, ``new_model_type_resid``
        of rows encoded as if nobody had run their model type, ``new_trainer_count_resid`` of
        rows at a trainer count new to their (family, type) pair (``new_trainer_count_hidden``
        marks those whose trainer count was hidden from the pair); ``family`` is each row's
        family (any hashable codes), for the ``new_family`` group (see the module docstring).
        """
        if not 0 < self.coverage < 1:
            raise ModelError(f"coverage must be in (0, 1), got {self.coverage}")
        resid = np.asarray(resid, dtype=np.float64)
        groups = np.asarray(groups, dtype=np.int64)
        masked = np.zeros(len(resid), dtype=bool) if masked is None else np.asarray(masked,
                                                                                   dtype=bool)
        ok = np.isfinite(resid)
        resid, groups, masked = resid[ok], groups[ok], masked[ok]
        fam = None if family is None else np.asarray(family)[ok]
        if len(resid) < self.min_rows:
            raise ModelError(f"only {len(resid)} calibration rows; need at least "
                             f"{self.min_rows}")
        alpha = 1 - self.coverage
        pooled_all = (*_conformal(resid, alpha), len(resid))
        unobs = np.isin(groups, _UNOBSERVED)
        pooled_unobs = (*_conformal(resid[unobs], alpha), int(unobs.sum())) \
            if unobs.sum() >= self.min_rows else pooled_all

        def guard(rows: np.ndarray) -> tuple[float, float] | None:
            """The natural (unmasked) unobserved pairs' interval among ``rows``."""
            natural = unobs & ~masked & rows
            return _conformal(resid[natural], alpha) if natural.sum() >= self.min_rows \
                else None

        def conformal(m: np.ndarray, by_family: bool) -> tuple[float, float]:
            return _conformal_by_cluster(resid[m], fam[m], alpha) \
                if by_family and fam is not None else _conformal(resid[m], alpha)

        def cell(m: np.ndarray, extra: tuple[float, float] | None, by_family: bool = False
                 ) -> tuple[float, float, int] | None:
            """Rows ``m``'s interval, united with ``extra``; None when too few rows."""
            if m.sum() < self.min_rows:
                return None
            lo, hi = conformal(m, by_family)
            if extra is not None:
                lo, hi = min(lo, extra[0]), max(hi, extra[1])
            return lo, hi, int(m.sum())

        everywhere = np.ones(len(resid), dtype=bool)
        kinds: list[tuple[str, np.ndarray, tuple[float, float] | None]] = []
        if new_vendor is not None:
            nv = np.asarray(new_vendor, dtype=bool)[ok]
            kinds = [(kind, rows, guard(rows))
                     for kind, rows in zip(VENDOR_CELLS, (~nv, nv), strict=True)]
        self.quantiles_ = {}
        for i, name in enumerate(NOVELTY_GROUPS):
            m = groups == i
            extra = None  # the other kind's interval, united with this group's own
            if name == "new_family" and (m & ~masked).sum() >= self.min_rows:
                if (m & masked).sum() >= self.min_rows:
                    extra = conformal(m & masked, by_family=True)
                m = m & ~masked
            elif i in _UNOBSERVED and (m & masked).any():
                extra = guard(everywhere)
            q = cell(m, extra, by_family=name == "new_family")
            if q is not None:
                self.quantiles_[name] = q
            elif i in _UNOBSERVED or name == "new_family":
                self.quantiles_[name] = (*pooled_unobs[:2], 0)
            else:
                self.quantiles_[name] = (*pooled_all[:2], 0)
            for kind, rows, kind_guard in kinds if i in _UNOBSERVED else []:
                mk = m & rows
                q = cell(mk, kind_guard if (mk & masked).any() else None)
                if q is not None:
                    self.quantiles_[f"{name}/{kind}"] = q
        for name, extra_resid in ((NEW_TYPE, new_type_resid),
                                  (NEW_MODEL_TYPE, new_model_type_resid)):
            if extra_resid is not None:
                r = np.asarray(extra_resid, dtype=np.float64)
                r = r[np.isfinite(r)]
                if len(r) >= self.min_rows:
                    self.quantiles_[name] = (*_conformal(r, alpha), len(r))
        if new_trainer_count_resid is not None:
            # The natural rows and the hidden ones, each where there are enough: the union.
            r = np.asarray(new_trainer_count_resid, dtype=np.float64)
            hidden = np.zeros(len(r), dtype=bool) if new_trainer_count_hidden is None \
                else np.asarray(new_trainer_count_hidden, dtype=bool)
            halves = [r[np.isfinite(r) & (hidden == h)] for h in (False, True)]
            parts = [_conformal(x, alpha) for x in halves if len(x) >= self.min_rows]
            if parts:
                self.quantiles_[NEW_TRAINER_COUNT] = (min(lo for lo, _ in parts),
                                                      max(hi for _, hi in parts),
                                                      sum(len(x) for x in halves))
        return self

    def offsets(self, groups: np.ndarray, new_vendor: np.ndarray | None = None,
                new_type: np.ndarray | None = None, new_model_type: np.ndarray | None = None,
                new_trainer_count: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Log offsets ``(lo, hi)`` to add to the median prediction of each row (per vendor
        cell where ``new_vendor`` is given and the cell was calibrated; on a type nobody ran
        on in the window, ``new_type``, widened to the ``new_type`` cell where calibrated,
        for a model type nobody ran, ``new_model_type``, to the ``new_model_type`` cell, and at
        a trainer count new to its pair, ``new_trainer_count``, to that cell).

        Examples
        --------
        >>> cal = IntervalCalibrator()
        >>> cal.quantiles_ = {g: (-0.1, 0.1, 50) for g in NOVELTY_GROUPS}
        >>> cal.quantiles_["new_type"] = (-0.5, 0.05, 40)
        >>> lo, hi = cal.offsets(np.array([2, 2]), new_type=np.array([False, True]))
        >>> lo.tolist(), hi.tolist()
        ([-0.1, -0.5], [0.1, 0.1])
        """
        if not self.quantiles_:
            raise ModelError("this IntervalCalibrator is not fitted yet; call fit() first")
        # (group, cell, lo/hi): the group's interval, then each vendor cell's where calibrated.
        cells = ("", *(f"/{kind}" for kind in VENDOR_CELLS))
        table = np.array([[self.quantiles_.get(name + c, self.quantiles_[name])[:2]
                           for c in cells] for name in NOVELTY_GROUPS])
        g = np.asarray(groups, dtype=np.int64)
        c = np.zeros(len(g), dtype=np.int64) if new_vendor is None else \
            1 + np.asarray(new_vendor, dtype=np.int64)
        lo, hi = table[g, c, 0], table[g, c, 1]
        for name, rows in ((NEW_TYPE, new_type), (NEW_MODEL_TYPE, new_model_type),
                           (NEW_TRAINER_COUNT, new_trainer_count)):
            if rows is not None and name in self.quantiles_:
                q_lo, q_hi, _ = self.quantiles_[name]
                new = np.asarray(rows, dtype=bool)
                lo = np.where(new, np.minimum(lo, q_lo), lo)
                hi = np.where(new, np.maximum(hi, q_hi), hi)
        return lo, hi

    def to_json(self) -> str:
        return json.dumps({"coverage": self.coverage, "min_rows": self.min_rows,
                           "groups": {k: list(v) for k, v in self.quantiles_.items()}},
                          indent=2)

    @classmethod
    def from_json(cls, text: str) -> IntervalCalibrator:
        try:
            d = json.loads(text)
            cal = cls(coverage=float(d["coverage"]), min_rows=int(d["min_rows"]))
            cal.quantiles_ = {k: (float(v[0]), float(v[1]), int(v[2]))
                              for k, v in d["groups"].items()}
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ArtifactError(f"intervals.json is unreadable: {exc}") from None
        missing = set(NOVELTY_GROUPS) - set(cal.quantiles_)
        if missing:
            raise ArtifactError(f"intervals.json lacks groups {sorted(missing)}; retrain")
        return cal
