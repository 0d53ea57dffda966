"""Lookup-table baseline (keys, coverage, both weightings) and the simple ranking baselines."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leap.catalog import Catalog
from leap.errors import DataError, ModelError
from leap.eval.baselines import (
    LOOKUP_KEY,
    LookupTable,
    Predictor,
    SpecRatioTransfer,
    cheapest_order,
    family_usage,
    fastest_peak_order,
    gpu_hours,
    lookup_comparison,
    most_used_order,
    transfer_comparison,
)


def attempts(rows: list[tuple[str, str, int, int, str, float | None]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["family_id", "hardware", "trainer_count", "batch_size",
                                       "status", "throughput"])


CAT = Catalog.default()
PAST = attempts([
    ("f", "A", 1, 8, "succeeded", 10.0),
    ("f", "A", 1, 8, "succeeded", 30.0),
    ("f", "A", 1, 8, "succeeded", 20.0),
    ("f", "A", 1, 8, "failed", None),
    ("f", "A", 1, 8, "oom", 999.0),      # an outcome other than success never counts
    ("f", "A", 2, 8, "succeeded", 50.0),
    ("f", "B", 1, 8, "succeeded", 5.0),
    ("g", "A", 1, 16, "succeeded", 7.0),
])


def test_every_study_predictor_follows_one_contract() -> None:
    # The held-out-day baselines and the real-data predictors: fit(attempts, catalog) returns
    # the fitted predictor, predict(jobs) one estimate per row.
    from leap.eval.real_baselines import baseline_predictors
    from leap.eval.real_data import learned_predictor

    held_out_day: list[Predictor] = [LookupTable(), SpecRatioTransfer()]
    for p in held_out_day:
        assert p.fit(PAST, CAT) is p and p.predict(PAST).shape == (len(PAST),)
    real_data = [*baseline_predictors().values(), learned_predictor()]
    assert real_data and all(isinstance(p, Predictor) for p in real_data)



def test_the_table_answers_the_median_of_the_exact_key_only() -> None:
    table = LookupTable().fit(PAST, CAT)
    jobs = attempts([
        ("f", "A", 1, 8, "succeeded", 1.0),    # median of 10, 30, 20
        ("f", "A", 2, 8, "succeeded", 1.0),    # its own trainer count
        ("f", "A", 4, 8, "succeeded", 1.0),    # another trainer count: not covered
        ("f", "A", 1, 16, "succeeded", 1.0),   # another batch: not covered
        ("f", "C", 1, 8, "succeeded", 1.0),    # another hardware: not covered
        ("h", "A", 1, 8, "succeeded", 1.0),    # another family: not covered
        ("g", "A", 1, 16, "succeeded", 1.0),
    ])
    pred = table.predict(jobs)
    assert pred[:2].tolist() == [20.0, 50.0]
    assert np.isnan(pred[2:6]).all()
    assert pred[6] == 7.0
    assert LOOKUP_KEY == ("family_id", "hardware", "trainer_count", "batch_size")


def test_min_count_and_errors() -> None:
    table = LookupTable(min_count=2).fit(PAST, CAT)
    pred = table.predict(PAST.iloc[[0, 5]])
    assert pred[0] == 20.0 and np.isnan(pred[1])
    with pytest.raises(ModelError, match="not fitted yet"):
        LookupTable().predict(PAST)
    with pytest.raises(ModelError, match="min_count must be >= 1"):
        LookupTable(min_count=0).fit(PAST, CAT)
    with pytest.raises(DataError, match="lack column"):
        LookupTable().fit(PAST.drop(columns=["batch_size"]), CAT)
    with pytest.raises(DataError, match="lack key column"):
        LookupTable().fit(PAST, CAT).predict(PAST.drop(columns=["hardware"]))
    assert LookupTable().fit(PAST, CAT).predict(PAST.iloc[:0]).shape == (0,)


def test_gpu_hours_are_devices_times_duration() -> None:
    jobs = pd.DataFrame({"trainer_count": [2, 1, 3], "devices_per_trainer": [8, None, 1],
                         "duration_hours": [1.5, 4.0, None]})
    assert gpu_hours(jobs).tolist() == [24.0, 4.0, 0.0]
    assert gpu_hours(jobs.drop(columns=["duration_hours"])).tolist() == [0.0, 0.0, 0.0]


def test_lookup_comparison_by_hand_in_both_weightings() -> None:
    # Held-out day: 4 attempts. The table covers rows 0-2 (median 20, 50, 7).
    day = attempts([
        ("f", "A", 1, 8, "succeeded", 21.0),   # table 20: within; LEAP 30: miss
        ("f", "A", 2, 8, "succeeded", 100.0),  # table 50: miss;   LEAP 95: within
        ("g", "A", 1, 16, "succeeded", 7.0),   # table 7: within;  LEAP 7.5: within
        ("h", "A", 1, 8, "succeeded", 10.0),   # not covered;      LEAP 11: within
    ]).assign(devices_per_trainer=[1, 1, 1, 1], duration_hours=[1.0, 10.0, 1.0, 2.0])
    # GPU-hours: trainers x devices x hours = 1, 20, 1, 2.
    leap = np.array([30.0, 95.0, 7.5, 11.0])
    r = lookup_comparison(PAST, day, leap)
    assert r.n == 4 and r.n_covered == 3
    assert r.table_coverage == pytest.approx(3 / 4)
    assert r.table_coverage_gpu_hours == pytest.approx(22 / 24)
    assert r.leap_coverage == 1.0
    assert r.table_accuracy_covered == pytest.approx(2 / 3)
    assert r.leap_accuracy_covered == pytest.approx(2 / 3)
    assert r.table_accuracy_covered_gpu_hours == pytest.approx(2 / 22)
    assert r.leap_accuracy_covered_gpu_hours == pytest.approx(21 / 22)
    assert r.leap_accuracy_all == pytest.approx(3 / 4)
    assert r.leap_accuracy_all_gpu_hours == pytest.approx(23 / 24)
    assert r.table_accuracy_all == pytest.approx(2 / 4)
    # |20/21 - 1| = 0.048, |50/100 - 1| = 0.5, 0 -> median 0.048.
    assert r.table_median_ape_covered == pytest.approx(1 / 21)
    with pytest.raises(DataError, match="one per held-out attempt"):
        lookup_comparison(PAST, day, leap[:2])


def test_a_missing_leap_prediction_costs_coverage_and_counts_as_a_miss() -> None:
    day = attempts([("f", "A", 1, 8, "succeeded", 20.0), ("h", "A", 1, 8, "succeeded", 10.0)])
    r = lookup_comparison(PAST, day, np.array([np.nan, 10.0]))
    assert r.leap_coverage == 0.5
    assert r.leap_accuracy_covered == 0.0
    assert r.leap_accuracy_all == 0.5
    assert math.isnan(r.table_accuracy_covered_gpu_hours)  # no duration_hours: no weight


NAMES = list(CAT)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(NAMES), min_size=1, max_size=8, unique=True), st.randoms())
def test_baseline_orders_do_not_depend_on_candidate_order(cands: list[str], rnd: object) -> None:
    shuffled = list(cands)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    usage = {cands[0]: 3}
    assert cheapest_order(cands, CAT) == cheapest_order(shuffled, CAT)
    assert fastest_peak_order(cands, CAT) == fastest_peak_order(shuffled, CAT)
    assert most_used_order(cands, usage, CAT) == most_used_order(shuffled, usage, CAT)
    costs = [CAT[n].cost_per_device_hour for n in cheapest_order(cands, CAT)]
    assert costs == sorted(costs)
    peaks = [CAT[n].peak_bf16_tflops for n in fastest_peak_order(cands, CAT)]
    assert peaks == sorted(peaks, reverse=True)
    assert most_used_order(cands, usage, CAT)[0] == cands[0]


def test_most_used_order_uses_the_family_history() -> None:
    past = pd.DataFrame({"family_id": ["f", "f", "f", "g"],
                         "hardware": ["H100-SXM", "L4", "H100-SXM", "T4"]})
    usage = family_usage(past)
    assert usage == {"f": {"H100-SXM": 2, "L4": 1}, "g": {"T4": 1}}
    assert most_used_order(["L4", "A40", "H100-SXM"], usage["f"], CAT) == [
        "H100-SXM", "L4", "A40"]
    # No history: cheapest first (A40 and L4 cost the same; the name breaks the tie).
    assert most_used_order(["H100-SXM", "L4", "A40"], {}, CAT) == ["A40", "L4", "H100-SXM"]


def _runs(rows: list[tuple[str, str, int, float]]) -> pd.DataFrame:
    """(family, hardware, batch, throughput) rows of one-device bf16 attempts that succeeded."""
    return pd.DataFrame([{"family_id": f, "hardware": h, "trainer_count": 1,
                          "devices_per_trainer": 1, "batch_size": b, "precision": "bf16",
                          "status": "succeeded", "throughput": t} for f, h, b, t in rows])


def test_spec_ratio_transfer_scales_by_specs_prefers_the_same_shape_and_takes_the_median() -> None:
    cat = Catalog.default()

    def ratio(h: str, g: str) -> float:
        return math.sqrt(cat[h].peak_bf16_tflops / cat[g].peak_bf16_tflops
                         * cat[h].mem_bw_gb_per_s / cat[g].mem_bw_gb_per_s)

    past = _runs([("f", "A100-SXM4-80GB", 8, 100.0), ("f", "A100-SXM4-80GB", 16, 400.0),
                  ("f", "L4", 8, 30.0), ("g", "H100-SXM", 8, 1.0)])
    rule = SpecRatioTransfer().fit(past, cat)
    est = rule.predict(_runs([("f", "H100-SXM", 8, 0.0), ("f", "H100-SXM", 32, 0.0),
                              ("new", "H100-SXM", 8, 0.0), ("f", "L4", 8, 0.0)]))
    # Same shape on both references: the median of the two scaled figures.
    want = np.median([100.0 * ratio("H100-SXM", "A100-SXM4-80GB"), 30.0 * ratio("H100-SXM", "L4")])
    assert est[0] == pytest.approx(want)
    # A shape the family never ran: the median over all its runs on each type (250 on A100).
    assert est[1] == pytest.approx(np.median([250.0 * ratio("H100-SXM", "A100-SXM4-80GB"),
                                              30.0 * ratio("H100-SXM", "L4")]))
    assert math.isnan(est[2])                       # a family with no history
    # The type's own history is never used for itself (it is a transfer rule).
    assert est[3] == pytest.approx(100.0 * ratio("L4", "A100-SXM4-80GB"))
    with pytest.raises(ModelError, match="not fitted"):
        SpecRatioTransfer().predict(past)


def test_transfer_comparison_scores_both_on_the_unobserved_rows_the_rule_answers() -> None:
    cat = Catalog.default()
    past = _runs([("f", "A100-SXM4-80GB", 8, 100.0), ("g", "A100-SXM4-80GB", 8, 50.0),
                  ("g", "L4", 8, 10.0), ("g", "T4", 8, 5.0)])
    # f ran on one type, g on three; the A100 rows are observed pairs and are left out.
    day = _runs([("f", "H100-SXM", 8, 250.0), ("g", "H100-SXM", 8, 100.0),
                 ("f", "A100-SXM4-80GB", 8, 100.0), ("new", "H100-SXM", 8, 9.0)])
    leap = np.array([240.0, 300.0, 100.0, 9.0])
    r = transfer_comparison(past, day, leap, cat)
    assert r.unobserved_pair_1.n == 1 and r.unobserved_pair_3plus.n == 1
    assert r.unobserved_pair_2.n == 0 and r.all.n == 2
    assert r.unobserved_pair_1.leap_accuracy == 1.0       # 240 vs 250
    assert r.unobserved_pair_3plus.leap_accuracy == 0.0   # 300 vs 100
    est = SpecRatioTransfer().fit(past, cat).predict(day)
    assert r.unobserved_pair_1.rule_accuracy == float(abs(est[0] / 250.0 - 1) <= 0.2)
