"""The multi-machine path: the Parquet export, rows kept on workers, emulated early stopping,
and nightly training on a 2-worker Dask LocalCluster against the one-machine run."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import dask.array as da
import lightgbm as lgb
import numpy as np
import pytest

from conftest import SMALL_AS_OF, SMALL_START, small_train_config
from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.export import MARKER, ParquetAttempts, export_parquet
from leap.data.store import Store
from leap.errors import DataError, ParamError
from leap.features import pairs
from leap.features.encode import FeatureSpec
from leap.features.pairs import PairSchedule
from leap.model import window
from leap.model.artifact import Registry
from leap.model.cascade import GBMParams
from leap.model.distributed import (
    BlockRows,
    EncodeTask,
    _encode_task,
    _night_share_task,
    dask_client,
    deal_rows,
    early_stop_rounds,
)
from leap.model.train import train_nightly
from leap.model.window import (
    CacheUse,
    DayBlocks,
    NightCache,
    history_builder,
    load_attempts,
)

CAT = Catalog.default()


def test_export_reads_back_as_the_store_gives_it(sim_workspace: Workspace,
                                                 tmp_path: Path) -> None:
    start, end = SMALL_START + timedelta(days=2), SMALL_START + timedelta(days=5, hours=6)
    with Store(sim_workspace.store_path, read_only=True) as store:
        res = export_parquet(store, tmp_path / "export", start, end)
        expected = store.attempts(start, end)
        inner = store.attempts(start + timedelta(hours=30), end, columns=["attempt_id",
                                                                          "throughput"])
    assert res.rows == expected.num_rows > 0 and res.days == 4
    assert (tmp_path / "export" / MARKER).is_file()
    source = ParquetAttempts(tmp_path / "export")
    assert source.attempts(start, end).equals(expected)  # rows, order and types
    got = source.attempts(start + timedelta(hours=30), end, ["attempt_id", "throughput"])
    assert got.equals(inner)
    empty = source.attempts(end + timedelta(days=3), end + timedelta(days=4))
    assert empty.num_rows == 0 and empty.schema == expected.schema


def test_a_worker_judges_the_share_the_night_serves(sim_workspace: Workspace, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers encoding some of a night's days are told its share: the one the pair model
    served that night judges, fit on a worker over the export (as one machine fits it)."""
    cfg = small_train_config()
    window_start = SMALL_AS_OF - timedelta(days=cfg.window_days)
    with Store(sim_workspace.store_path, read_only=True) as store:
        export_parquet(store, tmp_path / "export", SMALL_START, SMALL_AS_OF)
        attempts = load_attempts(store, SMALL_START, SMALL_AS_OF)
    task = EncodeTask(str(tmp_path / "export"), CAT, replace(cfg, threads=1),
                      FeatureSpec.fit(attempts, CAT), window_start, ())
    monkeypatch.setattr(pairs, "NEIGHBOUR_SHARES", (0.5,))  # the only share there is to judge
    local = history_builder(attempts, CAT, SMALL_AS_OF, cfg).pairs
    assert isinstance(local, PairSchedule) and local(SMALL_AS_OF) is not None
    assert _night_share_task(task).share == local.night_share() == 0.5
    assert _night_share_task(replace(task, cfg=replace(task.cfg, pair_model=False))).share \
        is None


def test_workers_keep_and_read_the_night_cache(sim_workspace: Workspace, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker given the client's night cache keeps the days it encodes and the pair models
    it fits there; the next night's worker reads them instead (the same rows), and the
    client, told the entries its workers used, prunes only the others."""
    cfg = replace(small_train_config(window_days=3), threads=1)
    as_of = SMALL_AS_OF
    window_start = as_of - timedelta(days=cfg.window_days)
    with Store(sim_workspace.store_path, read_only=True) as store:
        export_parquet(store, tmp_path / "export", SMALL_START, as_of)
        attempts = load_attempts(store, SMALL_START, as_of)
    cache = NightCache.at(tmp_path / "cache")
    task = EncodeTask(str(tmp_path / "export"), CAT, cfg, FeatureSpec.fit(attempts, CAT),
                      window_start, (0, 1, 2), str(cache.directory))
    encoded: list[object] = []
    fits: list[object] = []
    real_encode, real_fit = window.encode, pairs.PairModel.fit.__func__
    monkeypatch.setattr(window, "encode", lambda rows, snap, *a, **k: (
        encoded.append(snap.as_of), real_encode(rows, snap, *a, **k))[1])
    monkeypatch.setattr(pairs.PairModel, "fit", classmethod(lambda cls, *a, **k: (
        fits.append(1), real_fit(cls, *a, **k))[1]))

    def night() -> tuple[DayBlocks, CacheUse]:
        """One night's workers: the share, then the days; and what they used."""
        encoded.clear()
        fits.clear()
        share = _night_share_task(task)
        blocks = _encode_task(task, share)
        return blocks, blocks.cached | share.cached

    first, made = night()
    assert encoded and fits and first.cached.asked
    assert made.counts() == {"days_read": 0, "days_encoded": 3, "pair_models_read": 0,
                             "pair_models_fit": len(fits)}
    for _ in range(2):  # the next nights' workers, each after the client pruned
        again, used = night()
        assert encoded == [] and fits == []
        np.testing.assert_array_equal(first.X, again.X)
        stale = cache.days.disk.directory / "stale"
        stale.mkdir()
        client = NightCache.at(cache.directory)
        client.keep(used)
        client.prune()
        # The client keeps what its workers used (the share's pair models too) and no more,
        # and counts what they read: the days and the served night's pair model, not the
        # week's that the days kept were encoded with.
        assert not stale.exists()
        assert {e.name for e in cache.days.disk.directory.iterdir()} \
            | {e.name for e in cache.pairs.disk.directory.iterdir()} == set(used.asked)
        assert made.counts()["pair_models_fit"] == 2
        assert client.used().counts() == {"days_read": 3, "days_encoded": 0,
                                          "pair_models_read": 1, "pair_models_fit": 0}


def test_export_refuses_foreign_directories_and_replaces_its_own(sim_workspace: Workspace,
                                                                 tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with Store(sim_workspace.store_path, read_only=True) as store:
        with pytest.raises(DataError, match="not empty and not a leap export"):
            export_parquet(store, foreign)
        assert (foreign / "notes.txt").read_text() == "keep me"
        first = export_parquet(store, tmp_path / "e", SMALL_START,
                               SMALL_START + timedelta(days=3))
        again = export_parquet(store, tmp_path / "e", SMALL_START,
                               SMALL_START + timedelta(days=1))
    assert first.days == 3 and again.days == 1
    assert len(list((tmp_path / "e").glob("date=*"))) == 1
    with pytest.raises(DataError, match="not a complete leap export"):
        ParquetAttempts(foreign)


def test_block_rows_index_like_numpy_and_keep_blocks_apart() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(n, 4)) for n in (5, 0, 7, 3)]
    full = np.concatenate(parts)
    X = BlockRows([da.from_array(p) for p in parts if len(p)], [5, 7, 3], 4)
    assert X.shape == (15, 4) and len(X) == 15
    np.testing.assert_array_equal(np.asarray(X), full)
    np.testing.assert_array_equal(X[:, 2], full[:, 2])
    mask = np.zeros(15, dtype=bool)
    mask[[1, 2, 12, 14]] = True  # nothing from the middle block
    sub = X[mask]
    assert sub.sizes == [2, 2] and len(sub.blocks) == 2
    np.testing.assert_array_equal(np.asarray(sub), full[mask])
    cols = X[np.array([0, 6, 7]), [3, 1]]
    assert cols.shape == (3, 2)
    np.testing.assert_array_equal(np.asarray(cols), full[[0, 6, 7]][:, [3, 1]])
    assert X.to_dask().numblocks == (3, 1)
    with pytest.raises(IndexError, match="in order"):
        X[np.array([3, 1])]


@pytest.mark.parametrize("objective", ["quantile", "l2"])
def test_emulated_early_stopping_stops_where_lightgbm_does(objective: str) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 5))
    y = X[:, 0] + 0.5 * X[:, 1] ** 2 + rng.normal(scale=0.4, size=3000)
    init = np.full(3000, 0.3)
    p = GBMParams(objective=objective, min_data_in_leaf=20, max_rounds=300,
                  early_stopping_rounds=10)
    train = lgb.Dataset(X[:2000], y[:2000], init_score=init[:2000])
    valid = lgb.Dataset(X[2000:], y[2000:], init_score=init[2000:], reference=train)
    stopped = lgb.train(p.lgb_params(), train, p.max_rounds, valid_sets=[valid],
                        callbacks=[lgb.early_stopping(p.early_stopping_rounds, verbose=False)])
    assert stopped.best_iteration < p.max_rounds  # the test must exercise a stop
    full = lgb.train(p.lgb_params(), lgb.Dataset(X[:2000], y[:2000], init_score=init[:2000]),
                     p.max_rounds)
    assert early_stop_rounds(full, (X[2000:], y[2000:], init[2000:]), p) \
        == stopped.best_iteration


def test_dask_address_is_checked_before_anything_runs() -> None:
    with pytest.raises(ParamError, match="'local' or a scheduler address"), \
            dask_client("my-cluster"):
        pass


def test_dask_rows_are_dealt_over_the_workers_in_order() -> None:
    rng = np.random.default_rng(2)
    blocks = [rng.normal(size=(n, 3)) for n in (7, 0, 4, 10)]
    full = np.concatenate(blocks)
    with dask_client("local", workers=2) as client:
        X, order = deal_rows(client, [client.scatter(b) for b in blocks], [7, 0, 4, 10], 3)
        assert X.sizes == [11, 10] and sorted(order) == list(range(21))
        np.testing.assert_array_equal(np.asarray(X), full[order])
        np.testing.assert_array_equal(order[:11], np.arange(0, 21, 2))  # row i to worker i % 2
        hands = [ws for key, ws in client.who_has().items() if "concatenate" in str(key)]
        assert sorted(len(ws) for ws in hands) == [1, 1] and hands[0] != hands[1]


def test_dask_training_matches_one_machine(trained_workspace: Workspace,
                                           tmp_path: Path) -> None:
    """Same window, same rows, a published artifact of the same kind, accuracy as one
    machine's: within 2.5 points. On this fleet (349 held-out attempts, 0.29 points each) one
    machine's seeds 0-4 spread 85.7-87.0% and 14 Dask runs 86.5-87.2% (session 44): a Dask
    run is not reproducible to the bit, as ``lightgbm.dask`` ranks the workers in the order
    the scheduler lists the data, and each rank bins some features on its own rows. Rows left
    where they were encoded, not dealt over the workers, lost 4 points. The one-machine run
    is the session's trained model (the same store, night and configuration)."""
    local_art = Registry(trained_workspace.models_dir).load()
    local = local_art.manifest
    with Store(trained_workspace.store_path, read_only=True) as store, \
            dask_client("local", workers=2) as client:
        dist = train_nightly(store, Catalog.default(), Registry(tmp_path / "m2"),
                             as_of=SMALL_AS_OF, cfg=small_train_config(), dask_client=client,
                             export_dir=tmp_path / "export",
                             disk_cache=NightCache.at(tmp_path / "cache"))
    assert dist.published
    # The workers kept the window's days and pair models for the next night.
    kept = NightCache.at(tmp_path / "cache")
    assert len(list(kept.days.disk.directory.iterdir())) == small_train_config().window_days
    assert any(kept.pairs.disk.directory.iterdir())
    assert dist.cache is not None and dist.cache["days_encoded"] == \
        small_train_config().window_days and dist.cache["pair_models_fit"] >= 1
    art = Registry(tmp_path / "m2").load()
    assert (local["as_of"], local["train_config"]) == (art.manifest["as_of"],
                                                       art.manifest["train_config"])
    assert dist.metrics.train_rows == local["metrics"]["train_rows"]
    assert dist.metrics.held_out is not None
    a_local = local["metrics"]["held_out"]["accuracy"]
    a_dist = dist.metrics.held_out.accuracy
    assert abs(a_dist - a_local) <= 0.025, (a_dist, a_local)
    assert art.manifest["model_kind"] == local["model_kind"]
    assert art.intervals is not None and local_art.intervals is not None
    # The worker that encodes the held-out day also builds the validation rows of hidden
    # types: as many as one machine builds calibrate the new-type cell.
    assert art.intervals.quantiles_["new_type"][2] == local_art.intervals.quantiles_["new_type"][2]
