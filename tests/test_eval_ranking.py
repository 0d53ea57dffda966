"""Ranking quality: metric definitions by hand, and regret against a brute-force oracle."""

from __future__ import annotations

import itertools
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import DataError
from leap.eval.ranking import (
    METHODS,
    RankingFigures,
    eligible_names,
    job_requests,
    leap_rankings,
    oracle_order,
    order_quality,
    policy_values,
    random_quality,
    ranking_study,
    summarize_quality,
    true_values,
    unfiltered,
)
from leap.model.artifact import Registry
from leap.model.window import load_attempts
from leap.rank.ranker import Ranker
from leap.sim.fleet import Fleet
from leap.sim.scenario import Scenario

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_order_quality_by_hand() -> None:
    v = {"A": 10.0, "B": 5.0, "C": 2.0}
    best = order_quality(["A", "B", "C"], v)
    assert best == {"top1": 1.0, "regret": 0.0, "ndcg": 1.0}
    q = order_quality(["B", "A", "C"], v)
    assert q["top1"] == 0.0 and q["regret"] == 0.5
    dcg = 0.5 + 1.0 / math.log2(3) + 0.2 / 2.0
    idcg = 1.0 + 0.5 / math.log2(3) + 0.2 / 2.0
    assert q["ndcg"] == pytest.approx(dcg / idcg)
    # A list that leaves the best type out is penalised by NDCG, and regret counts the pick.
    short = order_quality(["B"], v)
    assert short["regret"] == 0.5 and short["ndcg"] == pytest.approx(0.5 / idcg)


def test_ties_nan_and_empty_are_explicit() -> None:
    tied = {"A": 4.0, "B": 4.0, "C": 1.0}
    assert order_quality(["B", "A", "C"], tied)["top1"] == 1.0  # any best type counts
    assert order_quality(["B", "A", "C"], tied)["regret"] == 0.0
    # A type that would not run (NaN truth) has value 0: full regret when picked.
    assert order_quality(["C", "A"], {"A": 2.0, "C": float("nan")})["regret"] == 1.0
    empty = order_quality([], tied)
    assert all(math.isnan(x) for x in empty.values())
    assert all(math.isnan(x) for x in order_quality(["A"], {"A": 0.0}).values())
    with pytest.raises(DataError, match="not among the candidates"):
        order_quality(["Z"], tied)


def test_random_quality_is_the_average_over_all_orders() -> None:
    v = {"A": 10.0, "B": 5.0, "C": 2.0, "D": 10.0}
    orders = list(itertools.permutations(v))
    brute = {k: float(np.mean([order_quality(list(o), v)[k] for o in orders]))
             for k in ("top1", "regret", "ndcg")}
    assert random_quality(v) == pytest.approx(brute)


def test_summaries_in_both_weightings() -> None:
    per_job = [{"top1": 1.0, "regret": 0.0, "ndcg": 1.0},
               {"top1": 0.0, "regret": 0.5, "ndcg": 0.6},
               {"top1": math.nan, "regret": math.nan, "ndcg": math.nan},  # skipped
               {"top1": 0.0, "regret": 0.2, "ndcg": 0.8}]
    s = summarize_quality(per_job, np.array([1.0, 3.0, 100.0, 0.0]))
    assert s["n"] == 3
    assert s["top1_agreement"] == pytest.approx(1 / 3)
    assert s["mean_regret"] == pytest.approx(0.7 / 3)
    assert s["median_regret"] == pytest.approx(0.2)
    assert s["mean_ndcg"] == pytest.approx(2.4 / 3)
    assert s["top1_agreement_gpu_hours"] == pytest.approx(1 / 4)
    assert s["mean_regret_gpu_hours"] == pytest.approx(1.5 / 4)
    assert summarize_quality([])["n"] == 0


def test_job_requests_carry_launch_time_fields_only() -> None:
    frame = pd.DataFrame({"family_id": ["f"], "model_type": ["m"], "trainer_count": [np.int64(2)],
                          "batch_size": [8], "throughput": [1.0], "status": ["succeeded"],
                          "hardware": ["L4"], "num_params": [np.nan]})
    (req,) = job_requests(frame)
    assert req == {"family_id": "f", "model_type": "m", "trainer_count": 2, "batch_size": 8}
    assert type(req["trainer_count"]) is int


# Brute force on a tiny fleet ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> tuple[Fleet, pd.DataFrame]:
    scenario = Scenario.load().override(initial_families=30, n_model_types=10,
                                        attempts_per_day=200)
    fleet = Fleet(scenario, Catalog.default(), seed=5, start=T0)
    jobs = fleet.base_jobs(np.arange(12)).to_pandas()
    jobs["submitted_at"] = pd.Timestamp(T0 + timedelta(days=12, hours=3))
    return fleet, jobs


def test_true_values_and_best_type_match_a_brute_force_oracle(
        tiny: tuple[Fleet, pd.DataFrame]) -> None:
    fleet, jobs = tiny
    cat = Catalog.default()
    cands = eligible_names(fleet, jobs, list(cat))
    values = true_values(fleet, jobs, cands, cat)
    at = jobs["submitted_at"].iloc[0].to_pydatetime()
    for i in range(len(jobs)):
        job = jobs.iloc[[i]].reset_index(drop=True)
        devices = int(job["trainer_count"].iloc[0]) * int(job["devices_per_trainer"].iloc[0])
        brute: dict[str, float] = {}
        for name in fleet.hardware_names:  # every type, one oracle call each
            if not fleet.eligible(job, at)[0, fleet.hardware_names.index(name)]:
                continue
            tp = float(fleet.true_throughput(job, name, at)[0])
            brute[name] = tp * 3600.0 / (devices * cat[name].cost_per_device_hour)
        assert set(brute) == set(cands[i])
        assert values[i] == pytest.approx(brute)
        best = max(brute, key=lambda n: (brute[n], -ord(n[0])))
        assert brute[oracle_order(values[i])[0]] == brute[best]
        for order in (sorted(brute), sorted(brute, reverse=True)):
            want = 1.0 - brute[order[0]] / max(brute.values())
            assert order_quality(order, values[i])["regret"] == pytest.approx(want)


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.sampled_from("ABCDEFG"), st.floats(0.01, 100.0), min_size=1),
       st.randoms())
def test_oracle_order_has_zero_regret_and_perfect_ndcg(values: dict[str, float],
                                                       rnd: object) -> None:
    order = oracle_order(values)
    q = order_quality(order, values)
    assert q["regret"] == 0.0 and q["top1"] == 1.0 and q["ndcg"] == pytest.approx(1.0)
    shuffled = list(values)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    other = order_quality(shuffled, values)
    assert 0.0 <= other["regret"] <= 1.0 and other["ndcg"] <= 1.0 + 1e-12


# The study on the small trained fleet ---------------------------------------------------------
def test_ranking_study_on_the_small_fleet(trained_workspace: Workspace) -> None:
    reg = Registry(trained_workspace.models_dir)
    art = reg.load()
    day = datetime.fromisoformat(art.manifest["as_of"])
    with Store(trained_workspace.store_path, read_only=True) as store:
        fleet = Fleet.from_store(store)
        past = load_attempts(store, datetime.fromisoformat(art.manifest["window_start"]), day)
        jobs = load_attempts(store, day, day + timedelta(days=1))
    ranker = Ranker(art)
    r = ranking_study(ranker, fleet, jobs, past, art.catalog, sample=60, seed=1)
    assert r.n_sampled == 60
    assert set(r.methods) == set(METHODS)
    n = {m["n"] for m in r.methods.values()}
    assert len(n) == 1  # every method scored on the same jobs
    assert r.leap_coverage >= 0.9
    for m in r.methods.values():
        assert 0.0 <= m["top1_agreement"] <= 1.0 and 0.0 <= m["mean_regret"] <= 1.0
    # LEAP on the types each family ran on is far better than on the ones it never did.
    pvt = r.prediction_vs_truth
    assert pvt["with_hardware_history"]["n"] > 0 and pvt["without_hardware_history"]["n"] > 0
    assert pvt["with_hardware_history"]["accuracy"] > 0.5
    # Same seed, same sample, same numbers.
    again = ranking_study(ranker, fleet, jobs, past, art.catalog, sample=60, seed=1)
    assert again.methods == r.methods
    # Both truths score every method on the same jobs. Without any premium type the two
    # truths agree; the policy truth only ever removes premium types.
    assert set(r.methods_all_types) == set(METHODS)
    assert {m["n"] for m in r.methods_all_types.values()} == n
    text = json.dumps(r.to_dict())
    assert json.dumps(RankingFigures.from_dict(json.loads(text)).to_dict()) == text


def test_policy_truth_drops_premium_types_the_rule_leaves_out_on_true_figures(
        trained_workspace: Workspace) -> None:
    art = Registry(trained_workspace.models_dir).load()
    cat = art.catalog
    premium = next(n for n in cat if cat[n].premium)
    standard = next(n for n in cat if not cat[n].premium)
    jobs = pd.DataFrame({"family_id": ["f", "f", "f"], "trainer_count": [1, 1, 1],
                         "devices_per_trainer": [1, 1, 1], "precision": ["bf16"] * 3,
                         "flops_per_sample": [1e12, 1e12, math.nan]})
    peak = Ranker(art).serving.peak_flops("bf16", [premium])[0]  # type: ignore[union-attr]
    need = cat[premium].min_utilization
    # Samples/s that put the premium type just below / above its MFU threshold.
    low, high = 0.5 * need * peak / 1e12, 2.0 * need * peak / 1e12
    truth = [{premium: low, standard: 1.0}, {premium: high, standard: 1.0},
             # No FLOPs: the speed-up rule, 1.1x < the default 1.25x.
             {premium: 1.1, standard: 1.0}]
    values = [{n: 10.0 for n in t} for t in truth]
    kept = policy_values(Ranker(art), jobs, truth, values)
    assert kept[0] == {premium: 0.0, standard: 10.0}
    assert kept[1] == values[1]
    assert kept[2] == {premium: 0.0, standard: 10.0}
    # A ranker without the premium rule keeps every type.
    plain = unfiltered(Ranker(art), cat)
    assert policy_values(plain, jobs, truth, values) == values


def test_leap_rankings_deduplicates_and_fails_open(trained_workspace: Workspace) -> None:
    ranker = Ranker(Registry(trained_workspace.models_dir).load())
    with Store(trained_workspace.store_path, read_only=True) as store:
        jobs = load_attempts(store, T0 + timedelta(days=11), T0 + timedelta(days=12)).head(3)
    ranked: list[int] = []
    original = ranker.rank_many

    def counting(jobs: Any, *args: object, **kwargs: object) -> object:
        ranked.append(len(jobs))
        return original(jobs, *args, **kwargs)  # type: ignore[arg-type]

    ranker.rank_many = counting  # type: ignore[method-assign]
    doubled = pd.concat([jobs, jobs], ignore_index=True)
    out = leap_rankings(ranker, doubled, [["L4", "A40"]] * 6)
    # Each distinct request once, all in one batch.
    assert ranked == [3] and [r.ranking for r in out[:3]] == [r.ranking for r in out[3:]]
    empty = leap_rankings(ranker, jobs.head(1), [[]])
    assert empty[0].ranking == [] and empty[0].reason is not None
    with pytest.raises(DataError, match="one list per job"):
        leap_rankings(ranker, jobs, [["L4"]])
