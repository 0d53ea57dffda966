"""Prediction intervals (conformal per novelty group) and the risk-aware order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from leap.errors import ArtifactError, ModelError
from leap.features.encode import NOVELTY_GROUPS
from leap.model.intervals import IntervalCalibrator, _conformal
from leap.rank.policy import CAUTIOUS_Z, _sort_key, order_ranking
from leap.rank.results import RankedType

G = {name: i for i, name in enumerate(NOVELTY_GROUPS)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_intervals_cover_their_nominal_share_in_every_group(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sd = {"seen_config": 0.05, "seen_pair_new_shape": 0.15, "unobserved_pair_1": 0.6,
          "unobserved_pair_2": 0.4, "unobserved_pair_3plus": 0.3, "new_family": 0.8}
    skew = {"unobserved_pair_1": 0.3}  # an asymmetric group: overpredicted more often

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        groups = np.repeat(np.arange(len(NOVELTY_GROUPS)), n)
        resid = np.concatenate([rng.normal(-skew.get(g, 0.0), sd[g], n)
                                for g in NOVELTY_GROUPS])
        return resid, groups

    cal = IntervalCalibrator(coverage=0.8).fit(*draw(1000))
    resid, groups = draw(4000)
    lo, hi = cal.offsets(groups)
    inside = (resid >= lo) & (resid <= hi)
    for name, i in G.items():
        assert 0.77 <= inside[groups == i].mean() <= 0.83, (name, inside[groups == i].mean())
    width = {g: float(hi[groups == i][0] - lo[groups == i][0]) for g, i in G.items()}
    assert width["seen_config"] < width["seen_pair_new_shape"] < width["unobserved_pair_1"]


def test_coverage_confidence_resamples_whole_families() -> None:
    from leap.metrics import cluster_interval, effective_clusters
    from leap.model.train import by_novelty

    rng = np.random.default_rng(0)
    # 600 rows, 80% inside: as 600 independent rows, then as 12 families of 50 rows that are
    # inside or outside together (a family's efficiency moves all its attempts).
    inside = rng.uniform(size=600) < 0.8
    lo_rows, hi_rows = cluster_interval(inside, np.arange(600))
    fam = np.repeat(np.arange(12), 50)
    together = np.repeat(np.arange(12) % 4 != 0, 50)            # 9 of 12 families inside
    lo_fam, hi_fam = cluster_interval(together, fam)
    assert lo_rows <= inside.mean() <= hi_rows and hi_rows - lo_rows < 0.1
    assert lo_fam <= together.mean() <= hi_fam and hi_fam - lo_fam > 0.25
    assert cluster_interval(together, fam) == (lo_fam, hi_fam)  # seeded: reproducible
    assert cluster_interval(np.empty(0, bool), np.empty(0)) is None
    # One busy family and nine small ones are worth under two families.
    busy = np.r_[np.zeros(91), np.arange(1, 10)]
    assert 1.0 < effective_clusters(busy) < 1.3

    # by_novelty carries both, per group, beside the shares it always gave.
    y = np.zeros(600)
    pred = np.where(together, 0.0, 1.0)      # misses are outside a +-0.5 interval
    group = np.full(600, G["new_family"])
    out = by_novelty(pred, y, group, (pred - 0.5, pred + 0.5), fam.astype(str))
    g = out["new_family"]
    assert g.interval_coverage == pytest.approx(together.mean())
    assert g.accuracy == pytest.approx(together.mean())
    assert g.effective_families == pytest.approx(12.0)
    assert g.interval_coverage_ci == (lo_fam, hi_fam)
    assert by_novelty(pred, y, group).get("new_family").effective_families is None


def test_conformal_quantiles_use_finite_sample_ranks() -> None:
    # 9 residuals 1..9 at 80%: ranks floor(10 * 0.1) = 1 and ceil(10 * 0.9) = 9.
    assert _conformal(np.arange(9, 0, -1, dtype=float), 0.2) == (1.0, 9.0)
    assert _conformal(np.arange(1.0, 100.0), 0.2) == (10.0, 90.0)


def test_small_groups_borrow_the_pooled_unobserved_interval() -> None:
    rng = np.random.default_rng(0)
    groups = np.r_[np.full(500, G["seen_config"]), np.full(400, G["unobserved_pair_1"]),
                   np.full(5, G["unobserved_pair_2"])]
    resid = np.r_[rng.normal(0, 0.05, 500), rng.normal(0, 0.5, 405)]
    cal = IntervalCalibrator(coverage=0.8, min_rows=30).fit(resid, groups)
    assert cal.quantiles_["unobserved_pair_2"][2] == 0  # borrowed, not measured
    wide = cal.quantiles_["unobserved_pair_2"][1] - cal.quantiles_["unobserved_pair_2"][0]
    assert wide > 5 * (cal.quantiles_["seen_config"][1] - cal.quantiles_["seen_config"][0])
    again = IntervalCalibrator.from_json(cal.to_json())
    assert again.quantiles_ == cal.quantiles_


def test_unobserved_pairs_are_calibrated_per_vendor_kind() -> None:
    """A family that never ran on the target's vendor is predicted less surely than one
    moving to another type of a vendor it knows: one interval per group would cover the
    first too often and the second too rarely."""
    rng = np.random.default_rng(5)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        groups = np.r_[np.full(n, G["seen_config"]), np.full(2 * n, G["unobserved_pair_1"]),
                       np.full(n + 10, G["unobserved_pair_2"])]
        nv = np.r_[np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool),
                   np.zeros(n, bool), np.ones(10, bool)]  # too few new-vendor rows in group 2
        resid = np.r_[rng.normal(0, 0.05, n), rng.normal(0, 0.2, n), rng.normal(0, 0.6, n),
                      rng.normal(0, 0.3, n + 10)]
        return resid, groups, nv

    resid, groups, nv = draw(1500)
    cal = IntervalCalibrator(coverage=0.8).fit(resid, groups, new_vendor=nv)
    assert {"unobserved_pair_1/vendor_seen", "unobserved_pair_1/new_vendor",
            "unobserved_pair_2/vendor_seen"} <= set(cal.quantiles_)
    assert "unobserved_pair_2/new_vendor" not in cal.quantiles_  # 10 rows: the group's
    resid, groups, nv = draw(4000)
    lo, hi = cal.offsets(groups, nv)
    inside = (resid >= lo) & (resid <= hi)
    for kind in (nv, ~nv):
        at = (groups == G["unobserved_pair_1"]) & kind
        assert 0.77 <= inside[at].mean() <= 0.83
    # Without the vendor kind the pooled group interval misses both ways.
    plo, phi = cal.offsets(groups)
    pooled = (resid >= plo) & (resid <= phi)
    assert pooled[(groups == G["unobserved_pair_1"]) & ~nv].mean() > 0.9
    assert pooled[(groups == G["unobserved_pair_1"]) & nv].mean() < 0.7
    small = (groups == G["unobserved_pair_2"]) & nv
    np.testing.assert_array_equal(lo[small], plo[small])
    assert IntervalCalibrator.from_json(cal.to_json()).quantiles_ == cal.quantiles_


def test_calibrator_refuses_bad_input_clearly() -> None:
    with pytest.raises(ModelError, match="not fitted"):
        IntervalCalibrator().offsets(np.array([0]))
    with pytest.raises(ModelError, match="calibration rows"):
        IntervalCalibrator().fit(np.zeros(3), np.zeros(3))
    with pytest.raises(ModelError, match="coverage"):
        IntervalCalibrator(coverage=1.5).fit(np.zeros(100), np.zeros(100))
    with pytest.raises(ArtifactError, match=r"intervals\.json"):
        IntervalCalibrator.from_json("{}")


def _entry(name: str, tp: float, lo: float | None, cost: float = 1.0) -> RankedType:
    return RankedType(name, tp, cost, tp * 3600 / cost, None, None, 1, cost, False, (),
                      lo, None if lo is None else tp * 2, None)


def test_averse_order_prefers_a_sure_type_over_a_larger_but_uncertain_estimate() -> None:
    sure = _entry("A40", 100.0, 90.0)          # ran there: narrow interval
    guess = _entry("Gaudi3", 130.0, 50.0)      # never ran there: higher median, wide
    entries = [guess, sure]
    averse = sorted(entries, key=lambda r: _sort_key(r, "value", "averse"))
    neutral = sorted(entries, key=lambda r: _sort_key(r, "value", "neutral"))
    assert [r.hardware for r in averse] == ["A40", "Gaudi3"]
    assert [r.hardware for r in neutral] == ["Gaudi3", "A40"]
    # A guess whose low end still beats the sure type wins under both rules.
    strong = _entry("H100-SXM", 300.0, 120.0)
    assert sorted([sure, strong], key=lambda r: _sort_key(r, "value", "averse"))[0] is strong


def test_risk_rules_use_cost_and_fall_back_to_the_median_without_interval() -> None:
    cheap = _entry("L4", 50.0, 45.0, cost=0.5)      # value at p10: 45 / 0.5 = 90 per hour
    fast = _entry("H100-SXM", 200.0, 160.0, cost=2.0)  # 160 / 2 = 80
    assert sorted([fast, cheap], key=lambda r: _sort_key(r, "value", "averse"))[0] is cheap
    assert sorted([fast, cheap], key=lambda r: _sort_key(r, "throughput", "averse"))[0] is fast
    bare = _entry("T4", 95.0, None)
    assert _sort_key(bare, "value", "averse") == _sort_key(bare, "value", "neutral")
    tie = [_entry("B", 100.0, 80.0), _entry("A", 100.0, 80.0)]
    assert [r.hardware for r in sorted(tie, key=lambda r: _sort_key(r, "value", "averse"))] \
        == ["A", "B"]


def _banded(name: str, tp: float, sd: float, cost: float) -> RankedType:
    """An entry whose 80% interval is exp(+-1.2816 sd) around ``tp``."""
    f = math.exp(1.2815515655446004 * sd)
    return RankedType(name, tp, cost, tp * 3600 / cost, None, None, 1, cost, False, (),
                      tp / f, tp * f, None)


def test_cautious_order_leaves_the_cheapest_type_only_for_a_confident_gain() -> None:
    cheap = _banded("T4", 100.0, 0.1, cost=1.0)
    # 10% more value, but the guess has sd 0.5: z = log(1.1) / hypot(0.5, 0.1) = 0.19, below
    # CAUTIOUS_Z.
    assert math.log(1.1) / math.hypot(0.5, 0.1) < CAUTIOUS_Z
    guess = _banded("Gaudi3", 220.0, 0.5, cost=2.0)
    # 30% more value known to sd 0.1: z = 0.262 / 0.141 = 1.86.
    sure = _banded("A40", 195.0, 0.1, cost=1.5)
    assert [r.hardware for r in order_ranking([guess, cheap], "value", "neutral")] \
        == ["Gaudi3", "T4"]
    assert [r.hardware for r in order_ranking([guess, cheap], "value", "cautious")] \
        == ["T4", "Gaudi3"]
    # A confident gain moves ahead; the unconfident one stays behind the cheapest, and the
    # types ahead and behind keep their value order.
    assert [r.hardware for r in order_ranking([guess, cheap, sure], "value", "cautious")] \
        == ["A40", "T4", "Gaudi3"]
    # The threshold is exactly CAUTIOUS_Z standard errors.
    sd = math.hypot(0.5, 0.1)
    edge = _banded("H100", 100.0 * math.exp(CAUTIOUS_Z * sd) * 1.001 * 2, 0.5, cost=2.0)
    assert order_ranking([edge, cheap], "value", "cautious")[0] is edge
    below = _banded("H100", 100.0 * math.exp(CAUTIOUS_Z * sd) * 0.999 * 2, 0.5, cost=2.0)
    assert order_ranking([below, cheap], "value", "cautious")[0] is cheap
    # Without intervals, and for the throughput objective, cautious is neutral.
    bare = [_entry("B", 120.0, None, cost=2.0), _entry("A", 100.0, None)]
    assert order_ranking(bare, "value", "cautious") == order_ranking(bare, "value", "neutral")
    both = [guess, cheap, sure]
    assert order_ranking(both, "throughput", "cautious") == \
        order_ranking(both, "throughput", "neutral")


def test_natural_rows_guard_the_masked_calibration() -> None:
    """Masked rows are easier than real new families and unobserved pairs: the calibrator
    uses natural new families, and widens unobserved groups to the natural ones' interval."""
    rng = np.random.default_rng(3)
    n = 600
    groups = np.r_[np.full(n, G["new_family"]), np.full(n, G["new_family"]),
                   np.full(n, G["unobserved_pair_3plus"]), np.full(n, G["unobserved_pair_1"])]
    masked = np.r_[np.ones(n, bool), np.zeros(n, bool), np.ones(n, bool), np.zeros(n, bool)]
    resid = np.r_[rng.normal(0, 0.2, n), rng.normal(0, 0.8, n), rng.normal(0, 0.2, n),
                  rng.normal(0, 0.6, n)]
    cal = IntervalCalibrator().fit(resid, groups, masked)
    lo, hi, used = cal.quantiles_["new_family"]
    assert used == n and hi - lo > 1.5  # the natural new families' spread (about 2.05)
    lo3, hi3, _ = cal.quantiles_["unobserved_pair_3plus"]
    assert hi3 - lo3 > 1.2  # widened from the masked rows' ~0.5 by the natural unobserved ones


def test_new_family_interval_is_the_union_of_natural_and_masked_families() -> None:
    """A day's natural new families are a handful of families: when their residuals happen
    to be narrow, the families masked whole still widen the interval (and never narrow it)."""
    rng = np.random.default_rng(4)
    n = 600
    groups = np.full(2 * n, G["new_family"])
    masked = np.r_[np.ones(n, bool), np.zeros(n, bool)]
    natural = rng.normal(0.3, 0.1, n)  # a few families, all a little under-predicted
    resid = np.r_[rng.normal(0, 0.5, n), natural]
    lo, hi, used = IntervalCalibrator().fit(resid, groups, masked).quantiles_["new_family"]
    m_lo, m_hi = np.quantile(resid[:n], [0.1, 0.9])
    n_lo, n_hi = np.quantile(natural, [0.1, 0.9])
    assert used == n
    assert lo <= min(m_lo, n_lo) + 0.02 and hi >= max(m_hi, n_hi) - 0.02


def test_new_family_interval_weighs_each_family_once() -> None:
    """One busy new family (its 300 attempts share its efficiency) must not set the
    interval that the other 90 families' attempts will meet; with one row per family the
    family weighting is the plain conformal interval, rank for rank."""
    rng = np.random.default_rng(7)
    small = rng.normal(0.0, 0.5, 90)
    resid = np.r_[np.full(300, 2.0), small]
    family = np.r_[np.zeros(300), np.arange(1, 91)]
    groups = np.full(len(resid), G["new_family"])
    by_rows = IntervalCalibrator().fit(resid, groups).quantiles_["new_family"]
    by_family = IntervalCalibrator().fit(resid, groups, family=family).quantiles_["new_family"]
    assert by_rows[1] == 2.0                              # the busy family sets the top
    s_lo, s_hi = np.quantile(small, [0.1, 0.9])
    assert by_family[1] < 1.0 and abs(by_family[1] - s_hi) < 0.25
    assert abs(by_family[0] - s_lo) < 0.25
    one_each = IntervalCalibrator().fit(small, groups[:90], family=np.arange(90))
    assert one_each.quantiles_ == IntervalCalibrator().fit(small, groups[:90]).quantiles_
    # Only the new-family group is weighed by family.
    seen = np.full(len(resid), G["seen_config"])
    assert IntervalCalibrator().fit(resid, seen, family=family).quantiles_["seen_config"] \
        == IntervalCalibrator().fit(resid, seen).quantiles_["seen_config"]


def test_rows_on_a_type_new_to_the_window_take_the_wider_new_type_interval() -> None:
    """Rows encoded as if nobody had run on their type calibrate one more cell; a row on
    such a type is covered by it where its group's interval is too narrow, and keeps its
    group's side where that is the wider one. Without enough such rows, nothing changes."""
    rng = np.random.default_rng(6)
    n = 3000
    groups = np.full(n, G["unobserved_pair_2"])
    cal = IntervalCalibrator().fit(rng.normal(0, 0.2, n), groups,
                                   new_type_resid=rng.normal(0.3, 0.6, 1000))
    lo_t, hi_t, used = cal.quantiles_["new_type"]
    assert used == 1000 and hi_t - lo_t > 1.2
    truth = rng.normal(0.3, 0.6, n)  # rows on a new type
    lo, hi = cal.offsets(groups, new_type=np.ones(n, bool))
    assert 0.77 <= ((truth >= lo) & (truth <= hi)).mean() <= 0.83
    plain_lo, plain_hi = cal.offsets(groups)
    assert ((truth >= plain_lo) & (truth <= plain_hi)).mean() < 0.5
    # A side where the group is wider stays the group's.
    cal.quantiles_["new_type"] = (-0.05, 2.0, 1000)
    lo, hi = cal.offsets(groups[:1], new_type=np.ones(1, bool))
    assert lo[0] == plain_lo[0] and hi[0] == 2.0
    assert IntervalCalibrator.from_json(cal.to_json()).quantiles_ == cal.quantiles_
    few = IntervalCalibrator().fit(rng.normal(0, 0.2, n), groups,
                                   new_type_resid=rng.normal(0, 1.0, 29))
    assert "new_type" not in few.quantiles_
    np.testing.assert_array_equal(few.offsets(groups, new_type=np.ones(n, bool))[0],
                                  few.offsets(groups)[0])


def test_rows_of_a_model_type_new_to_the_window_take_the_wider_cell() -> None:
    """The new-model-type cell widens a row as the new-type cell does, and only the rows it
    is asked for; both cells apply together, each side the widest."""
    rng = np.random.default_rng(7)
    n = 2000
    groups = np.full(n, G["new_family"])
    cal = IntervalCalibrator().fit(rng.normal(0, 0.3, n), groups,
                                   new_type_resid=rng.normal(0, 0.5, 500),
                                   new_model_type_resid=rng.normal(0, 1.5, 500))
    lo_m, hi_m, used = cal.quantiles_["new_model_type"]
    assert used == 500 and hi_m - lo_m > 3.0
    truth = rng.normal(0, 1.5, n)
    which = np.arange(n) % 2 == 0
    lo, hi = cal.offsets(groups, new_model_type=which)
    inside = (truth >= lo) & (truth <= hi)
    assert 0.76 <= inside[which].mean() <= 0.84 and inside[~which].mean() < 0.5
    both_lo, both_hi = cal.offsets(groups, new_type=np.ones(n, bool), new_model_type=which)
    np.testing.assert_array_equal(both_lo[which], lo[which])
    np.testing.assert_array_equal(both_hi[which], hi[which])
    assert np.all(both_lo[~which] <= lo[~which]) and np.all(both_hi[~which] >= hi[~which])
    assert np.any(both_hi[~which] > hi[~which])
    assert IntervalCalibrator.from_json(cal.to_json()).quantiles_ == cal.quantiles_


def test_a_trainer_count_new_to_its_pair_takes_the_union_of_natural_and_hidden_rows() -> None:
    """The new-trainer-count cell is, on each side, the wider of the natural rows' interval
    and the hidden rows', each where there are enough rows; it widens only the rows it is
    asked for."""
    rng = np.random.default_rng(8)
    n = 2000
    groups = np.full(n, G["seen_pair_new_shape"])
    natural, hidden = rng.normal(-0.2, 0.4, 400), rng.normal(0.1, 0.2, 3000)
    resid = np.r_[natural, hidden]
    is_hidden = np.r_[np.zeros(400, bool), np.ones(3000, bool)]
    cal = IntervalCalibrator().fit(rng.normal(0, 0.1, n), groups,
                                   new_trainer_count_resid=resid,
                                   new_trainer_count_hidden=is_hidden)
    lo_c, hi_c, used = cal.quantiles_["new_trainer_count"]
    nat, hid = _conformal(natural, 0.2), _conformal(hidden, 0.2)
    assert used == 3400 and lo_c == nat[0] and hi_c == max(nat[1], hid[1])
    which = np.arange(n) % 2 == 0
    lo, hi = cal.offsets(groups, new_trainer_count=which)
    plain_lo, plain_hi = cal.offsets(groups)
    np.testing.assert_array_equal(lo[~which], plain_lo[~which])
    np.testing.assert_array_equal(hi[~which], plain_hi[~which])
    assert np.all(lo[which] == lo_c) and np.all(hi[which] == hi_c)
    assert IntervalCalibrator.from_json(cal.to_json()).quantiles_ == cal.quantiles_
    # Too few natural rows (a public table's window): the hidden rows alone.
    few = IntervalCalibrator().fit(rng.normal(0, 0.1, n), groups,
                                   new_trainer_count_resid=np.r_[natural[:29], hidden],
                                   new_trainer_count_hidden=np.r_[np.zeros(29, bool),
                                                                  np.ones(3000, bool)])
    assert few.quantiles_["new_trainer_count"][:2] == hid
    none = IntervalCalibrator().fit(rng.normal(0, 0.1, n), groups,
                                    new_trainer_count_resid=natural[:29])
    assert "new_trainer_count" not in none.quantiles_
