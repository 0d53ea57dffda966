"""The pair model: shape-aware ratios between types, cross-fitted so no family reads itself."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from leap.catalog import Catalog
from leap.errors import ArtifactError
from leap.features.columns import Columns
from leap.features.encode import (
    FEATURE_NAMES,
    SHAPE_BLEND_ATTEMPTS,
    FeatureSpec,
    encode,
    jobs_frame,
)
from leap.features.history import HistoryBuilder, Snapshot, prepare_history
from leap.features.pair_rows import (
    FOLDS,
    PAIR_FEATURES,
    SHAPE_FEATURES,
    family_fold,
    nearest_in_runs,
    pair_matrix,
    pair_training_rows,
    shape_matrix,
    shape_training_rows,
)
from leap.features.pairs import (
    PAIR_DAYS,
    REFIT_DAYS,
    PairModel,
    PairParams,
    PairSchedule,
    PairStore,
    refit_day,
)

CAT = Catalog.default()
TYPES = ("A100-SXM4-80GB", "H100-SXM", "L4")
AS_OF = datetime(2026, 1, 20, tzinfo=UTC)
FAST = PairParams(rounds=150, shape_rounds=150, num_leaves=7, min_data_in_leaf=5)


def _ratio(hw: str, batch: np.ndarray) -> np.ndarray:
    """A hidden log effect of each type that depends on the job's batch (what a table keyed by
    model type alone cannot learn)."""
    big = batch >= 64
    return {"A100-SXM4-80GB": np.zeros(len(batch)),
            "H100-SXM": np.where(big, 0.6, -0.2),
            "L4": np.where(big, -0.5, 0.1)}[hw]


def _attempts(n_families: int = 80, seed: int = 0) -> pd.DataFrame:
    """Families each running two configurations on every type, a few attempts each."""
    rng = np.random.default_rng(seed)
    rows = []
    for f in range(n_families):
        level = rng.normal(0.0, 0.3)
        for batch in (16 * (1 + f % 3), 64 * (1 + f % 4)):
            for hw in TYPES:
                for k in range(3):
                    rows.append({
                        "attempt_id": f"a{f}-{batch}-{hw}-{k}", "family_id": f"fam-{f:04d}",
                        "model_type": f"m{f % 5}", "model_category": "vision",
                        "precision": "bf16", "trainer_count": 1, "devices_per_trainer": 8,
                        "batch_size": batch, "num_params": 1e8, "flops_per_sample": 5e11,
                        "hardware": hw, "status": "succeeded",
                        "submitted_at": AS_OF - timedelta(hours=1 + (f * 7 + k) % 200),
                        "log_eff": level})
    frame = pd.DataFrame(rows)
    base = np.exp(5.0 + frame["log_eff"] + rng.normal(0, 0.02, len(frame)))
    effect = np.zeros(len(frame))
    for hw in TYPES:
        m = (frame["hardware"] == hw).to_numpy()
        effect[m] = _ratio(hw, frame["batch_size"].to_numpy()[m])
    frame["throughput"] = base * np.exp(effect)
    return frame.drop(columns="log_eff")


def _predict(pm: PairModel, family: str, batch: int, a: str, b: str) -> float:
    job = Columns.from_request({"family_id": family, "model_category": "vision",
                                "precision": "bf16", "trainer_count": 1,
                                "devices_per_trainer": 8, "batch_size": batch,
                                "num_params": 1e8, "flops_per_sample": 5e11}, [b])
    return float(pm.predict(job, np.array([a], dtype=object), np.array([b], dtype=object),
                            CAT)[0])


def _phys_gap(a: tuple[str, int], b: tuple[str, int]) -> float:
    """log_phys(B) - log_phys(A) of the test's job as (type, batch) A and B: the part the
    pair model's boosters do not predict."""
    from leap.features.physics import estimates
    frame = pd.DataFrame({"hardware": [a[0], b[0]], "trainer_count": [1, 1],
                          "devices_per_trainer": [8, 8], "batch_size": [a[1], b[1]],
                          "num_params": [1e8, 1e8], "flops_per_sample": [5e11, 5e11],
                          "precision": ["bf16", "bf16"]})
    phys = estimates(frame, CAT)["log_phys_sps"]
    return float(phys[1] - phys[0])


def _physics_gap(batch: int, a: str, b: str) -> float:
    """The physics gap of one job from type ``a`` to type ``b``."""
    return _phys_gap((a, batch), (b, batch))


def _shape_gap(hw: str, batch_a: int, batch_b: int) -> float:
    """The physics gap of one job on ``hw`` from batch ``batch_a`` to ``batch_b``."""
    return _phys_gap((hw, batch_a), (hw, batch_b))


@pytest.fixture(scope="module")
def attempts() -> pd.DataFrame:
    return _attempts()


@pytest.fixture(scope="module")
def model(attempts: pd.DataFrame) -> PairModel:
    pm = PairModel.fit(attempts, CAT, FAST)
    assert pm is not None
    return pm


@pytest.fixture(scope="module")
def snap(attempts: pd.DataFrame, model: PairModel) -> Snapshot:
    """The attempts' snapshot as of AS_OF, carrying ``model``."""
    builder = HistoryBuilder(prepare_history(attempts, CAT), lookback_days=30,
                             pairs=lambda _: model)
    try:
        return builder.snapshot(AS_OF)
    finally:
        builder.close()


def test_pair_rows_are_within_one_configuration(attempts: pd.DataFrame) -> None:
    jobs, hw_a, hw_b, tw = pair_training_rows(attempts, CAT)
    # 80 families x 2 configurations x 3 types x 2 others, each ordered pair once.
    assert len(jobs) == 80 * 2 * 3 * 2
    assert (hw_a != hw_b).all()
    assert np.allclose(tw[:, 1], np.sqrt(3.0))
    one = (jobs["family_id"] == "fam-0000").to_numpy() & (hw_a == "A100-SXM4-80GB") \
        & (hw_b == "H100-SXM") & (jobs["batch_size"] == 64).to_numpy()
    expect = 0.6 - _physics_gap(64, "A100-SXM4-80GB", "H100-SXM")
    assert tw[one, 0] == pytest.approx([expect], abs=0.06)


def test_step_features_place_one_step_of_the_job_on_each_type() -> None:
    """Seconds of compute per step at peak, of activation traffic per step, and the ridge."""
    job = {"family_id": "f", "model_type": "m", "model_category": "language",
           "precision": "bf16", "trainer_count": 1, "devices_per_trainer": 8, "batch_size": 64,
           "num_params": 1e8, "flops_per_sample": 6e11, "seq_len": 512, "hidden_dim": 768,
           "num_layers": 12}
    a, b = "A100-SXM4-80GB", "H100-SXM"
    vocab = {"vendor": sorted({CAT[n].vendor for n in CAT}), "precision": ["bf16"],
             "model_category": ["language"]}
    X = pair_matrix(Columns.from_frame(pd.DataFrame([job, job])), np.array([a, b], dtype=object),
                    np.array([b, a], dtype=object), CAT, vocab)
    f = {name: X[:, i] for i, name in enumerate(PAIR_FEATURES)}
    act = 34.0 * 512 * 768 * 12  # bytes of activations per sample (Korthikanti et al.)
    for t, side in ((a, "a"), (b, "b")):
        peak, bw = CAT[t].peak_bf16_tflops * 1e12, CAT[t].mem_bw_gb_per_s * 1e9
        assert f[f"{side}_step"][0] == pytest.approx(np.log(8 * 6e11 / peak))
        assert f[f"{side}_mem_step"][0] == pytest.approx(np.log(8 * act / bw))
        assert f[f"{side}_ridge"][0] == pytest.approx(np.log(6e11 / act) - np.log(peak / bw))
    # The faster type does the same step in less time, and the reverse move mirrors it.
    assert f["d_step"][0] < 0 and f["d_step"][1] == pytest.approx(-f["d_step"][0])


def test_shape_rows_place_one_step_of_each_shape_on_the_type() -> None:
    """The shape boosters read the step terms at both shapes: a batch twice as large per
    device is a step twice as long, on the same type, with the same ridge."""
    job = {"family_id": "f", "model_type": "m", "model_category": "language",
           "precision": "bf16", "trainer_count": 2, "devices_per_trainer": 8, "batch_size": 128,
           "num_params": 1e8, "flops_per_sample": 6e11, "seq_len": 512, "hidden_dim": 768,
           "num_layers": 12, "hardware": "H100-SXM"}
    vocab = {"vendor": sorted({CAT[n].vendor for n in CAT}), "precision": ["bf16"],
             "model_category": ["language"]}
    X = shape_matrix(Columns.from_frame(pd.DataFrame([job])), np.array([[4.0, 8.0, 64.0]]),
                     CAT, vocab)
    f = {name: X[0, i] for i, name in enumerate(SHAPE_FEATURES)}
    peak, bw = CAT["H100-SXM"].peak_bf16_tflops * 1e12, CAT["H100-SXM"].mem_bw_gb_per_s * 1e9
    act = 34.0 * 512 * 768 * 12
    assert f["b_step"] == pytest.approx(np.log(16 * 6e11 / peak))
    assert f["b_step"] - f["a_step"] == pytest.approx(np.log(2.0))
    assert f["b_mem_step"] - f["a_mem_step"] == pytest.approx(np.log(2.0))
    assert f["ridge"] == pytest.approx(np.log(6e11 / act) - np.log(peak / bw))


def test_shape_boosters_grow_with_the_pairs_they_learn_from(attempts: pd.DataFrame) -> None:
    """Below ``large_shape_pairs`` the shape boosters have ``shape_rounds`` trees of at most
    ``shape_num_leaves`` leaves; from it on, the large setting."""
    small = replace(FAST, shape_rounds=20, shape_num_leaves=4, large_shape_rounds=30,
                    large_shape_num_leaves=6, large_shape_pairs=10**9)
    for params, rounds, leaves in ((small, 20, 4),
                                   (replace(small, large_shape_pairs=10), 30, 6)):
        pm = PairModel.fit(attempts, CAT, params)
        assert pm is not None and pm.shape_boosters
        for booster in pm.shape_boosters:
            trees = booster.dump_model()["tree_info"]
            assert len(trees) == rounds
            assert max(t["num_leaves"] for t in trees) == leaves


def test_pair_model_learns_a_ratio_that_depends_on_the_shape(model: PairModel) -> None:
    a, b = "A100-SXM4-80GB", "H100-SXM"
    big = _predict(model, "fam-9999", 128, a, b) + _physics_gap(128, a, b)
    small = _predict(model, "fam-9999", 16, a, b) + _physics_gap(16, a, b)
    assert big == pytest.approx(0.6, abs=0.15)
    assert small == pytest.approx(-0.2, abs=0.15)
    back = _predict(model, "fam-9999", 128, b, a) + _physics_gap(128, b, a)
    assert back == pytest.approx(-0.6, abs=0.15)


def test_shape_rows_pair_two_shapes_of_one_family_on_one_type(attempts: pd.DataFrame) -> None:
    jobs, a_shape, tw = shape_training_rows(attempts, CAT)
    # 80 families x 3 types, each with two shapes: each ordered pair once.
    assert len(jobs) == 80 * 3 * 2
    assert (a_shape[:, 2] != jobs["batch_size"].to_numpy()).all()
    one = (jobs["family_id"] == "fam-0000").to_numpy() & (jobs["hardware"] == "H100-SXM") \
        .to_numpy() & (jobs["batch_size"] == 64).to_numpy()
    # fam-0000 runs batch 16 and 64; on H100 the hidden effect moves from -0.2 to +0.6.
    assert a_shape[one].tolist() == [[1.0, 8.0, 16.0]]
    assert tw[one, 0] == pytest.approx([0.8 - _shape_gap("H100-SXM", 16, 64)], abs=0.06)


def test_shape_rows_pair_each_shape_with_its_nearest_shapes_on_the_type() -> None:
    """Five batch sizes of one family on one type: with ``nearest=2`` each shape meets the two
    nearest it ran there (by log distance), not every other one; another type's shapes and
    another family's never."""
    rows = [{"family_id": fam, "model_category": "vision", "precision": "bf16",
             "trainer_count": 1, "devices_per_trainer": 8, "batch_size": batch,
             "num_params": 1e8, "flops_per_sample": 5e11, "hardware": hw,
             "throughput": 100.0 * batch}
            for fam, hw, batches in (("f", "H100-SXM", (8, 16, 32, 64, 512)),
                                     ("f", "L4", (4096,)), ("g", "H100-SXM", (24,)))
            for batch in batches]
    jobs, a_shape, tw = shape_training_rows(pd.DataFrame(rows), CAT, nearest=2)
    pairs = sorted(zip(jobs["batch_size"].astype(int).tolist(),
                       a_shape[:, 2].astype(int).tolist(), strict=True))
    assert pairs == [(8, 16), (8, 32), (16, 8), (16, 32), (32, 16), (32, 64),
                     (64, 16), (64, 32), (512, 32), (512, 64)]
    assert set(jobs["family_id"]) == {"f"} and set(jobs["hardware"]) == {"H100-SXM"}
    assert np.isfinite(tw).all()


def test_nearest_in_runs_is_the_same_in_blocks_of_any_size() -> None:
    rng = np.random.default_rng(3)
    run = np.sort(rng.integers(0, 40, 400))
    points = rng.normal(size=(400, 3))
    whole = nearest_in_runs(run, points, 3)
    for block in (1, 50, 999):
        for got, want in zip(nearest_in_runs(run, points, 3, max_block=block), whole,
                             strict=True):
            np.testing.assert_array_equal(got, want)
    b, a = whole
    assert (run[a] == run[b]).all() and (a != b).all()
    # Each row's partners are the nearest of its run (brute force).
    for i in (0, 123, 399):
        others = np.flatnonzero((run == run[i]) & (np.arange(400) != i))
        dist = np.abs(points[others] - points[i]).sum(axis=1)
        assert sorted(a[b == i].tolist()) == sorted(others[np.argsort(dist)[:3]].tolist())


def test_shape_boosters_learn_a_ratio_that_depends_on_the_type(model: PairModel) -> None:
    assert len(model.shape_boosters) == FOLDS

    def moved(hw: str) -> float:
        job = Columns.from_request({"family_id": "fam-9999", "model_category": "vision",
                                    "precision": "bf16", "trainer_count": 1,
                                    "devices_per_trainer": 8, "batch_size": 128,
                                    "num_params": 1e8, "flops_per_sample": 5e11}, [hw])
        return float(model.predict_shapes(job, np.array([[1.0, 8.0, 16.0]]), CAT)[0]) \
            + _shape_gap(hw, 16, 128)

    # From batch 16 to 128 (both unseen by this family): +0.8 on H100, -0.6 on L4, 0 on A100.
    assert moved("H100-SXM") == pytest.approx(0.8, abs=0.15)
    assert moved("L4") == pytest.approx(-0.6, abs=0.15)
    assert moved("A100-SXM4-80GB") == pytest.approx(0.0, abs=0.15)
    # Their reach: families here only change their batch (16 ... 256 per 8 devices), never
    # their trainers or devices per trainer.
    np.testing.assert_allclose(model.shape_reach, [0.0, 0.0, np.log(256 / 16)])


def test_a_family_never_reads_a_ratio_learned_from_itself(attempts: pd.DataFrame,
                                                          model: PairModel) -> None:
    """Poison one family's outcomes on one type: its own predictions do not move (its
    half's booster never saw it), while another half's family does (the test has teeth)."""
    fams = attempts["family_id"].unique()
    folds = family_fold(fams)
    target = fams[folds == 0][0]
    other = fams[folds == 1][0]
    poisoned = attempts.copy()
    hit = (poisoned["family_id"] == target) & (poisoned["hardware"] == "H100-SXM")
    poisoned.loc[hit, "throughput"] *= 50.0
    pm = PairModel.fit(poisoned, CAT, FAST)
    assert pm is not None
    for fam, same in ((target, True), (other, False)):
        before = _predict(model, fam, 128, "A100-SXM4-80GB", "H100-SXM")
        after = _predict(pm, fam, 128, "A100-SXM4-80GB", "H100-SXM")
        assert (before == after) is same, (fam, before, after)


def test_masked_rows_with_a_pair_model_cannot_see_their_own_pair(attempts: pd.DataFrame
                                                                 ) -> None:
    """A family's row encoded without its (family, type) history, against a pair model fit on
    the same window, is unchanged when every outcome of that pair is poisoned."""
    fam, hw = "fam-0003", "H100-SXM"
    rows = attempts[(attempts["family_id"] == fam) & (attempts["hardware"] == hw)].head(2)
    exclude = pd.DataFrame({"family_id": [fam], "hardware": [hw]})
    spec = FeatureSpec(names=FEATURE_NAMES, vocab=FeatureSpec.fit(attempts, CAT).vocab)

    def encoded(frame: pd.DataFrame) -> np.ndarray:
        fitted = PairModel.fit(frame, CAT, FAST)
        builder = HistoryBuilder(prepare_history(frame, CAT), lookback_days=30,
                                 pairs=lambda _: fitted)
        try:
            return encode(rows, builder.snapshot(AS_OF, exclude=exclude), CAT, spec)
        finally:
            builder.close()

    poisoned = attempts.copy()
    hit = (poisoned["family_id"] == fam) & (poisoned["hardware"] == hw)
    poisoned.loc[hit, "throughput"] *= 50.0
    clean, dirty = encoded(attempts), encoded(poisoned)
    p = FEATURE_NAMES.index("xfer_p_r")
    assert np.isfinite(clean[:, p]).all()
    np.testing.assert_array_equal(clean, dirty)


def test_pair_model_round_trips_through_a_snapshot(tmp_path: Path, attempts: pd.DataFrame,
                                                   model: PairModel, snap: Snapshot) -> None:
    snap.save(tmp_path / "snap")
    back = Snapshot.load(tmp_path / "snap")
    assert back.pairs is not None and back.pairs.fingerprint() == model.fingerprint()
    # Seen configurations, and the same jobs in a shape their families never ran.
    jobs = pd.concat([attempts.head(6), attempts.head(6).assign(batch_size=128)])
    spec = FeatureSpec(names=FEATURE_NAMES, vocab=FeatureSpec.fit(attempts, CAT).vocab)
    X = encode(jobs, snap, CAT, spec)
    np.testing.assert_array_equal(X, encode(jobs, back, CAT, spec))
    shape_r = X[:, FEATURE_NAMES.index("xfer_s_r")]
    assert np.isfinite(shape_r).all()  # each family ran another shape on each type
    # A new shape's base margin starts from the shape estimate; a seen configuration's from
    # its own median, weighed against the shape estimate as SHAPE_BLEND_ATTEMPTS attempts.
    hist = X[:, FEATURE_NAMES.index("hist_est")] - X[:, FEATURE_NAMES.index("log_phys_sps")]
    np.testing.assert_allclose(hist[6:], shape_r[6:])
    own, n = (X[:6, FEATURE_NAMES.index(c)] for c in ("fam_hw_shape_med_r", "fam_hw_shape_n"))
    assert (n >= 1).all()
    np.testing.assert_allclose(hist[:6], (n * own + SHAPE_BLEND_ATTEMPTS * shape_r[:6])
                               / (n + SHAPE_BLEND_ATTEMPTS))
    (tmp_path / "snap" / "pairs_1.txt").write_text("not a model")
    with pytest.raises(ArtifactError, match="pair model"):
        Snapshot.load(tmp_path / "snap")


def test_a_shape_out_of_the_shape_boosters_reach_starts_from_the_other_types(
        attempts: pd.DataFrame, snap: Snapshot) -> None:
    """A family's level on a type, measured only at shapes farther from the job's than the
    shape boosters reach, is not where ``hist_est`` starts: the family's level at the job's
    shape on its other types (``xfer_p_r``) is."""
    spec = FeatureSpec(names=FEATURE_NAMES, vocab=FeatureSpec.fit(attempts, CAT).vocab)
    near = attempts.head(6)
    # A batch per device far beyond any move the boosters learned from.
    far = near.assign(batch_size=near["batch_size"] * 2**16)
    X = encode(pd.concat([near, far]), snap, CAT, spec)
    col = {c: X[:, FEATURE_NAMES.index(c)] for c in (
        "hist_est", "log_phys_sps", "xfer_s_r", "xfer_p_r", "fam_hw_med_r")}
    hist = col["hist_est"] - col["log_phys_sps"]
    assert np.isfinite(col["fam_hw_med_r"]).all()  # every family ran on its row's type
    assert np.isfinite(col["xfer_s_r"][:6]).all() and np.isnan(col["xfer_s_r"][6:]).all()
    assert np.isfinite(col["xfer_p_r"][6:]).all()
    np.testing.assert_allclose(hist[6:], col["xfer_p_r"][6:])
    assert not np.allclose(hist[6:], col["fam_hw_med_r"][6:])


def test_too_few_pairs_train_no_pair_model(attempts: pd.DataFrame) -> None:
    one_type = attempts[attempts["hardware"] == "L4"]
    assert PairModel.fit(one_type, CAT, FAST) is None
    assert len(family_fold(np.array(["a", "b", "c"]))) == 3
    assert set(family_fold(attempts["family_id"].unique())) == set(range(FOLDS))


def test_the_schedule_reads_only_the_two_weeks_before_the_last_refit_day(
        attempts: pd.DataFrame) -> None:
    """Poisoning attempts at or after the refit day (or older than PAIR_DAYS before it)
    leaves the model as of any time before the next refit day unchanged."""
    spread = attempts.copy()
    spread["submitted_at"] = AS_OF - pd.to_timedelta(np.arange(len(spread)) % 40, unit="D") \
        - pd.Timedelta(hours=1)
    t = datetime(2026, 1, 15, 13, tzinfo=UTC)
    day = refit_day(t)
    assert day <= t < day + timedelta(days=REFIT_DAYS)
    assert (day - datetime(1970, 1, 1, tzinfo=UTC)).days % REFIT_DAYS == 0
    outside = (spread["submitted_at"] >= day) \
        | (spread["submitted_at"] < day - timedelta(days=PAIR_DAYS))
    assert outside.any() and (~outside).any()
    poisoned = spread.copy()
    poisoned.loc[outside, "throughput"] *= 50.0
    a = PairSchedule(spread, CAT, FAST)(t)
    b = PairSchedule(poisoned, CAT, FAST)(t)
    assert a is not None and b is not None and a.fingerprint() == b.fingerprint()
    later = PairSchedule(poisoned, CAT, FAST)(day + timedelta(days=REFIT_DAYS))
    assert later is not None and later.fingerprint() != a.fingerprint()
    cache: dict = {}
    schedule = PairSchedule(spread, CAT, FAST, cache)
    assert schedule(t) is schedule(day) and len(cache) == 1
    # The night served at t's midnight reads the two weeks just before it: what ran since
    # the refit day (a new type's first days, trials) counts at once.
    served = day + timedelta(days=2)
    fresh = PairSchedule(spread, CAT, FAST, fresh_at=served)
    assert fresh(day + timedelta(days=1)).fingerprint() == a.fingerprint()  # before: as ever
    since = (spread["submitted_at"] >= day) & (spread["submitted_at"] < served)
    assert since.any()
    late = spread.copy()
    late.loc[since, "throughput"] *= 50.0
    assert fresh(served).fingerprint() != a.fingerprint()
    assert PairSchedule(late, CAT, FAST, fresh_at=served)(served).fingerprint() \
        != fresh(served).fingerprint()


def test_threads_asking_for_one_model_fit_it_once(attempts: pd.DataFrame,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Days encoded side by side whose model was not fit up front (a day kept in the night
    cache that fails to load) wait for one fit instead of each fitting it."""
    spread = attempts.copy()
    spread["submitted_at"] = AS_OF - pd.to_timedelta(np.arange(len(spread)) % 40, unit="D") \
        - pd.Timedelta(hours=1)
    fits: list[int] = []
    real = PairModel.fit.__func__

    def slow_fit(cls: type[PairModel], *a: Any, **k: Any) -> PairModel | None:
        fits.append(1)
        time.sleep(0.2)  # long enough for the other threads to ask meanwhile
        return real(cls, *a, **k)

    monkeypatch.setattr(PairModel, "fit", classmethod(slow_fit))
    schedule = PairSchedule(spread, CAT, FAST)
    t = datetime(2026, 1, 15, 13, tzinfo=UTC)
    with ThreadPoolExecutor(4) as pool:
        models = list(pool.map(lambda _: schedule(t), range(4)))
    assert len(fits) == 1 and models[0] is not None
    assert all(m is models[0] for m in models)


def test_every_snapshot_of_a_night_reads_the_served_models_share(
        attempts: pd.DataFrame, model: PairModel) -> None:
    """Each refit judges a share of its own; the snapshots of a night's window read the one
    the served pair model judged, so the trees learn on the blend they serve."""
    spread = attempts.copy()
    spread["submitted_at"] = AS_OF - pd.to_timedelta(np.arange(len(spread)) % 40, unit="D") \
        - pd.Timedelta(hours=1)
    day = refit_day(datetime(2026, 1, 15, 13, tzinfo=UTC))
    served = day + timedelta(days=2)
    cache: dict = {}
    first = PairSchedule(spread, CAT, FAST, cache, fresh_at=served)
    first(day + timedelta(days=1))
    first(served)
    refit_key, served_key = sorted(cache)
    assert refit_key[0] == day.date().isoformat() and served_key[0] == served.date().isoformat()
    cache[refit_key] = model.with_share(0.0)
    cache[served_key] = model.with_share(0.5)
    night = PairSchedule(spread, CAT, FAST, cache, fresh_at=served)
    assert night.night_share() == 0.5
    before = night(day + timedelta(days=1))
    assert before is not None and before.neighbour_share == 0.5
    assert before.boosters is model.boosters and before.shape_reach is model.shape_reach
    assert cache[refit_key].neighbour_share == 0.0  # the cached refit is left as it was
    assert night(served) is cache[served_key]
    # A worker encoding some of the night's days is told the share (its own end is no night).
    told = PairSchedule(spread, CAT, FAST, cache, fresh_at=day + timedelta(days=1), share=0.25)
    told_model = told(day)
    assert told_model is not None and told_model.neighbour_share == 0.25
    # Without a night to serve, each refit reads its own.
    assert PairSchedule(spread, CAT, FAST, cache)(day) is cache[refit_key]
    with pytest.raises(ValueError, match="no night"):
        PairSchedule(spread, CAT, FAST, cache).night_share()
    # No pair model served: the night reads none of the flat carry.
    cache[refit_key] = model.with_share(0.25)
    cache[served_key] = None
    alone = PairSchedule(spread, CAT, FAST, cache, fresh_at=served)
    assert alone.night_share() == 0.0
    alone_model = alone(day)
    assert alone_model is not None and alone_model.neighbour_share == 0.0


def test_the_schedule_fits_the_usable_attempts_of_an_unfiltered_window(
        attempts: pd.DataFrame) -> None:
    """Given failed attempts too (a window as loaded, held without a filtered copy), each fit
    reads the usable ones alone: the same model as from the filtered rows."""
    spread = attempts.copy()
    spread["submitted_at"] = AS_OF - pd.to_timedelta(np.arange(len(spread)) % 20, unit="D") \
        - pd.Timedelta(hours=1)
    failed = spread.iloc[::3].assign(status="failed", throughput=np.nan,
                                     attempt_id=lambda f: f["attempt_id"] + "-x")
    # ... and rows on a type the catalog lacks, and columns a fit does not read, change nothing.
    unknown = spread.iloc[1::5].assign(hardware="Mystery-X",
                                       attempt_id=lambda f: f["attempt_id"] + "-u")
    raw = pd.concat([spread, failed, unknown]).sort_values("submitted_at", kind="stable") \
        .assign(note="not a feature")
    t = datetime(2026, 1, 15, 13, tzinfo=UTC)
    a, b = PairSchedule(spread, CAT, FAST)(t), PairSchedule(raw, CAT, FAST)(t)
    assert a is not None and b is not None and a.fingerprint() == b.fingerprint()



def test_a_pair_store_keeps_each_fit_for_the_next_run(tmp_path: Path, attempts: pd.DataFrame,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A later schedule (the next night's process) reads a model fit on the same rows from
    the store instead of fitting it, and scores as the fitted one did; rows that changed,
    or an entry that does not load, are fit afresh; a night's pruning keeps only what it
    read or fit."""
    spread = attempts.copy()
    spread["submitted_at"] = AS_OF - pd.to_timedelta(np.arange(len(spread)) % 40, unit="D") \
        - pd.Timedelta(hours=1)
    t = datetime(2026, 1, 15, 13, tzinfo=UTC)
    day = refit_day(t)
    store = PairStore(tmp_path / "pairs")
    first = PairSchedule(spread, CAT, FAST, store=store)(t)
    assert first is not None
    (entry,) = store.disk.directory.iterdir()
    fits: list[int] = []
    fit = PairModel.fit.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(PairModel, "fit", classmethod(
        lambda cls, *a, **k: fits.append(1) or fit(cls, *a, **k)))
    again = PairSchedule(spread, CAT, FAST, store=store)(t)
    assert again is not None and again is not first and fits == []
    jobs = Columns.from_frame(attempts.head(60))
    hw_a = np.array(TYPES * 20, dtype=object)
    hw_b = np.roll(hw_a, 1)
    np.testing.assert_array_equal(again.predict(jobs, hw_a, hw_b, CAT),
                                  first.predict(jobs, hw_a, hw_b, CAT))
    shapes = attempts.head(60)[["trainer_count", "devices_per_trainer", "batch_size"]] \
        .to_numpy(dtype=np.float64) * [1, 1, 2]
    np.testing.assert_array_equal(again.predict_shapes(jobs, shapes, CAT),
                                  first.predict_shapes(jobs, shapes, CAT))
    assert again.neighbour_share == first.neighbour_share
    np.testing.assert_array_equal(again.shape_reach, first.shape_reach)
    # One throughput in the fit's two weeks changed (a late correction): fit, kept beside.
    inside = np.flatnonzero((spread["submitted_at"] < day)
                            & (spread["submitted_at"] >= day - timedelta(days=PAIR_DAYS)))
    changed = spread.copy()
    changed.loc[changed.index[inside[0]], "throughput"] *= 1.01
    PairSchedule(changed, CAT, FAST, store=store)(t)
    assert fits == [1] and len(list(store.disk.directory.iterdir())) == 2
    # Other settings are another entry's key; an entry that does not load is fit again.
    rows = spread.iloc[inside]
    assert store.key(day.date(), rows, CAT, FAST) \
        != store.key(day.date(), rows, CAT, replace(FAST, rounds=151))
    # Threads change the speed of a fit, not the model: a fit on 1 serves a process on 4.
    assert store.key(day.date(), rows, CAT, replace(FAST, num_threads=1)) \
        == store.key(day.date(), rows, CAT, replace(FAST, num_threads=4))
    (entry / "pairs_0.txt").write_text("not a model")
    assert PairSchedule(spread, CAT, FAST, store=store)(t) is not None and fits == [1, 1]
    assert PairSchedule(spread, CAT, FAST, store=store)(t) is not None and fits == [1, 1]
    # The next night's store reads the refit day's model and fits its own fresh one; what
    # it did neither with (the corrected rows' model) and a half-written entry are removed.
    served = day + timedelta(days=2)
    later = PairStore(store.disk.directory)
    PairSchedule(spread, CAT, FAST, store=later, fresh_at=served)(day + timedelta(days=1))
    PairSchedule(spread, CAT, FAST, store=later, fresh_at=served)(served)
    assert fits == [1, 1, 1] and len(list(store.disk.directory.iterdir())) == 3
    (store.disk.directory / ".half-written.tmp").mkdir()
    assert later.prune() == 2 and len(list(store.disk.directory.iterdir())) == 2
    assert PairStore(tmp_path / "none").prune() == 0

class _Constant:
    """A stand-in booster that predicts one move for every row."""

    def __init__(self, move: float) -> None:
        self.move = move

    def predict(self, X: np.ndarray, num_threads: int = 0) -> np.ndarray:
        return np.full(len(X), self.move)


@pytest.mark.parametrize(("truth", "share"), [("flat", 0.5), ("boosters", 0.0)])
def test_the_flat_share_is_the_one_that_lands_the_most_shapes(truth: str, share: float
                                                               ) -> None:
    """Each of 100 shapes read from its two nearest: the boosters carry its level unmoved,
    the flat carry (throughput per device) moves it by 0.3. Where the flat carry is right,
    the largest share tried lands them (0.25 leaves 0.225 of the move: outside +-20%);
    where the boosters are, no share (0.25 lands them too: a tie goes to the smaller)."""
    from leap.features.pair_rows import SHAPE_FEATURES
    from leap.features.pairs import _neighbour_share

    cells = np.repeat(np.arange(100), 2)
    X = np.zeros((len(cells), len(SHAPE_FEATURES)))
    X[:, SHAPE_FEATURES.index("d_log_phys_sps")] = -0.3  # flat move: 0 + 0 + 0.3
    r_a = np.repeat(np.random.default_rng(0).normal(size=100), 2)
    r_b = r_a + (0.3 if truth == "flat" else 0.0)
    tw = np.column_stack([r_b - r_a, np.ones(len(cells)), r_b, cells])
    families = np.array([f"fam-{c}" for c in cells], dtype=object)
    boosters = [_Constant(0.0), _Constant(0.0)]
    assert _neighbour_share(boosters, X, tw, families, seed=0) == share  # type: ignore[arg-type]


def test_a_new_shape_reads_the_flat_share_of_its_nearest_shapes(attempts: pd.DataFrame,
                                                                  model: PairModel,
                                                                  snap: Snapshot) -> None:
    """At flat share w a new shape's level on its type (``xfer_s_r``) is ``1 - w`` times the
    shape boosters' carry plus ``w`` times its nearest shapes' throughput per device at its
    own devices, over its physics estimate."""
    spec = FeatureSpec(names=FEATURE_NAMES, vocab=FeatureSpec.fit(attempts, CAT).vocab)
    own = attempts[attempts["family_id"] == "fam-0000"]  # batches 16 and 64, 8 devices
    jobs = own.drop_duplicates("hardware").assign(batch_size=32)
    got = {}
    for w in (0.0, 0.5, 1.0):
        pm = PairModel(model.boosters, model.vocab, model.shape_boosters, model.shape_reach, w)
        builder = HistoryBuilder(prepare_history(attempts, CAT), lookback_days=30,
                                 pairs=lambda _, pm=pm: pm)
        try:
            X = encode(jobs, builder.snapshot(AS_OF), CAT, spec)
        finally:
            builder.close()
        got[w] = X[:, FEATURE_NAMES.index("xfer_s_r")]
    y = np.log(own["throughput"]).groupby([own["hardware"], own["batch_size"]]).median()
    flat = y.groupby(level=0).mean()[jobs["hardware"]].to_numpy() \
        - X[:, FEATURE_NAMES.index("log_phys_sps")]
    np.testing.assert_allclose(got[1.0], flat)
    np.testing.assert_allclose(got[0.5], (got[0.0] + got[1.0]) / 2)
    assert not np.allclose(got[0.0], got[1.0])
    # The share's judge reads the same flat carry from the shape boosters' features: each
    # nearest shape's residual moved by -d_log_phys_sps + d_log_trainers +
    # d_log_devices_per_trainer.
    from leap.features.pair_rows import SHAPE_FEATURES, shape_matrix
    judged = np.zeros(len(jobs))
    for batch in (16, 64):
        seen = encode(jobs.assign(batch_size=batch), snap, CAT, spec)
        X_s = shape_matrix(Columns.from_frame(jobs), np.tile([1.0, 8.0, batch], (len(jobs), 1)),
                           CAT, model.vocab)
        move = sum(X_s[:, SHAPE_FEATURES.index(c)] for c in ("d_log_trainers",
                                                              "d_log_devices_per_trainer")) \
            - X_s[:, SHAPE_FEATURES.index("d_log_phys_sps")]
        judged += (seen[:, FEATURE_NAMES.index("fam_hw_shape_med_r")] + move) / 2
    np.testing.assert_allclose(judged, got[1.0], atol=1e-9)


def test_the_probe_reads_the_flat_carry(attempts: pd.DataFrame, model: PairModel) -> None:
    """The artifact's probe has known families in a shape next to theirs on a type, so a
    leap that reads a model's share otherwise (an older one ignores it) fails the probe."""
    from leap.model.verify import probe_jobs

    spec = FeatureSpec.fit(attempts, CAT)
    got = {}
    for w in (0.0, 0.5):
        pm = model.with_share(w)
        builder = HistoryBuilder(prepare_history(attempts, CAT), lookback_days=30,
                                 pairs=lambda _, pm=pm: pm)
        try:
            snap = builder.snapshot(AS_OF)
        finally:
            builder.close()
        probe = jobs_frame(probe_jobs(snap, spec, CAT))
        got[w] = encode(probe, snap, CAT, spec)[:, FEATURE_NAMES.index("xfer_s_r")]
    moved = ~np.isclose(got[0.0], got[0.5], equal_nan=True)
    assert moved.any()
    assert set(probe.loc[moved, "family_id"]) <= set(attempts["family_id"])


def test_the_flat_share_round_trips(tmp_path: Path, model: PairModel) -> None:
    pm = PairModel(model.boosters, model.vocab, model.shape_boosters, model.shape_reach, 0.25)
    pm.save(tmp_path / "pm")
    back = PairModel.load(tmp_path / "pm")
    assert back is not None and back.neighbour_share == 0.25
    other = PairModel(model.boosters, model.vocab, model.shape_boosters, model.shape_reach, 0.5)
    assert back.fingerprint() == pm.fingerprint() != other.fingerprint()
    # A pair model saved before the share existed reads as share 0 (the boosters alone).
    meta = tmp_path / "pm" / "pairs.json"
    info = json.loads(meta.read_text())
    del info["neighbour_share"]
    meta.write_text(json.dumps(info))
    old = PairModel.load(tmp_path / "pm")
    assert old is not None and old.neighbour_share == 0.0


def test_a_training_configuration_carries_its_pair_settings(attempts: pd.DataFrame) -> None:
    """`TrainConfig.pair_params` reach the night's pair models (seeded and threaded as the
    configuration), and survive the round trip through a saved configuration."""
    from dataclasses import asdict

    from leap.model.window import TrainConfig, pair_schedule

    cfg = TrainConfig(pair_params=FAST, seed=5, threads=1)
    schedule = pair_schedule(attempts, CAT, AS_OF, cfg)
    assert schedule is not None and schedule.params == replace(FAST, seed=5, num_threads=1)
    default = pair_schedule(attempts, CAT, AS_OF, TrainConfig())
    assert default is not None and default.params == PairParams()
    for c in (cfg, TrainConfig()):
        assert TrainConfig.from_dict(asdict(c)) == c
