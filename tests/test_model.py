"""Predictor: point-in-time history, one feature path, cascade, artifact, gate, CLI."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from conftest import SMALL_AS_OF, small_train_config
from leap.catalog import Catalog
from leap.cli import _register, app
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import ArtifactError, ModelError, QualityGateError
from leap.features.encode import (
    FEATURE_NAMES,
    FEATURE_VERSION,
    FeatureSpec,
    encode,
    jobs_frame,
    new_trainer_count,
    new_vendor,
)
from leap.features.history import HistoryBuilder, prepare_history
from leap.features.pairs import PairSchedule
from leap.metrics import si
from leap.model import window
from leap.model.artifact import (
    NEW_TRAINER_COUNT_ALONE,
    Registry,
    base_margin,
    load_artifact,
    write_artifact,
)
from leap.model.cascade import CascadeModel, GBMParams, GlobalModel
from leap.model.parity import check_parity
from leap.model.split import NoveltySplitModel, model_from_files
from leap.model.train import train_nightly
from leap.model.window import (
    DayBlocks,
    DayStore,
    NightCache,
    build_training_set,
    encode_days,
    family_codes,
    history_builder,
    load_attempts,
    new_model_type_rows,
    new_trainer_count_rows,
    new_type_rows,
    submitted_in,
    succeeded_attempts,
    window_spec,
)

CAT = Catalog.default()
runner = CliRunner()
_register()


@pytest.fixture(scope="module")
def attempts(sim_workspace: Workspace) -> pd.DataFrame:
    with Store(sim_workspace.store_path, read_only=True) as store:
        return load_attempts(store, datetime(2025, 12, 1, tzinfo=UTC),
                             datetime(2026, 2, 1, tzinfo=UTC))


# --- history: point in time -------------------------------------------------------------

@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut_day=st.integers(min_value=3, max_value=11), extra_shift_h=st.floats(0, 200))
def test_adding_later_attempts_changes_no_feature(attempts: pd.DataFrame, cut_day: int,
                                                  extra_shift_h: float) -> None:
    as_of = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=cut_day)
    before = attempts[attempts["submitted_at"] < as_of]
    # "Later" attempts: copies of real ones moved to at or after as_of, with wild outcomes.
    later = before.sample(n=min(2000, len(before)), random_state=cut_day).copy()
    later["submitted_at"] = as_of + pd.to_timedelta(extra_shift_h, unit="h")
    later["attempt_id"] = later["attempt_id"] + "-later"
    later["throughput"] = later["throughput"] * 50.0
    jobs = before[before["status"] == "succeeded"].tail(300).reset_index(drop=True)
    spec = FeatureSpec.fit(jobs, CAT)
    x_a = encode(jobs, HistoryBuilder(prepare_history(before, CAT)).snapshot(as_of), CAT, spec)
    grown = pd.concat([before, later], ignore_index=True)
    x_b = encode(jobs, HistoryBuilder(prepare_history(grown, CAT)).snapshot(as_of), CAT, spec)
    np.testing.assert_array_equal(x_a, x_b)


def test_training_rows_never_see_their_own_day(attempts: pd.DataFrame,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every feature value is point in time. The night's share of the flat carry is not a
    feature value but a setting of the night, judged by the pair model it serves (on the
    two weeks before it, the window's last days too), like the trees' own split points; it is
    held fixed here, at a share that makes the flat carry count."""
    monkeypatch.setattr(PairSchedule, "night_share", lambda self: 0.25)
    as_of = SMALL_AS_OF
    cfg = small_train_config(window_days=4)  # the property is per day; four days show it
    ts = build_training_set(attempts, CAT, as_of, cfg)
    # Poison every outcome on the last training day: no training row of that day may change.
    last_day = as_of - timedelta(days=1)
    poisoned = attempts.copy()
    m = poisoned["submitted_at"] >= last_day
    poisoned.loc[m, "throughput"] = poisoned.loc[m, "throughput"] * 1000
    ts2 = build_training_set(poisoned, CAT, as_of, cfg)
    on_last = ts.day == cfg.window_days - 1
    assert on_last.sum() > 100
    np.testing.assert_array_equal(ts.X[on_last], ts2.X[on_last])
    # ...but the serving snapshot (as of the end of the window) does see that day.
    assert not ts.serving_snapshot.tables["fam"].equals(ts2.serving_snapshot.tables["fam"])


def test_days_encoded_side_by_side_are_the_days_encoded_one_by_one(
        attempts: pd.DataFrame) -> None:
    cfg = small_train_config(window_days=4)
    one = build_training_set(attempts, CAT, SMALL_AS_OF, replace(cfg, threads=1))
    two = build_training_set(attempts, CAT, SMALL_AS_OF, replace(cfg, threads=2))
    assert one.masked.any() and len(one.y) > 1000
    # The held-out day's hidden-row sets are built side by side too.
    for name in ("X", "y", "day", "masked", "group", "family", "eval_X", "eval_masked_X",
                 "eval_masked_rows", "new_type_X", "new_type_y", "new_model_type_X",
                 "new_model_type_y", "new_trainer_count_X", "new_trainer_count_y"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name), err_msg=name)
    assert len(one.new_type_y) and len(one.new_model_type_y) and len(one.eval_masked_rows)
    # Each row carries its attempt's family: the day's rows in order, and a masked copy its
    # original's (the family weighs a new family's calibration rows, see intervals).
    assert len(one.family) == len(one.y) and len(np.unique(one.family)) > 10
    natural = set(zip(one.day[~one.masked], one.y[~one.masked], one.family[~one.masked],
                      strict=True))
    assert set(zip(one.day[one.masked], one.y[one.masked], one.family[one.masked],
                   strict=True)) <= natural
    last = attempts[(attempts["submitted_at"] >= SMALL_AS_OF - timedelta(days=1))
                    & (attempts["submitted_at"] < SMALL_AS_OF)]
    on_last = (one.day == cfg.window_days - 1) & ~one.masked
    np.testing.assert_array_equal(
        one.family[on_last], family_codes(succeeded_attempts(last, CAT)["family_id"]))



def test_a_night_reads_the_days_the_night_before_kept(attempts: pd.DataFrame, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With a day store, a night encodes only the days the night before did not keep, and
    its rows are the rows of a night without one; a day whose attempts changed (a late
    correction) is encoded again, and so is every later day whose history holds it."""
    cfg = small_train_config(window_days=3, pair_model=False)
    store = DayStore(tmp_path / "days")
    encoded: set[datetime] = set()
    real = window.encode

    def encode_counted(rows: pd.DataFrame, snap: Any, *args: Any, **kw: Any) -> np.ndarray:
        encoded.add(snap.as_of)
        return real(rows, snap, *args, **kw)

    monkeypatch.setattr(window, "encode", encode_counted)

    def night(frame: pd.DataFrame, as_of: datetime, day_store: DayStore | None,
              threads: int = cfg.threads) -> DayBlocks:
        encoded.clear()
        start = as_of - timedelta(days=cfg.window_days)
        builder = history_builder(frame, CAT, as_of, cfg)
        spec = window_spec(succeeded_attempts(submitted_in(frame, start, as_of), CAT), CAT,
                           cfg, start, as_of)
        try:
            return encode_days(frame, builder, CAT, start, range(cfg.window_days),
                               replace(cfg, threads=threads), spec, day_store=day_store)
        finally:
            builder.close()

    day = [SMALL_AS_OF - timedelta(days=k) for k in (4, 3, 2, 1)]
    night(attempts, day[3], store)
    assert encoded == set(day[:3]) and len(list(store.disk.directory.iterdir())) == 3
    cold = night(attempts, SMALL_AS_OF, None)
    warm = night(attempts, SMALL_AS_OF, store, threads=1)  # as a Dask worker encodes
    assert cfg.threads != 1
    assert encoded == {day[3]} and cold.masked.any()
    for name in ("X", "y", "day", "masked", "group", "family"):
        np.testing.assert_array_equal(getattr(warm, name), getattr(cold, name), err_msg=name)
    # One throughput on the window's second day corrected: that day and the last re-encoded.
    changed = attempts.copy()
    on_day = np.flatnonzero((changed["submitted_at"] >= day[2])
                            & (changed["submitted_at"] < day[3]))
    changed.loc[changed.index[on_day[0]], "throughput"] *= 1.5
    later = DayStore(store.disk.directory)
    night(changed, SMALL_AS_OF, later)
    assert encoded == {day[2], day[3]}
    # What the next night can read is what this one read or encoded: the rest goes.
    assert len(list(store.disk.directory.iterdir())) == 6 and later.prune() == 3
    # A day kept whole but unreadable (or of another width) is encoded again.
    for entry, bad in zip(sorted(store.disk.directory.iterdir())[:2],
                          (b"not an array", np.zeros((3, 2), dtype=np.float32)), strict=True):
        if isinstance(bad, bytes):
            (entry / "rows.npy").write_bytes(bad)
        else:
            np.save(entry / "masked.npy", bad)
    again = night(changed, SMALL_AS_OF, DayStore(store.disk.directory))
    assert len(encoded) == 2
    np.testing.assert_array_equal(again.X, night(changed, SMALL_AS_OF, None).X)


def test_a_night_fits_only_the_pair_models_of_the_days_it_encodes(
        attempts: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A night whose days were kept asks only for the pair models its held-out day reads
    (the fresh one, the validation day's week), not the older weeks' that the days kept
    were encoded with (a Dask night before keeps only the weeks its workers read); its rows
    are the rows of a night from nothing."""
    cfg = small_train_config(window_days=3)
    as_of = datetime(2026, 1, 10, tzinfo=UTC)  # the window 01-07..01-09 spans two refits
    asked: list[str] = []
    real = PairSchedule._fit_or_load

    def counted(self: PairSchedule, day: datetime, rows: pd.DataFrame) -> Any:
        asked.append(day.date().isoformat())
        return real(self, day, rows)

    monkeypatch.setattr(PairSchedule, "_fit_or_load", counted)

    def night() -> window.TrainingSet:
        asked.clear()
        return build_training_set(attempts, CAT, as_of, cfg,
                                  disk_cache=NightCache.at(tmp_path / "cache"))

    cold = night()
    assert sorted(asked) == ["2026-01-01", "2026-01-08", "2026-01-10"]
    shutil.rmtree(tmp_path / "cache" / "pairs")
    warm = night()
    assert sorted(asked) == ["2026-01-08", "2026-01-10"]
    np.testing.assert_array_equal(warm.X, cold.X)
    np.testing.assert_array_equal(warm.y, cold.y)


def test_boosters_grown_side_by_side_are_the_boosters_grown_one_by_one() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(6000, 5))
    y = 2 * X[:, 0] + np.sin(X[:, 1]) + 0.1 * rng.normal(size=6000)
    names = [f"x{i}" for i in range(5)]
    preds = []
    for threads in (1, 2):
        m = CascadeModel(n_specialists=3, params=GBMParams(max_rounds=30, num_threads=threads))
        m.fit(X, y, base=np.zeros(6000), feature_names=names, categorical=[])
        preds.append(m.predict(X[:500], base=np.zeros(500)))
    np.testing.assert_array_equal(preds[0], preds[1])


def test_unseen_family_gets_explicit_missing_history(trained_workspace: Workspace) -> None:
    art = Registry(trained_workspace.models_dir).load()
    job = {"family_id": "never-seen-family", "model_type": "vision-000", "trainer_count": 2,
           "batch_size": 64, "num_params": 2.5e7, "flops_per_sample": 1.2e10,
           "precision": "bf16", "devices_per_trainer": 8}
    jobs = jobs_frame([job]).assign(hardware="A100-SXM4-80GB")
    x = art.encode(jobs)[0]
    names = list(art.spec.names)
    assert x[names.index("has_family_history")] == 0.0
    assert np.isnan(x[names.index("fam_n")]) and np.isnan(x[names.index("fam_hw_med_y")])
    assert x[names.index("hist_level")] >= 4  # model-type levels or nothing
    pred = art.predict(jobs)
    assert np.isfinite(pred).all() and (pred > 0).all()


# --- one feature path ----------------------------------------------------------------------

def test_training_and_serving_features_are_identical(sim_workspace: Workspace) -> None:
    with Store(sim_workspace.store_path, read_only=True) as store:
        report = check_parity(store, CAT, as_of=datetime(2026, 1, 10, tzinfo=UTC), sample=400)
    assert report.ok, report.to_json()
    assert report.rows == 400 and report.features > 50


def test_jobs_frame_ignores_outcome_fields() -> None:
    frame = jobs_frame([{"family_id": "f", "model_type": "m", "trainer_count": 1,
                         "batch_size": 8, "throughput": 123.0, "status": "succeeded"}])
    assert "throughput" not in frame.columns and "status" not in frame.columns


# --- the cascade -----------------------------------------------------------------------------

def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(0, 10, size=(n, 3))
    y = X[:, 0] + 0.3 * np.sin(X[:, 1]) + rng.normal(0, 0.02, n)
    return X, y


def test_cascade_routes_rows_to_their_range_and_predicts_the_median() -> None:
    X, y = _synthetic(6000, 0)
    fast = GBMParams(num_leaves=15, max_rounds=150, learning_rate=0.2, min_data_in_leaf=20)
    model = CascadeModel(n_specialists=4, params=fast,
                         router_params=GBMParams(num_leaves=15, max_rounds=40,
                                                 learning_rate=0.3, objective="multiclass"))
    zero = np.zeros(len(y))
    model.fit(X, y, base=zero, feature_names=["a", "b", "c"], categorical=[])
    Xt, yt = _synthetic(2000, 1)
    routes = model.route(Xt)
    truth = np.searchsorted(model.edges_, yt, side="right")
    assert (routes == truth).mean() > 0.9
    # Each specialist's training range overlaps its neighbours'.
    for (lo1, hi1), (lo2, _) in zip(model.ranges_, model.ranges_[1:], strict=False):
        assert lo2 < hi1 and lo1 < lo2
    err = np.abs(model.predict(Xt, base=np.zeros(len(yt))) - yt)
    assert np.median(err) < 0.1
    again = model_from_files(model.to_files())
    np.testing.assert_array_equal(again.predict(Xt, base=np.zeros(len(yt))),
                                  model.predict(Xt, base=np.zeros(len(yt))))


def test_the_novel_models_correction_is_scaled_by_what_the_validation_day_supports() -> None:
    # Columns: a signal x, the pair history count, the family history count. Masked rows (the
    # family's own history on the type removed) teach the novel model a correction of 0.8 x;
    # on the validation day's novel rows as they came, families that ran elsewhere get none of
    # it (their level is the base margin). New families keep the whole correction.
    rng = np.random.default_rng(0)

    def rows(n: int, pair: bool, fam: bool, gets: float) -> tuple[np.ndarray, np.ndarray]:
        x = rng.normal(size=n)
        X = np.column_stack([x, np.full(n, 3.0 if pair else np.nan),
                             np.full(n, 5.0 if fam else np.nan)])
        return X, gets * 0.8 * x + rng.normal(scale=0.01, size=n)

    parts = [rows(3000, True, True, 0.0), rows(3000, False, True, 1.0),
             rows(3000, False, False, 1.0)]
    X = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    masked = np.r_[np.zeros(3000, bool), np.ones(6000, bool)]
    # Most validation rows want the correction, so early stopping keeps it.
    (Xa, ya), (Xb, yb) = rows(400, False, True, 0.0), rows(1600, False, False, 1.0)
    Xv, yv = np.vstack([Xa, Xb]), np.r_[ya, yb]
    fast = GBMParams(num_leaves=7, max_rounds=60, learning_rate=0.3, min_data_in_leaf=20)
    model = NoveltySplitModel(seen=GlobalModel(params=fast), novel=GlobalModel(params=fast))
    model.fit(X, y, base=np.zeros(len(y)), feature_names=["x", "fam_hw_n", "fam_n"],
              categorical=[], masked=masked,
              val=(Xv, yv, np.zeros(len(yv)), np.zeros(len(yv), bool)))
    assert model.shrink_ == 0.0
    pred = model.predict(Xv, base=np.zeros(len(yv)))
    assert np.all(pred[:400] == 0.0)  # the base margin alone
    assert np.median(np.abs(pred[400:] - yb)) < 0.1  # the full correction
    again = model_from_files(model.to_files())
    assert isinstance(again, NoveltySplitModel) and again.shrink_ == model.shrink_
    np.testing.assert_array_equal(again.predict(Xv, base=np.zeros(len(yv))), pred)
    # A model written before the shrink was fitted keeps its correction whole.
    files = model.to_files()
    meta = json.loads(files["model.json"])
    del meta["shrink"]
    old = model_from_files({**files, "model.json": json.dumps(meta)})
    assert isinstance(old, NoveltySplitModel) and old.shrink_ == 1.0


def test_a_trainer_count_new_to_its_pair_is_served_the_base_margin_where_judged(
        trained_workspace: Workspace) -> None:
    """Where the window judged so (the manifest's flag), a row at a trainer count its family
    never ran on the type is served the base margin alone; every other row on a type somebody
    ran on keeps the trees' correction. Without the flag (a model from before the judgement
    too), every such row keeps it."""
    art = Registry(trained_workspace.models_dir).load()
    assert isinstance(art.manifest[NEW_TRAINER_COUNT_ALONE], bool)
    with Store(trained_workspace.store_path, read_only=True) as store:
        jobs = load_attempts(store, SMALL_AS_OF, SMALL_AS_OF + timedelta(days=1))
    X = art.encode(jobs)
    names = list(art.spec.names)
    new = new_trainer_count(X, names)
    alone = new & np.isfinite(X[:, names.index("hist_est")])
    keep = ~new & ~art.on_new_type(X, names)
    assert alone.sum() >= 10 and keep.sum() >= 100  # the held-out day has both
    base = base_margin(X, art.spec, art.fallback_log_tp)
    trees = art.model.predict(X, base=base)
    assert np.abs(trees[alone] - base[alone]).max() > 1e-3  # the rule changes something
    # The family ran on the type, never at this trainer count: read from the history levels.
    fam_hw_n, tc_n = X[:, names.index("fam_hw_n")], X[:, names.index("fam_hw_tc_n")]
    assert np.all(fam_hw_n[new] > 0) and np.all(np.isnan(tc_n[new]))
    judged = replace(art, manifest={**art.manifest, NEW_TRAINER_COUNT_ALONE: True})
    pred = judged.predict_rows(X)
    np.testing.assert_array_equal(pred[alone], base[alone])
    np.testing.assert_array_equal(pred[keep], trees[keep])
    before = {k: v for k, v in art.manifest.items() if k != NEW_TRAINER_COUNT_ALONE}
    pred = replace(art, manifest=before).predict_rows(X)
    np.testing.assert_array_equal(pred[new], trees[new])


def test_a_booster_is_fit_on_at_most_max_train_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 2))
    y = X[:, 0] + rng.normal(scale=0.1, size=3000)
    fit_rows: list[int] = []
    real_train = lgb.train

    def counting_train(params: dict, train_set: lgb.Dataset, **kw: object) -> lgb.Booster:
        booster = real_train(params, train_set, **kw)  # type: ignore[arg-type]
        if params["objective"] != "multiclass":  # the router samples rows on its own
            fit_rows.append(train_set.num_data())
        return booster

    monkeypatch.setattr("leap.model.cascade.lgb.train", counting_train)
    fit = {"base": np.zeros(3000), "feature_names": ["a", "b"], "categorical": []}
    small = GBMParams(num_leaves=7, max_rounds=5, min_data_in_leaf=20)
    wide = GlobalModel(params=small).fit(X, y, **fit)
    capped = GlobalModel(params=replace(small, max_train_rows=500)).fit(
        X, y, train=np.arange(3000) % 3 != 0, **fit)
    CascadeModel(n_specialists=3, params=replace(small, max_train_rows=400)).fit(X, y, **fit)
    assert fit_rows[0] == 3000 and fit_rows[1] == 500
    assert len(fit_rows) == 5 and max(fit_rows[2:]) == 400
    # A cap above the rows changes nothing.
    same = GlobalModel(params=replace(small, max_train_rows=3000)).fit(X, y, **fit)
    np.testing.assert_array_equal(same.predict(X, base=np.zeros(3000)),
                                  wide.predict(X, base=np.zeros(3000)))
    assert not np.array_equal(capped.predict(X, base=np.zeros(3000)),
                              wide.predict(X, base=np.zeros(3000)))
    # A model saved with a fit setting this leap no longer has still loads.
    files = capped.to_files()
    meta = json.loads(files["model.json"])
    meta["params"]["max_bagged_rows"] = 300_000
    old = model_from_files({**files, "model.json": json.dumps(meta)})
    np.testing.assert_array_equal(old.predict(X, base=np.zeros(3000)),
                                  capped.predict(X, base=np.zeros(3000)))


def test_unfitted_model_refuses_to_predict() -> None:
    with pytest.raises(ModelError, match="not fitted yet"):
        GlobalModel().predict(np.zeros((2, 3)), base=np.zeros(2))
    with pytest.raises(ModelError, match="n_specialists must be >= 2"):
        CascadeModel(n_specialists=1)


# --- training, artifact, registry ----------------------------------------------------------

def test_trained_model_is_accurate_and_reports_held_out_metrics(
        trained_workspace: Workspace) -> None:
    art = Registry(trained_workspace.models_dir).load()
    held = art.manifest["metrics"]["held_out"]
    assert held["day"] == "2026-01-12"
    assert held["n"] > 500 and held["coverage"] == 1.0
    assert held["accuracy"] > 0.6  # small fleet, 10-day window; the full fleet is measured in bench
    assert held["seen_families"]["accuracy"] > held["unseen_families"]["accuracy"]
    # Rows with (family, type) history go to the cascade, the rest to the transfer model.
    assert art.manifest["model_kind"] == "split"
    assert art.model.seen.kind == "cascade" and art.model.novel.kind == "global"  # type: ignore[union-attr]
    assert art.manifest["metrics"]["masked_train_rows"] > 0
    groups = held["novelty"]
    assert groups["seen_config"]["accuracy"] > groups["new_family"]["accuracy"]
    assert all(0.0 <= g["interval_coverage"] <= 1.0 for g in groups.values())
    assert held["masked_pairs"]  # the held-out day's rows with their own pair history masked


def test_artifact_round_trip_predicts_identically(trained_workspace: Workspace,
                                                  attempts: pd.DataFrame,
                                                  tmp_path: Path) -> None:
    art = Registry(trained_workspace.models_dir).load()
    jobs = attempts[attempts["submitted_at"] >= SMALL_AS_OF].head(500)
    copy = write_artifact(tmp_path / "copy", model=art.model, snapshot=art.snapshot,
                          spec=art.spec, catalog=art.catalog,
                          info={"fallback_log_throughput": art.fallback_log_tp,
                                NEW_TRAINER_COUNT_ALONE: art.new_trainer_count_alone},
                          intervals=art.intervals)
    loaded = load_artifact(copy)
    assert loaded.new_trainer_count_alone == art.new_trainer_count_alone
    np.testing.assert_array_equal(loaded.predict(jobs), art.predict(jobs))
    for a, b in zip(loaded.predict_interval(jobs), art.predict_interval(jobs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_type_new_to_the_window_gets_its_own_calibrated_interval(
        trained_workspace: Workspace, attempts: pd.DataFrame) -> None:
    """Training calibrates a cell from validation rows encoded as if nobody had run on their
    type; serving gives rows on a type absent from the snapshot at least that interval."""
    art = Registry(trained_workspace.models_dir).load()
    assert art.intervals is not None
    lo_t, hi_t, used = art.intervals.quantiles_["new_type"]
    assert used >= art.intervals.min_rows and lo_t < 0 < hi_t
    jobs = attempts[attempts["submitted_at"] >= SMALL_AS_OF].head(400)
    known = art.predict_interval(jobs)
    hw = str(jobs["hardware"].iloc[0])
    on = (jobs["hardware"] == hw).to_numpy()
    # The same rows as if nobody had run on that type in the window.
    art._absent = art._absent_types().copy()
    art._absent[art.spec.vocab["hardware"].index(hw)] = True
    new = art.predict_interval(jobs)
    assert np.all(new.lo[on] - new.log[on] <= lo_t + 1e-12)
    assert np.all(new.hi[on] - new.log[on] >= hi_t - 1e-12)
    for a, b in zip(new, known, strict=True):
        np.testing.assert_array_equal(a[~on], b[~on])


def test_a_model_type_new_to_the_window_gets_its_own_calibrated_interval(
        trained_workspace: Workspace, attempts: pd.DataFrame) -> None:
    """Training calibrates a cell from validation rows encoded as if nobody had run their
    model type; serving gives a job of a model type the window never saw at least that
    interval, and every other job the interval it had."""
    art = Registry(trained_workspace.models_dir).load()
    assert art.intervals is not None
    lo_m, hi_m, used = art.intervals.quantiles_["new_model_type"]
    assert used >= art.intervals.min_rows and lo_m < hi_m
    jobs = attempts[attempts["submitted_at"] >= SMALL_AS_OF].head(400)
    known = art.predict_interval(jobs)
    unknown = jobs.assign(model_type="an-architecture-nobody-ran",
                          family_id=lambda f: "new-" + f["family_id"].astype(str))
    new = art.predict_interval(unknown)
    assert np.all(new.lo - new.log <= lo_m + 1e-12)
    assert np.all(new.hi - new.log >= hi_m - 1e-12)
    # A new family of a known model type keeps the new-family interval alone.
    sibling = art.predict_interval(jobs.assign(
        family_id=lambda f: "new-" + f["family_id"].astype(str)))
    width = sibling.hi - sibling.lo
    assert np.all(new.hi - new.lo >= width - 1e-12) and np.any(new.hi - new.lo > width)
    assert np.all(known.hi - known.lo >= 0)


def test_validation_rows_of_a_hidden_model_type_carry_no_history_of_it(
        sim_workspace: Workspace, attempts: pd.DataFrame) -> None:
    cfg = small_train_config(pair_model=False)
    catalog = Catalog.default()
    builder = HistoryBuilder(prepare_history(attempts, catalog), lookback_days=cfg.lookback_days)
    spec = FeatureSpec.fit(attempts, catalog)
    X, y = new_model_type_rows(attempts, builder, catalog, SMALL_AS_OF, cfg, spec)
    builder.close()
    assert len(X) == len(y) >= 200 and np.isfinite(y).all()
    names = list(FEATURE_NAMES)
    # Nothing of the model type: no family level, no model-type level, anywhere.
    for col in ("fam_n", "fam_hw_n", "mt_n", "mt_hw_n"):
        assert np.isnan(X[:, names.index(col)]).all(), col


def test_validation_rows_of_a_hidden_type_carry_no_history_of_it(
        sim_workspace: Workspace, attempts: pd.DataFrame,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import leap.model.window as window_module

    cfg = small_train_config(pair_model=False)
    catalog = Catalog.default()
    builder = HistoryBuilder(prepare_history(attempts, catalog), lookback_days=cfg.lookback_days)
    spec = FeatureSpec.fit(attempts, catalog)
    X, y = new_type_rows(attempts, builder, catalog, SMALL_AS_OF, cfg, spec)
    # Types are hidden until there are enough rows: wanting more than the day has hides all.
    monkeypatch.setattr(window_module, "NEW_TYPE_MIN_ROWS", 10**9)
    _, every = new_type_rows(attempts, builder, catalog, SMALL_AS_OF, cfg, spec)
    builder.close()
    day = attempts[(attempts["submitted_at"] >= SMALL_AS_OF - timedelta(days=1))
                   & (attempts["submitted_at"] < SMALL_AS_OF)]
    assert len(every) == len(window_module.succeeded_attempts(day, catalog)) > len(y)
    assert len(X) == len(y) > 100 and np.isfinite(y).all()
    names = list(FEATURE_NAMES)
    # Nothing of the type itself: no family level on it, no model type's level on it.
    for col in ("fam_hw_n", "fam_hw_shape_n", "mt_hw_n"):
        assert np.isnan(X[:, names.index(col)]).all(), col


def test_validation_rows_at_a_hidden_trainer_count_carry_no_history_of_it(
        sim_workspace: Workspace, attempts: pd.DataFrame) -> None:
    """Each row's own (family, type, trainer count) runs, and its pair's larger trainer
    counts, are gone from its snapshot (no configuration or trainer-count level of the pair),
    its family's smaller trainer counts on the type are not."""
    cfg = small_train_config(pair_model=False)
    catalog = Catalog.default()
    history = prepare_history(attempts, catalog)
    builder = HistoryBuilder(history, lookback_days=cfg.lookback_days)
    spec = FeatureSpec.fit(attempts, catalog)
    X, y = new_trainer_count_rows(attempts, builder, catalog, SMALL_AS_OF, cfg, spec)
    builder.close()
    assert len(X) == len(y) >= 30 and np.isfinite(y).all()
    names = list(FEATURE_NAMES)
    for col in ("fam_hw_tc_n", "fam_hw_shape_n"):
        assert np.isnan(X[:, names.index(col)]).all(), col
    assert np.all(X[:, names.index("fam_hw_n")] > 0)
    assert new_trainer_count(X, names).all()


def test_a_trainer_count_new_to_its_pair_gets_its_own_interval_cell(
        trained_workspace: Workspace) -> None:
    """The cell is calibrated on the validation days' natural and hidden rows of that kind,
    and widens such a row's interval to it on each side (never narrows it); other rows keep
    the interval of their group."""
    art = Registry(trained_workspace.models_dir).load()
    assert art.intervals is not None
    lo_c, hi_c, used = art.intervals.quantiles_["new_trainer_count"]
    assert used >= art.intervals.min_rows and lo_c < 0 < hi_c
    with Store(trained_workspace.store_path, read_only=True) as store:
        jobs = load_attempts(store, SMALL_AS_OF, SMALL_AS_OF + timedelta(days=1))
    X = art.encode_full(jobs)
    new = new_trainer_count(X, FEATURE_NAMES)
    assert new.sum() >= 10 and (~new).sum() >= 100
    p = art.predict_encoded(X)
    lo, hi = p.lo - p.log, p.hi - p.log
    assert np.all(lo[new] <= lo_c + 1e-12) and np.all(hi[new] >= hi_c - 1e-12)
    cal = art.intervals
    plain_lo, plain_hi = cal.offsets(p.group, new_vendor(X, FEATURE_NAMES),
                                     art.on_new_type(X, FEATURE_NAMES),
                                     np.isnan(X[:, FEATURE_NAMES.index("mt_n")]))
    np.testing.assert_allclose(lo[~new], plain_lo[~new], rtol=0, atol=1e-12)
    np.testing.assert_allclose(hi[~new], plain_hi[~new], rtol=0, atol=1e-12)
    assert np.all(lo[new] <= plain_lo[new] + 1e-12) and np.all(hi[new] >= plain_hi[new] - 1e-12)
    # The held-out day reports those rows apart (among the new shapes).
    held = art.manifest["metrics"]["held_out"]
    shapes = held["novelty"]["seen_pair_new_shape"]
    assert 0 < held["new_trainer_count"]["n"] <= min(new.sum(), shapes["n"])
    assert 0 <= held["new_trainer_count"]["interval_coverage"] <= 1


def test_corrupt_or_foreign_artifacts_are_refused_clearly(fresh_copy: Workspace) -> None:
    reg = Registry(fresh_copy.models_dir)
    path = reg.path(reg.latest_version() or "")
    spec_file = path / "model" / "seen.router.txt"
    spec_file.write_text(spec_file.read_text() + "\n")
    with pytest.raises(ArtifactError, match=r"checksum mismatch for model/seen\.router\.txt"):
        load_artifact(path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["feature_version"] = 999
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError,
                       match=f"feature_version is 999 but this leap reads {FEATURE_VERSION}"):
        load_artifact(path)
    (path / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="is not a leap model artifact"):
        load_artifact(path)
    with pytest.raises(ArtifactError, match="no model version 'nope'"):
        reg.load("nope")


def test_quality_gate_refuses_and_rollback_restores(fresh_copy: Workspace) -> None:
    reg = Registry(fresh_copy.models_dir)
    first = reg.latest_version()
    with Store(fresh_copy.store_path, read_only=True) as store:
        # A gate that demands a full point more than the current model always refuses.
        # The gate and the registry are what is tested: no pair model, for speed.
        cfg = small_train_config(model_kind="global", pair_model=False)
        with pytest.raises(QualityGateError, match="refusing to publish: held-out accuracy"):
            train_nightly(store, CAT, reg, as_of=SMALL_AS_OF,
                          cfg=replace(cfg, quality_margin=-1.0))
        assert reg.versions() == [first]
        result = train_nightly(store, CAT, reg, as_of=SMALL_AS_OF, cfg=cfg)
    assert result.published and reg.latest_version() == result.version != first
    assert reg.rollback() == first and reg.latest_version() == first
    assert [h["action"] for h in reg.history()][-2:] == ["publish", "rollback"]


def test_training_twice_gives_the_same_model(sim_workspace: Workspace) -> None:
    cfg = small_train_config(model_kind="global", window_days=5)
    with Store(sim_workspace.store_path, read_only=True) as store:
        a = train_nightly(store, CAT, Registry(Path("/nonexistent")), as_of=SMALL_AS_OF,
                          cfg=cfg, publish=False)
        b = train_nightly(store, CAT, Registry(Path("/nonexistent")), as_of=SMALL_AS_OF,
                          cfg=cfg, publish=False)
    assert a.artifact is not None and b.artifact is not None
    assert a.artifact.model.to_files() == b.artifact.model.to_files()


def test_history_features_earn_their_place(sim_workspace: Workspace) -> None:
    """The no-history ablation trains (physics start point only) and is clearly worse (both
    without the pair model, which reads history too)."""
    acc = {}
    with Store(sim_workspace.store_path, read_only=True) as store:
        for use_history in (True, False):
            cfg = small_train_config(model_kind="global", window_days=5, use_history=use_history,
                                     pair_model=False)
            run = train_nightly(store, CAT, Registry(Path("/nonexistent")), as_of=SMALL_AS_OF,
                                cfg=cfg, publish=False)
            assert run.artifact is not None
            names = run.artifact.spec.names
            assert ("hist_est" in names) == use_history
            acc[use_history] = run.artifact.manifest["metrics"]["held_out"]["accuracy"]
    assert acc[True] > acc[False] + 0.1


def test_too_little_data_is_a_clear_error(sim_workspace: Workspace) -> None:
    with Store(sim_workspace.store_path, read_only=True) as store, \
            pytest.raises(ModelError, match="succeeded attempts in the window"):
        train_nightly(store, CAT, Registry(Path("/nonexistent")),
                      as_of=datetime(2025, 6, 1, tzinfo=UTC), publish=False)


# --- CLI ---------------------------------------------------------------------------------------

def test_cli_train_list_predict_check(fresh_copy: Workspace, tmp_path: Path) -> None:
    home = ["--home", str(fresh_copy.home)]
    res = runner.invoke(app, [*home, "train", "--as-of", "2026-01-12", "--window-days", "5",
                              "--model", "global", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["published"] and 0 < out["metrics"]["held_out"]["accuracy"] <= 1
    assert 0.8 < out["metrics"]["held_out"]["oracle_ceiling"] <= 1.0
    # The night's pair models and encoded days are kept for the next night's run, and the
    # run says what it made and read.
    for kept in ("pairs", "days"):
        assert any((fresh_copy.home / "cache" / kept).iterdir()), kept
    made = out["cache"]
    assert made["days_encoded"] == 5 and made["days_read"] == 0
    assert made["pair_models_fit"] >= 1 and made["pair_models_read"] == 0
    # Each novelty group with the families it is worth and its family-resampled confidence,
    # printed as a table without --json.
    seen = out["metrics"]["held_out"]["novelty"]["seen_config"]
    lo, hi = seen["interval_coverage_ci"]
    assert seen["effective_families"] >= 1 and lo <= seen["interval_coverage"] <= hi
    from leap.cli import console
    from leap.cli.model import print_train
    with console.capture() as shown:
        print_train(out)
    assert "by novelty group" in shown.get() and "seen config" in shown.get()
    assert "(<home>/cache): 0 days read, 5 encoded" in shown.get()
    # The same night again (a rerun after a failed publish, say) reads all of it back.
    res = runner.invoke(app, [*home, "train", "--as-of", "2026-01-12", "--window-days", "5",
                              "--model", "global", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    again = json.loads(res.stdout)["cache"]
    assert again == {"days_read": 5, "days_encoded": 0,
                     "pair_models_read": made["pair_models_fit"], "pair_models_fit": 0}
    res = runner.invoke(app, [*home, "models", "list", "--json"])
    listing = json.loads(res.stdout)
    assert listing["latest"] == out["version"] and len(listing["versions"]) == 2

    jobs = tmp_path / "jobs.csv"
    pd.DataFrame({"attempt_id": ["a-17"], "my_key": [42], "family_id": ["x"],
                  "model_type": ["vision-001"], "trainer_count": [1], "batch_size": [32],
                  "precision": ["bf16"]}).to_csv(jobs, index=False)
    out_csv = tmp_path / "pred.csv"
    res = runner.invoke(app, [*home, "predict", str(jobs), "--candidates", "H100-SXM,T4",
                              "--out", str(out_csv)])
    assert res.exit_code == 0, res.output
    pred = pd.read_csv(out_csv)
    assert list(pred["hardware"]) == ["H100-SXM", "T4"]
    assert (pred["predicted_throughput"] > 0).all()
    # Columns that are not job features come back, so predictions join to the input.
    assert list(pred["attempt_id"]) == ["a-17", "a-17"] and list(pred["my_key"]) == [42, 42]
    assert (pred["throughput_p10"] <= pred["predicted_throughput"]).all()
    assert (pred["predicted_throughput"] <= pred["throughput_p90"]).all()
    assert set(pred["novelty"]) == {"new_family"}
    # Without --out: the same rows as a table in 80 columns, each prediction with its range.
    res = runner.invoke(app, [*home, "predict", str(jobs), "--candidates", "H100-SXM,T4"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "…" not in res.output and max(map(len, lines)) <= 80
    for _, p in pred.iterrows():
        row = next(line for line in lines if f" {p['hardware']} " in line)
        assert si(p["predicted_throughput"]) in row and "new family" in row
        assert f"{si(p['throughput_p10'])}–{si(p['throughput_p90'])}" in row

    res = runner.invoke(app, [*home, "predict", str(jobs), "--candidates", "H10O"])
    assert res.exit_code == 1 and "unknown hardware 'H10O'; did you mean" in res.output

    res = runner.invoke(app, [*home, "check-features", "--as-of", "2026-01-11", "--sample",
                              "200", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True

    res = runner.invoke(app, [*home, "train", "--as-of", "2026-13-01"])
    assert res.exit_code == 1 and "--as-of must be a date like 2026-01-31" in res.output
