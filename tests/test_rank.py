"""The ranker: value, premium filter, fit filter, flags, fail-open, hot reload, fast encoder."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.schema import JOB_COLUMNS, PRECISIONS
from leap.errors import CatalogError, ConfigError, DataError
from leap.features.encode import encode, jobs_frame
from leap.model.artifact import MANIFEST, Registry
from leap.rank.policy import order_ranking
from leap.rank.ranker import Ranker
from leap.rank.requests import normalize_job
from leap.rank.results import EXCLUSION_REASONS, RankResult

PROPS = settings(max_examples=30, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Fixtures ---------------------------------------------------------------------------------
def sample_jobs(ws: Workspace, n: int = 400) -> list[dict[str, Any]]:
    """Launch-time fields of recent attempts in the store (their outcome dropped)."""
    from leap.data.store import Store

    with Store(ws.store_path, read_only=True) as store:
        rows = store.attempts().to_pylist()
    rows = rows[-4000:]
    picked = rows[:: max(1, len(rows) // n)][:n]
    return [{k: v for k, v in r.items() if k in JOB_COLUMNS and v is not None} for r in picked]


@pytest.fixture(scope="session")
def ranker(trained_workspace: Workspace) -> Ranker:
    return Ranker(Registry(trained_workspace.models_dir), background_reload=False)


@pytest.fixture(scope="session")
def jobs(trained_workspace: Workspace, ranker: Ranker) -> list[dict[str, Any]]:
    """Recent real jobs that every type can run (so any candidate list gets ranked)."""
    fitting = [j for j in sample_jobs(trained_workspace)
               if not any(e.reason.startswith("does_not_fit") for e in ranker.rank(j).excluded)]
    assert len(fitting) >= 6, "the fixture fleet has few jobs that fit every type"
    return fitting[:12]


@pytest.fixture(scope="session")
def flops_job(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    job = next((j for j in jobs if j.get("flops_per_sample")), None)
    return job if job is not None else {**jobs[0], "flops_per_sample": 1e9}


def copy_models(trained_workspace: Workspace, dest: Path) -> Registry:
    shutil.copytree(trained_workspace.models_dir, dest)
    return Registry(dest)


def publish_copy(reg: Registry, new_version: str, *, corrupt: str | None = None) -> None:
    """Publish a copy of the latest version as ``new_version`` (optionally corrupted)."""
    src = reg.path(reg.latest_version() or "")
    dst = reg.root / new_version
    shutil.copytree(src, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    manifest["version"] = new_version
    if corrupt == "checksum":
        (dst / "feature_spec.json").write_text("{}")
    elif corrupt == "model":
        # Garbage with a matching checksum: the loader itself must fail, not the checksum.
        import hashlib

        for rel in list(manifest["files"]):
            if rel.startswith("model/") and rel.endswith(".txt"):
                (dst / rel).write_text("not a lightgbm model")
                manifest["files"][rel] = hashlib.sha256(b"not a lightgbm model").hexdigest()
    (dst / MANIFEST).write_text(json.dumps(manifest))
    point_latest(reg, new_version)


def point_latest(reg: Registry, version: str) -> None:
    """Point LATEST at ``version`` without any check, as an older leap or a careless operator
    would (``rollback`` and ``publish`` refuse a version that does not verify)."""
    tmp = reg.root / ".LATEST.test.tmp"
    tmp.write_text(version + "\n")
    tmp.replace(reg.root / "LATEST")


def rank_dict(result: RankResult) -> list[tuple[str, float]]:
    return [(r.hardware, r.value) for r in result.ranking]


# The numbers behind each entry -------------------------------------------------------------
def test_ranking_is_sorted_by_value_with_consistent_numbers(ranker: Ranker,
                                                            jobs: list[dict[str, Any]]) -> None:
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    for job in jobs[:5]:
        r = ranker.rank(job, risk="neutral")
        assert r.ok and r.reason is None and r.ranking
        assert r.model_version == Registry(ranker.watcher.registry.root).latest_version()  # type: ignore[union-attr]
        # The risk-neutral order is by value; the averse one by value at the interval's low
        # end; the default (cautious) one is the neutral order with the cheapest type moved
        # ahead of every type that does not beat it confidently.
        assert r.risk == "neutral"
        values = [e.value for e in r.ranking]
        assert values == sorted(values, reverse=True)
        default = ranker.rank(job)
        assert default.risk == "cautious"
        assert default.ranking == order_ranking(r.ranking, "value", "cautious")
        low = [e.value_p10 for e in ranker.rank(job, risk="averse").ranking]
        assert low == sorted(low, reverse=True)
        devices = job["trainer_count"] * (job.get("devices_per_trainer") or 1)
        for e in r.ranking:
            assert e.devices == devices
            assert e.cost_per_hour == pytest.approx(devices * cat[e.hardware].cost_per_device_hour)
            assert e.value == pytest.approx(e.predicted_throughput * 3600 / e.cost_per_hour)
            assert e.predicted_throughput > 0 and math.isfinite(e.value)
        listed = {e.hardware for e in r.ranking} | {e.hardware for e in r.excluded}
        assert listed == set(cat), "every candidate is ranked or excluded with a reason"
        assert all(e.reason in EXCLUSION_REASONS and e.detail for e in r.excluded)


def test_every_entry_has_an_interval_and_a_novelty_group(ranker: Ranker,
                                                        jobs: list[dict[str, Any]]) -> None:
    from leap.features.encode import NOVELTY_GROUPS
    from leap.rank.policy import UNCERTAIN_RATIO

    seen = set()
    for job in jobs[:20]:
        for e in ranker.rank(job).ranking:
            assert e.throughput_p10 is not None and e.throughput_p90 is not None
            assert e.throughput_p10 <= e.predicted_throughput <= e.throughput_p90
            assert e.novelty in NOVELTY_GROUPS
            assert ("uncertain" in e.flags) == (e.throughput_p90 > UNCERTAIN_RATIO
                                                * e.throughput_p10)
            assert ("missing_hardware_history" in e.flags) == (
                e.novelty not in ("seen_config", "seen_pair_new_shape"))
            seen.add(e.novelty)
    assert {"seen_config", "new_family"} & seen and len(seen) >= 3
    with pytest.raises(ConfigError, match="risk must be one of"):
        ranker.rank(jobs[0], risk="reckless", strict=True)
    assert ranker.rank(jobs[0], risk="reckless").reason.startswith("invalid_request")  # type: ignore[union-attr]


def test_predictions_match_the_artifact(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    art = ranker.serving.artifact  # type: ignore[union-attr]
    job = jobs[0]
    r = ranker.rank(job)
    names = [e.hardware for e in r.ranking]
    frame = jobs_frame([{**job, "hardware": h} for h in names])
    assert np.allclose([e.predicted_throughput for e in r.ranking], art.predict(frame),
                       rtol=1e-12)


def test_predicted_utilization_is_model_flop_utilization(ranker: Ranker,
                                                        flops_job: dict[str, Any]) -> None:
    from leap.features.physics import hardware_specs, peak_flops

    r = ranker.rank(flops_job)
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    for e in r.ranking:
        precision = np.array([flops_job.get("precision")], dtype=object)
        peak = peak_flops(precision, hardware_specs(cat, np.array([e.hardware])))[0]
        want = e.predicted_throughput * flops_job["flops_per_sample"] / (e.devices * peak)
        assert e.predicted_utilization == pytest.approx(want)
    no_flops = {k: v for k, v in flops_job.items() if k != "flops_per_sample"}
    assert all(e.predicted_utilization is None for e in ranker.rank(no_flops).ranking)


def test_throughput_objective_and_budget(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    job = jobs[1]
    fast = ranker.rank(job, objective="throughput")
    tps = [e.predicted_throughput for e in fast.ranking]
    assert tps == sorted(tps, reverse=True) and fast.objective == "throughput"
    costs = sorted(e.cost_per_hour for e in fast.ranking)
    budget = costs[len(costs) // 2]
    capped = ranker.rank(job, objective="throughput", max_cost_per_hour=budget)
    assert capped.ranking and all(e.cost_per_hour <= budget for e in capped.ranking)
    over = {e.hardware for e in capped.excluded if e.reason == "over_budget"}
    assert over == {e.hardware for e in fast.ranking if e.cost_per_hour > budget}
    assert capped.ranking[0].hardware == next(e.hardware for e in fast.ranking
                                              if e.cost_per_hour <= budget)


# Properties -------------------------------------------------------------------------------
@PROPS
@given(data=st.data())
def test_ranking_does_not_depend_on_candidate_order(ranker: Ranker, jobs: list[dict[str, Any]],
                                                    data: st.DataObject) -> None:
    names = list(ranker.serving.artifact.catalog)  # type: ignore[union-attr]
    # Unknown names ride along: they are excluded, in the same order whatever the input's.
    subset = data.draw(st.lists(st.sampled_from([*names, "H10O", "X9"]), min_size=1,
                                max_size=len(names), unique=True))
    shuffled = data.draw(st.permutations(subset))
    job = data.draw(st.sampled_from(jobs))
    a, b = ranker.rank(job, subset), ranker.rank(job, shuffled)
    assert a.ranking == b.ranking
    assert a.excluded == b.excluded


def _with_cost(cat: Catalog, name: str, factor: float) -> Catalog:
    return Catalog([dataclasses.replace(h, cost_per_device_hour=h.cost_per_device_hour * factor)
                    if h.name == name else h for h in cat.values()])


@PROPS
@given(data=st.data(), factor=st.floats(1.0, 20.0), objective=st.sampled_from(["value",
                                                                               "throughput"]))
def test_raising_a_cost_never_moves_that_type_up(ranker: Ranker, jobs: list[dict[str, Any]],
                                                 data: st.DataObject, factor: float,
                                                 objective: str) -> None:
    job = data.draw(st.sampled_from(jobs))
    base = ranker.rank(job, objective=objective)
    assert base.ranking
    target = data.draw(st.sampled_from([e.hardware for e in base.ranking]))
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    pricier = ranker.with_options(costs=_with_cost(cat, target, factor))
    after = pricier.rank(job, objective=objective)
    before_pos = [e.hardware for e in base.ranking].index(target)
    after_pos = [e.hardware for e in after.ranking].index(target)
    assert after_pos >= before_pos


@PROPS
@given(data=st.data(), with_flops=st.booleans(), speedup=st.floats(0.5, 3.0))
def test_a_premium_type_below_its_threshold_never_appears(
        ranker: Ranker, jobs: list[dict[str, Any]], flops_job: dict[str, Any],
        data: st.DataObject, with_flops: bool, speedup: float) -> None:
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    premium = [n for n in cat if cat[n].premium]
    assert premium, "the default catalog has premium types"
    thresholds = {n: data.draw(st.floats(0.0, 0.6)) for n in premium}
    job = dict(data.draw(st.sampled_from(jobs)))
    if with_flops:
        job["flops_per_sample"] = flops_job["flops_per_sample"]
    else:
        job.pop("flops_per_sample", None)
    r = ranker.with_options(min_utilization=thresholds, premium_min_speedup=speedup).rank(job)
    for e in r.ranking:
        if not e.premium:
            continue
        if with_flops:
            assert e.predicted_utilization is not None
            assert e.predicted_utilization >= thresholds[e.hardware]
            assert "premium_kept_mfu" in e.flags
        else:
            assert e.speedup is not None and e.speedup >= speedup
            assert "premium_kept_speedup" in e.flags
    dropped = [e for e in r.excluded if e.reason == "premium_below_threshold"]
    assert all(e.hardware in premium for e in dropped)


def test_premium_rules_follow_catalog_and_overrides(ranker: Ranker,
                                                    flops_job: dict[str, Any]) -> None:
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    premium = [n for n in cat if cat[n].premium]
    keep_all = ranker.with_options(min_utilization=dict.fromkeys(premium, 0.0)).rank(flops_job)
    kept = {e.hardware for e in keep_all.ranking if e.premium}
    fits = {e.hardware for e in keep_all.excluded if e.reason.startswith("does_not_fit")}
    assert kept == set(premium) - fits
    # A user catalog can make any type premium with its own threshold.
    strict_cat = Catalog([dataclasses.replace(h, premium=True, min_utilization=1.0)
                          if h.name == "H100-SXM" else h for h in cat.values()])
    r = ranker.with_options(costs=strict_cat).rank(flops_job, ["H100-SXM", "L4"])
    dropped = [e for e in r.excluded if e.reason == "premium_below_threshold"]
    assert [e.hardware for e in dropped] == ["H100-SXM"]
    assert "min_utilization 1" in dropped[0].detail


def test_without_standard_candidates_premium_speedup_uses_the_catalog(
        ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    premium = [n for n in cat if cat[n].premium]
    job = {k: v for k, v in jobs[0].items() if k != "flops_per_sample"}
    r = ranker.with_options(premium_min_speedup=1e-6).rank(job, premium)
    assert r.ranking, "speed-up is measured against the catalog's standard types"
    assert all(e.speedup is not None and "premium_kept_speedup" in e.flags for e in r.ranking)


# Exclusions and flags ---------------------------------------------------------------------
def test_jobs_that_do_not_fit_are_left_out(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    job = {**jobs[0], "family_id": "never-seen-family", "num_params": 1e13,
           "devices_per_trainer": 8}
    r = ranker.rank(job)
    assert r.ranking == [] and (r.reason or "").startswith("no_eligible_type: ")
    reasons = {e.hardware: e.reason for e in r.excluded}
    assert reasons["GH200"] == "does_not_fit_host"  # 1 device per host
    assert set(reasons.values()) <= {"does_not_fit_host", "does_not_fit_memory"}
    detail = next(e.detail for e in r.excluded if e.reason == "does_not_fit_memory")
    assert "device memory" in detail


def test_history_proves_a_type_fits(ranker: Ranker) -> None:
    art = ranker.serving.artifact  # type: ignore[union-attr]
    fam_hw = art.snapshot.tables["fam_hw"]
    family = str(fam_hw["family_id"].iloc[0])
    ran_on = fam_hw.loc[fam_hw["family_id"].astype(str) == family, "hardware"].astype(str)
    proven = min(art.catalog[h].memory_gb for h in ran_on)
    job = {"family_id": family, "model_type": "any", "batch_size": 8, "trainer_count": 1,
           "num_params": 1e13}  # far too big for any device, says physics
    r = ranker.with_options(premium_min_speedup=1e-9).rank(job)  # keep premium types too
    assert r.ranking, "history overrules the physics estimate"
    assert all(art.catalog[e.hardware].memory_gb >= proven for e in r.ranking)
    no_fit = [e.hardware for e in r.excluded if e.reason == "does_not_fit_memory"]
    assert all(art.catalog[h].memory_gb < proven for h in no_fit)
    assert {e.hardware for e in r.ranking} | set(no_fit) == set(art.catalog)


def test_history_flags(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    unseen = ranker.rank({**jobs[0], "family_id": "brand-new-family"})
    assert all({"missing_family_history", "missing_hardware_history"} <= set(e.flags)
               for e in unseen.ranking)
    snap = ranker.serving.artifact.snapshot  # type: ignore[union-attr]
    fam_hw = snap.tables["fam_hw"]
    family = str(fam_hw["family_id"].iloc[0])
    ran_on = set(fam_hw.loc[fam_hw["family_id"] == family, "hardware"].astype(str))
    seen = ranker.rank({**jobs[0], "family_id": family})
    for e in seen.ranking:
        assert "missing_family_history" not in e.flags
        assert ("missing_hardware_history" in e.flags) == (e.hardware not in ran_on)


def test_unknown_candidates(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    r = ranker.rank(jobs[0], ["H10O", "L4"])
    assert [e.hardware for e in r.ranking] == ["L4"]
    assert r.excluded[0].reason == "unknown_hardware"
    assert "did you mean 'H100" in r.excluded[0].detail
    with pytest.raises(CatalogError, match=r"candidates: unknown hardware 'H10O'; did you mean"):
        ranker.rank(jobs[0], ["H10O"], strict=True)
    with pytest.raises(CatalogError, match="did you mean"):
        ranker.check_candidates(["A100-SXM4-80G"])


def test_a_priced_type_the_model_never_saw_is_left_out(ranker: Ranker,
                                                       jobs: list[dict[str, Any]]) -> None:
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    new = dataclasses.replace(cat["H100-SXM"], name="X1000", cost_per_device_hour=9.0)
    r = ranker.with_options(costs=Catalog([*cat.values(), new])).rank(jobs[0])
    assert ("X1000", "unknown_hardware") in {(e.hardware, e.reason) for e in r.excluded}
    assert "model's catalog" in next(e.detail for e in r.excluded if e.hardware == "X1000")


def test_new_prices_apply_without_retraining(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    cat = ranker.serving.artifact.catalog  # type: ignore[union-attr]
    base = {e.hardware: e for e in ranker.rank(jobs[0]).ranking}
    name = next(iter(base))
    after = {e.hardware: e for e in ranker.with_options(
        costs=_with_cost(cat, name, 2.0)).rank(jobs[0]).ranking}
    assert after[name].value == pytest.approx(base[name].value / 2)
    assert after[name].predicted_throughput == base[name].predicted_throughput


def test_zero_costs_are_catalog_errors(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    art = ranker.serving.artifact  # type: ignore[union-attr]
    free = _with_cost(art.catalog, "L4", 0.0)
    with pytest.raises(CatalogError, match=r"cost_per_device_hour is 0 for \['L4'\]"):
        ranker.with_options(costs=free)
    static = Ranker(dataclasses.replace(art, catalog=free))
    r = static.rank(jobs[0], ["L4", "T4"])
    assert ("L4", "invalid_cost") in {(e.hardware, e.reason) for e in r.excluded}


def test_option_validation(ranker: Ranker) -> None:
    with pytest.raises(CatalogError, match="min_utilization: unknown hardware 'H10O'"):
        ranker.with_options(min_utilization={"H10O": 0.3})
    with pytest.raises(ConfigError, match=r"min_utilization\['H200'\] must be within"):
        ranker.with_options(min_utilization={"H200": 1.5})
    with pytest.raises(ConfigError, match="premium_min_speedup must be a positive number"):
        ranker.with_options(premium_min_speedup=0.0)
    with pytest.raises(ConfigError, match="unknown Ranker option 'cost'; did you mean 'costs'"):
        ranker.with_options(cost=None)


# Request validation -----------------------------------------------------------------------
@pytest.mark.parametrize(("change", "match"), [
    ({"family_id": None}, "job field 'family_id' is required"),
    ({"trainer_count": 0}, "job field 'trainer_count' must be >= 1"),
    ({"batch_size": 2.5}, "job field 'batch_size' must be a whole number"),
    ({"trainer_count": True}, "job field 'trainer_count' must be a whole number"),
    ({"num_params": "big"}, "job field 'num_params' must be a finite number"),
    ({"num_params": -1.0}, "job field 'num_params' must be >= 0"),
    ({"flops_per_sample": float("nan")}, "job field 'flops_per_sample' must be a finite"),
    ({"precision": "bf61"}, "job field 'precision' must be one of .*did you mean 'bf16'"),
    ({"model_type": ""}, "job field 'model_type' must be a non-empty string"),
])
def test_bad_job_fields_name_the_field(change: dict[str, Any], match: str) -> None:
    job = {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 8, **change}
    with pytest.raises(DataError, match=match):
        normalize_job(job)


# Values a caller may send for a field: plain ones (what JSON gives), then the ones a typed
# frame would change or that are wrong (bools, NumPy scalars, float counts, NaN, past int64).
_VALUES = {"text": (["f1", "f2"], ["", None, 5, True, np.str_("f1")]),
           "count": ([2, 8], [0, None, 2.0, 2.5, True, np.int64(2), 10**30, "2"]),
           "number": ([1e9, 3], [-1.0, None, float("nan"), float("inf"), True,
                                 np.float32(2.0), 10**30, "x"])}


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 4))
def test_a_batch_of_jobs_is_checked_as_each_job_alone(data: st.DataObject, n: int) -> None:
    from types import MappingProxyType

    from leap.data.jobs import INT_FIELDS, STR_FIELDS
    from leap.rank.requests import jobs_request

    def value(name: str) -> Any:
        good, odd = _VALUES["text" if name in STR_FIELDS else
                            "count" if name in INT_FIELDS else "number"]
        if name == "precision":
            good, odd = ["bf16", "fp32"], [*odd, "bf61"]
        return data.draw(st.sampled_from(odd if data.draw(st.integers(0, 2)) == 0 else good))

    base = {"family_id": "f", "model_type": "m", "trainer_count": 1, "batch_size": 8}
    records = [{**base, **{c: value(c) for c in data.draw(
        st.lists(st.sampled_from(JOB_COLUMNS), unique=True, max_size=4))}} for _ in range(n)]

    def outcome(recs: list[Any]) -> Any:
        try:
            return jobs_request(recs)
        except DataError as exc:
            return str(exc)

    # Mappings that are not dicts are always checked record by record.
    got, want = outcome(records), outcome([MappingProxyType(r) for r in records])
    if isinstance(want, str):
        assert got == want
    else:
        assert not isinstance(got, str), got
        pd.testing.assert_frame_equal(got, want)


def test_ignored_fields_are_reported(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    values, ignored = normalize_job({**jobs[0], "throughput": 5.0, "flops_per_sampel": 1.0,
                                     "attempt_id": "a1", "hardware": "L4"})
    assert ignored == ["flops_per_sampel", "throughput"]
    assert set(values) == set(JOB_COLUMNS)
    r = ranker.rank({**jobs[0], "status": "succeeded"})
    assert r.ignored_fields == ["status"]


# Fail-open --------------------------------------------------------------------------------
def test_no_model_fails_open(tmp_path: Path, jobs: list[dict[str, Any]]) -> None:
    r0 = Ranker(Registry(tmp_path / "models"), background_reload=False)
    r = r0.rank(jobs[0])
    assert r.ranking == [] and r.reason is not None and r.reason.startswith("no_model:")
    assert "run `leap train`" in r.reason
    assert r0.fail_open_counts["no_model"] == 1
    assert r0.model_info()["version"] is None


def test_invalid_request_fails_open_unless_strict(ranker: Ranker) -> None:
    before = ranker.fail_open_counts["invalid_request"]
    r = ranker.rank({"family_id": "f"})
    assert r.ranking == [] and r.reason is not None
    assert r.reason.startswith("invalid_request: job field 'model_type' is required")
    assert ranker.fail_open_counts["invalid_request"] == before + 1
    assert ranker.rank({"family_id": "f", "model_type": "m", "trainer_count": 1,
                        "batch_size": 1}, []).reason.startswith("invalid_request")  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="objective must be one of value, throughput"):
        ranker.rank({"family_id": "f", "model_type": "m", "trainer_count": 1,
                     "batch_size": 1}, objective="cheapest", strict=True)


@pytest.mark.parametrize("failure", ["raise", "nan", "inf"])
def test_model_failures_fail_open(ranker: Ranker, jobs: list[dict[str, Any]],
                                  monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    model = ranker.serving.artifact.model  # type: ignore[union-attr]

    def broken(X: np.ndarray, *, base: np.ndarray) -> np.ndarray:
        if failure == "raise":
            raise RuntimeError("a bug deep in prediction")
        return np.full(len(X), np.nan if failure == "nan" else np.inf)

    monkeypatch.setattr(model, "predict", broken)
    before = ranker.fail_open_counts["prediction_failed"]
    r = ranker.rank(jobs[0])
    assert r.ranking == [] and r.excluded == []
    assert r.reason is not None and r.reason.startswith("prediction_failed:")
    assert ranker.fail_open_counts["prediction_failed"] == before + 1
    p = ranker.predict([jobs[0]], ["L4"])
    assert p.frame.empty and p.reason is not None and p.reason.startswith("prediction_failed")


def _without_latency(results: list[RankResult]) -> list[RankResult]:
    return [dataclasses.replace(r, latency_ms=0.0) for r in results]


@pytest.mark.parametrize(("objective", "risk", "budget"), [
    ("value", "cautious", None), ("value", "averse", 40.0), ("throughput", "neutral", None)])
def test_ranking_many_jobs_at_once_gives_each_its_own_answer(
        ranker: Ranker, trained_workspace: Workspace, objective: str, risk: str,
        budget: float | None) -> None:
    many = sample_jobs(trained_workspace, 80)
    # Jobs with and without optional fields side by side in one batch.
    many += [{**many[0], "flops_per_sample": 2e9},
             {k: v for k, v in many[4].items() if k not in ("num_params", "precision")},
             {"family_id": "never-seen",
                                                   "model_type": "m", "trainer_count": 2,
                                                   "batch_size": 64},
             {**many[1], "trainer_count": -3}]  # refused: fails open alone
    cands: list[list[str] | None] = [None] * len(many)
    cands[1], cands[2], cands[3] = ["H200", "B200"], ["T44", "L4"], ["L4", "L4", "T4"]
    cands[5] = ["T44"]  # nothing to score for this one
    options = {"objective": objective, "risk": risk, "max_cost_per_hour": budget}
    before = dict(ranker.fail_open_counts)
    batch = ranker.rank_many(many, cands, **options)  # type: ignore[arg-type]
    assert ranker.fail_open_counts["invalid_request"] == before["invalid_request"] + 1
    alone = [ranker.rank(j, c, **options) for j, c in zip(many, cands, strict=True)]  # type: ignore[arg-type]
    assert _without_latency(batch) == _without_latency(alone)
    assert batch[-1].reason is not None and batch[-1].reason.startswith("invalid_request")
    assert sum(bool(r.ranking) for r in batch) >= 60


def test_a_failing_batch_ranks_its_jobs_one_by_one(ranker: Ranker, jobs: list[dict[str, Any]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = ranker.serving.artifact.model  # type: ignore[union-attr]
    predict = model.predict

    def nan_for_batches(X: np.ndarray, *, base: np.ndarray) -> np.ndarray:
        out = predict(X, base=base)
        return np.full(len(X), np.nan) if len(X) > 30 else out

    want = [ranker.rank(j) for j in jobs[:4]]
    monkeypatch.setattr(model, "predict", nan_for_batches)
    before = ranker.fail_open_counts["prediction_failed"]
    got = ranker.rank_many(jobs[:4], [None] * 4)
    assert _without_latency(got) == _without_latency(want)
    assert ranker.fail_open_counts["prediction_failed"] == before, "no job failed alone"
    with pytest.raises(ConfigError, match="one list"):
        ranker.rank_many(jobs[:2], [None])
    refused = ranker.rank_many([{"family_id": "f"}], [None])  # nothing left to batch
    assert refused[0].reason is not None and refused[0].reason.startswith("invalid_request")


def test_rank_many_folds_each_jobs_free_devices(ranker: Ranker,
                                                jobs: list[dict[str, Any]]) -> None:
    full = ranker.rank(jobs[0]).ranking[0].hardware
    room: list[dict[str, float] | None] = [{full: 0}, None, {full: -1}]  # the last is refused
    got = ranker.rank_many(jobs[:3], [None] * 3, free_devices=room)
    want = [ranker.rank(j, free_devices=r) for j, r in zip(jobs[:3], room, strict=True)]
    assert _without_latency(got) == _without_latency(want)
    assert got[0].ranking[-1].hardware == full
    assert got[2].reason is not None and got[2].reason.startswith("invalid_request")
    with pytest.raises(ConfigError, match="free_devices"):
        ranker.rank_many(jobs[:2], [None, None], free_devices=[None])


def test_batch_predict(ranker: Ranker, jobs: list[dict[str, Any]]) -> None:
    from leap.model.predict import predict_frame

    records = [jobs[0], {**jobs[1], "hardware": "L4"}]
    p = ranker.predict(records, ["H100-SXM", "T4"])
    assert p.reason is None and len(p.frame) == 3
    want = predict_frame(ranker.serving.artifact, jobs_frame(records), ["H100-SXM", "T4"])  # type: ignore[union-attr]
    assert np.allclose(p.frame["predicted_throughput"], want["predicted_throughput"])
    with pytest.raises(CatalogError, match="did you mean"):
        ranker.predict(records, ["T44"], strict=True)
    assert ranker.predict(records, ["T44"]).reason.startswith("invalid_request")  # type: ignore[union-attr]


# Hot reload -------------------------------------------------------------------------------
def test_reload_swaps_in_a_new_model_and_survives_a_broken_one(trained_workspace: Workspace,
                                                               tmp_path: Path,
                                                               jobs: list[dict[str, Any]]
                                                               ) -> None:
    reg = copy_models(trained_workspace, tmp_path / "models")
    rk = Ranker(reg, background_reload=False, check_interval_s=0.0)
    old = rk.model_version
    held = rk.serving  # a request in flight keeps this reference
    publish_copy(reg, "29990101-01")
    assert rk.rank(jobs[0]).model_version == "29990101-01"
    assert held is not None and held.version == old  # the old model object is untouched
    assert rk.watcher.reloads == 2
    for corrupt, version in (("checksum", "29990102-01"), ("model", "29990103-01")):
        publish_copy(reg, version, corrupt=corrupt)
        r = rk.rank(jobs[0])
        assert r.ok and r.model_version == "29990101-01", "the previous model keeps serving"
        assert version in (rk.watcher.error or "")
    assert rk.watcher.reload_failures == 2
    assert "failed to load" in rk.model_info()["reload_error"]


def test_background_reload(trained_workspace: Workspace, tmp_path: Path,
                           jobs: list[dict[str, Any]]) -> None:
    reg = copy_models(trained_workspace, tmp_path / "models")
    rk = Ranker(reg, check_interval_s=0.0)
    publish_copy(reg, "29990101-01")
    first = rk.rank(jobs[0])
    assert first.ok  # answered at once by whichever model was current
    rk.watcher.wait_idle()
    assert rk.rank(jobs[0]).model_version == "29990101-01"


def test_a_broken_first_model_fails_open(trained_workspace: Workspace, tmp_path: Path,
                                         jobs: list[dict[str, Any]]) -> None:
    reg = copy_models(trained_workspace, tmp_path / "models")
    publish_copy(reg, "29990101-01", corrupt="model")
    rk = Ranker(reg, background_reload=False)
    r = rk.rank(jobs[0])
    assert r.ranking == [] and r.reason is not None and r.reason.startswith("no_model:")
    assert "29990101-01 failed to load" in r.reason


# Serving rows are the training rows -------------------------------------------------------
# Extreme drawn shapes overflow inside physics.estimates; the result is NaN by design.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@PROPS
@given(data=st.data())
def test_ranker_features_equal_the_dataframe_path(ranker: Ranker, data: st.DataObject) -> None:
    """The typed request columns the ranker encodes give exactly the rows (and predictions)
    that the DataFrame path used for training and batch prediction gives."""
    serving = ranker.serving
    assert serving is not None
    art = serving.artifact
    snap = art.snapshot
    families = [*snap.tables["fam"]["family_id"].astype(str).head(30), "unseen-family"]
    types = [*snap.tables["mt"]["model_type"].astype(str).head(30), "unseen-type"]
    opt = st.none() | st.floats(0.0, 1e13, allow_nan=False)
    count = st.none() | st.integers(1, 16)
    job = {
        "family_id": data.draw(st.sampled_from(families)),
        "model_type": data.draw(st.sampled_from(types)),
        "trainer_count": data.draw(st.sampled_from([1, 2, 3, 4, 8, 16, 64])),
        "batch_size": data.draw(st.integers(1, 1 << 16)),
        "precision": data.draw(st.none() | st.sampled_from(PRECISIONS)),
        "model_category": data.draw(st.none() | st.sampled_from(
            [*art.spec.vocab.get("model_category", []), "unseen-category"])),
        **{c: data.draw(opt) for c in ("num_params", "flops_per_sample", "embedding_params",
                                       "num_layers", "hidden_dim", "seq_len",
                                       "num_dense_features", "num_sparse_features")},
        **{c: data.draw(count) for c in ("devices_per_trainer", "data_parallel",
                                         "tensor_parallel", "pipeline_parallel")},
    }
    values, _ = normalize_job(job)
    names = data.draw(st.lists(st.sampled_from(list(art.catalog)), min_size=1, max_size=8,
                               unique=True))
    base = {k: v for k, v in values.items() if v is not None}
    frame = jobs_frame([{**base, "hardware": h} for h in names])
    assert np.array_equal(serving.encode(values, names),
                          encode(frame, art.snapshot, art.catalog, art.full_spec),
                          equal_nan=True)
    assert np.array_equal(art.predict_encoded(serving.encode(values, names))[0],
                          art.predict_log(frame), equal_nan=True)



def test_a_large_batch_gives_each_row_its_requests_features(ranker: Ranker,
                                                            trained_workspace: Workspace) -> None:
    """Over SMALL rows a batch is numbered by job (`Columns.by_job`, or as `leap predict` lays
    it out): the job's keys, its shape key and its job-keyed history are read once a job, on
    pandas' paths. Each row must still get the features its job gets as a request, on every
    type; a job twice, and one with its optional fields dropped, side by side."""
    from leap.features.columns import SMALL
    from leap.model.predict import batch_columns, candidate_rows

    serving = ranker.serving
    assert serving is not None
    art = serving.artifact
    many = [normalize_job(j)[0] for j in sample_jobs(trained_workspace, 100)]
    many += [many[0], {**many[1], "num_params": None, "seq_len": None, "precision": None}]
    names = list(art.catalog)[:22]
    frame = jobs_frame([{**{k: v for k, v in values.items() if v is not None}, "hardware": h}
                        for values in many for h in names])
    assert len(frame) > SMALL
    want = np.vstack([serving.encode(values, names) for values in many])
    np.testing.assert_allclose(encode(frame, art.snapshot, art.catalog, art.full_spec), want,
                               rtol=1e-12, atol=1e-12, equal_nan=True)
    # The same jobs laid out by `leap predict` (numbered by job as they are laid out).
    jobs = jobs_frame([{k: v for k, v in values.items() if v is not None} for values in many])
    job, hardware = candidate_rows(jobs, names)
    want = np.vstack([serving.encode(values, sorted(names)) for values in many])
    np.testing.assert_allclose(encode(batch_columns(jobs, job, hardware), art.snapshot,
                                      art.catalog, art.full_spec), want,
                               rtol=1e-12, atol=1e-12, equal_nan=True)

# Packaging and CLI ------------------------------------------------------------------------
def test_import_leap_stays_cheap_and_exports_ranker() -> None:
    code = ("import sys, leap; heavy = [m for m in ('lightgbm', 'fastapi', 'uvicorn', 'dask', "
            "'pandas') if m in sys.modules]; assert not heavy, heavy; "
            "from leap.rank.ranker import Ranker; assert leap.Ranker is Ranker; "
            "assert 'fastapi' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_leap_rank_scores_without_importing_scikit_learn(trained_workspace: Workspace,
                                                          tmp_path: Path,
                                                          jobs: list[dict[str, Any]]) -> None:
    """A process that only scores (here `leap rank`) keeps LightGBM's optional scikit-learn
    import out; one that has LightGBM already loaded (this test process) is left as it is."""
    from leap.model.imports import without_sklearn

    assert without_sklearn() is False and sys.modules.get("sklearn") is not None
    path = tmp_path / "job.json"
    path.write_text(json.dumps(jobs[0]))
    code = ("import runpy, sys\n"
            f"sys.argv = ['leap', '--home', {str(trained_workspace.home)!r}, 'rank', "
            f"'--job', {str(path)!r}, '--json']\n"
            "try:\n    runpy.run_module('leap', run_name='__main__')\n"
            "except SystemExit as stop:\n    assert not stop.code, stop.code\n"
            "assert 'lightgbm' in sys.modules and sys.modules['sklearn'] is None\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert json.loads(out)["ranking"]


def _cli(trained_workspace: Workspace, *args: str) -> Any:
    from leap.cli import _register, app

    _register()
    return CliRunner().invoke(app, ["--home", str(trained_workspace.home), *args])


def test_cli_rank_json_is_the_http_response(trained_workspace: Workspace, tmp_path: Path,
                                            jobs: list[dict[str, Any]]) -> None:
    from leap.serve.payloads import RankResponse

    path = tmp_path / "job.json"
    path.write_text(json.dumps(jobs[0]))
    res = _cli(trained_workspace, "rank", "--job", str(path), "--candidates", "H100-SXM,L4,T4",
               "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) == set(RankResponse.model_fields)
    assert {e["hardware"] for e in out["ranking"]} | {e["hardware"] for e in out["excluded"]} \
        == {"H100-SXM", "L4", "T4"}
    path.write_text(json.dumps({"job": jobs[0], "candidates": ["L4"]}))
    table = _cli(trained_workspace, "rank", "--job", str(path))
    assert table.exit_code == 0 and "L4" in table.output and "preference list" in table.output
    assert "80% range" in table.output and "…" not in table.output  # 80 columns, nothing cut


def test_ranking_table_fits_80_columns_and_explains_its_flags() -> None:
    from rich.console import Console

    from leap.cli.rank import FLAG_CODES, ranking_table
    from leap.rank.policy import FLAGS

    def entry(name: str, tp: float, flags: list[str]) -> dict[str, Any]:
        return {"hardware": name, "predicted_throughput": tp, "throughput_p10": tp / 2.3,
                "throughput_p90": tp * 1.9, "cost_per_hour": 1164.8, "value": tp * 3600 / 1164.8,
                "predicted_utilization": 0.434, "speedup": 1.234, "flags": flags}

    ranking = [entry("A100-SXM4-80GB", 1_234_567.0, ["missing_hardware_history", "uncertain"]),
               entry("V100-SXM2-32GB", 98.7654, ["memory_fit_unknown"]),
               entry("B200", 55_555.5, ["premium_kept_mfu", "utilization_above_peak"])]
    for truth in (None, {"A100-SXM4-80GB": 1.1e6}):
        console = Console(width=80, record=True)
        table, legend = ranking_table(ranking, title="preference list", truth=truth, limit=2)
        console.print(table)
        text = console.export_text()
        assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
        rows = [line for line in text.splitlines() if line.strip().startswith(("1 ", "2 "))]
        assert len(rows) == 2  # one line per entry, nothing wrapped
        assert "1.23M" in rows[0] and "537k–2.35M" in rows[0] and "T~" in rows[0]
        assert ("1.1M" in rows[0]) == (truth is not None)
        assert "... and 1 more" in text
        # Only the codes shown are explained, each once.
        assert legend == "flags: T never ran on this type · ~ uncertain (p90 over 2x p10) · " \
            "M memory fit unknown"
    # Every flag the ranking policy can set has a code (a new one would print in full).
    assert set(FLAG_CODES) == set(FLAGS)


def test_cli_rank_errors(trained_workspace: Workspace, tmp_path: Path,
                         jobs: list[dict[str, Any]]) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(jobs[0]))
    res = _cli(trained_workspace, "rank", "--job", str(path), "--candidates", "H10O")
    assert res.exit_code == 1 and "did you mean 'H100" in res.output
    path.write_text(json.dumps({**jobs[0], "trainer_count": "many"}))
    res = _cli(trained_workspace, "rank", "--job", str(path))
    assert res.exit_code == 1 and "job.trainer_count" in res.output
    assert "Example: leap rank" in _cli(trained_workspace, "rank", "--help").output
    assert "Example: leap serve" in _cli(trained_workspace, "serve", "--help").output
    res = _cli(trained_workspace, "serve", "--host", "0.0.0.0")
    assert res.exit_code == 1 and "--token" in res.output


def test_free_devices_put_types_without_room_last(ranker: Ranker,
                                                  jobs: list[dict[str, Any]]) -> None:
    cands = ["H100-SXM", "L4", "T4", "A100-SXM4-80GB"]
    for job in jobs[:4]:
        plain = ranker.rank(job, cands)
        order = [r.hardware for r in plain.ranking]
        devices = plain.ranking[0].devices
        # Plenty of room everywhere (or nothing said): the same list, no flag.
        roomy = ranker.rank(job, cands, free_devices=dict.fromkeys(cands, 1e9))
        assert [r.hardware for r in roomy.ranking] == order
        assert all("no_free_devices" not in r.flags for r in roomy.ranking)
        # The best type is full: it goes last, flagged, with its value unchanged.
        told = ranker.rank(job, cands, free_devices={**dict.fromkeys(cands, devices),
                                                  order[0]: devices - 1})
        assert [r.hardware for r in told.ranking] == [*order[1:], order[0]]
        assert told.ranking[-1].flags[-1] == "no_free_devices"
        assert told.ranking[-1].value == plain.ranking[0].value


def test_bad_free_devices_fail_open_or_raise_when_strict(ranker: Ranker,
                                                         jobs: list[dict[str, Any]]) -> None:
    bad = ranker.rank(jobs[0], ["L4"], free_devices={"L4": -1.0})
    assert bad.ranking == [] and bad.reason is not None
    assert bad.reason.startswith("invalid_request: free_devices['L4'] must be a number >= 0")
    with pytest.raises(DataError, match="must be a number >= 0"):
        ranker.rank(jobs[0], ["L4"], free_devices={"L4": "many"},  # type: ignore[dict-item]
                    strict=True)
