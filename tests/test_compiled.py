"""Compiled scoring: equal to LightGBM, cached beside the artifact, refused when it differs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from leap.config import Workspace
from leap.features.encode import jobs_frame
from leap.features.pair_rows import PAIR_FEATURES
from leap.model import compiled
from leap.model.artifact import Registry, load_artifact
from leap.rank.ranker import Ranker
from test_rank import sample_jobs

pytestmark = pytest.mark.skipif(compiled.unavailable() is not None,
                                reason=f"compiled scoring unavailable: {compiled.unavailable()}")


@pytest.fixture(autouse=True)
def _quick_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "INLINE", False)  # the same code, compiled ~8x faster


@pytest.fixture(scope="module")
def compiled_dir(trained_workspace: Workspace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the published artifact with its boosters compiled and cached (once)."""
    reg = Registry(trained_workspace.models_dir)
    dest = tmp_path_factory.mktemp("compiled") / "artifact"
    shutil.copytree(reg.path(reg.latest_version() or ""), dest,
                    ignore=shutil.ignore_patterns(compiled.COMPILED_DIR))
    art = load_artifact(dest)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiled, "INLINE", False)  # the same code, compiled ~8x faster
        assert compiled.compile_artifact(art, build=True) == "compiled"
    return dest


@pytest.fixture(scope="module")
def some_jobs(trained_workspace: Workspace) -> list[dict[str, Any]]:
    return sample_jobs(trained_workspace, 150)


def test_compiled_predictions_and_rankings_equal_lightgbm(
        compiled_dir: Path, some_jobs: list[dict[str, Any]]) -> None:
    fast, plain = load_artifact(compiled_dir), load_artifact(compiled_dir)
    assert compiled.compile_artifact(fast, build=False) == "compiled"
    assert fast.model is not plain.model
    rows = jobs_frame([{**j, "hardware": hw} for j in some_jobs for hw in list(fast.catalog)])
    got, want = fast.predict_log(rows), plain.predict_log(rows)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
    # The pair model's boosters are compiled too, and encode the same rows.
    pairs = fast.snapshot.pairs
    assert pairs is not None and set(pairs.scorers_) == set(pairs.named_boosters())
    assert plain.snapshot.pairs is not None and plain.snapshot.pairs.scorers_ == {}
    np.testing.assert_allclose(fast.encode(rows), plain.encode(rows), rtol=1e-9, atol=1e-12)
    a, b = Ranker(fast), Ranker(plain, compiled=False)
    assert a.model_info()["scoring"] == "compiled"
    assert b.model_info()["scoring"] == "lightgbm"
    for job in some_jobs[:60]:
        ra, rb = a.rank(job), b.rank(job)
        assert [r.hardware for r in ra.ranking] == [r.hardware for r in rb.ranking]
        assert [e.hardware for e in ra.excluded] == [e.hardware for e in rb.excluded]
        np.testing.assert_allclose([r.predicted_throughput for r in ra.ranking],
                                   [r.predicted_throughput for r in rb.ranking], rtol=1e-9)


def test_cache_beside_the_artifact_is_reused_and_keeps_checksums(
        compiled_dir: Path) -> None:
    folder = compiled_dir / compiled.COMPILED_DIR
    index = json.loads((folder / "index.json").read_text())
    assert index and all((folder / f"{name}.o").is_file() for name in index)
    load_artifact(compiled_dir, verify=True)  # the cache is no file of the manifest
    # The default Ranker uses a cached compile, and never builds one.
    assert Ranker(load_artifact(compiled_dir)).model_info()["scoring"] == "compiled"


def test_no_cache_without_build_stays_on_lightgbm(trained_workspace: Workspace,
                                                  tmp_path: Path) -> None:
    reg = Registry(trained_workspace.models_dir)
    dest = tmp_path / "artifact"
    # (a `leap serve` of another test may have compiled the shared fixture's model)
    shutil.copytree(reg.path(reg.latest_version() or ""), dest,
                    ignore=shutil.ignore_patterns(compiled.COMPILED_DIR))
    art = load_artifact(dest)
    status = compiled.compile_artifact(art, build=False)
    assert status.startswith("lightgbm: no compiled model cached")
    assert art.model.seen.scorers_ == {} if art.model.kind == "split" else True
    assert art.snapshot.pairs is None or art.snapshot.pairs.scorers_ == {}
    assert Ranker(load_artifact(dest)).model_info()["scoring"] == "lightgbm"  # nothing cached


def test_a_stale_cache_key_is_not_loaded(compiled_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "artifact"
    shutil.copytree(compiled_dir, dest)
    index_path = dest / compiled.COMPILED_DIR / "index.json"
    index = json.loads(index_path.read_text())
    index[next(iter(index))] = "0" * 64  # compiled by another lleaves / CPU / model text
    index_path.write_text(json.dumps(index))
    status = compiled.compile_artifact(load_artifact(dest), build=False)
    assert status.startswith("lightgbm: no compiled model cached")


def test_a_compiled_booster_that_differs_is_refused(
        compiled_dir: Path, monkeypatch: pytest.MonkeyPatch,
        some_jobs: list[dict[str, Any]]) -> None:
    call = compiled.CompiledBooster.__call__
    monkeypatch.setattr(compiled.CompiledBooster, "__call__",
                        lambda self, X: call(self, X) + 1e-7)
    art, plain = load_artifact(compiled_dir), load_artifact(compiled_dir)
    status = compiled.compile_artifact(art, build=False)
    assert status.startswith("lightgbm: compiled booster") and "differs from LightGBM" in status
    rows = jobs_frame([{**j, "hardware": "H100-SXM"} for j in some_jobs])
    np.testing.assert_array_equal(art.predict_log(rows), plain.predict_log(rows))


def test_a_compiled_pair_booster_that_differs_is_refused(
        compiled_dir: Path, monkeypatch: pytest.MonkeyPatch,
        some_jobs: list[dict[str, Any]]) -> None:
    """Only the pair model's code is off: the check catches it on the rows the probe's
    encoding scored, and nothing is left compiled."""
    call = compiled.CompiledBooster.__call__
    monkeypatch.setattr(compiled.CompiledBooster, "__call__",
                        lambda self, X: call(self, X) + (1e-7 if self.n_features
                                                         == len(PAIR_FEATURES) else 0.0))
    art, plain = load_artifact(compiled_dir), load_artifact(compiled_dir)
    status = compiled.compile_artifact(art, build=False)
    assert status.startswith("lightgbm: compiled booster pairs.pairs_"), status
    assert art.snapshot.pairs is not None and art.snapshot.pairs.scorers_ == {}
    rows = jobs_frame([{**j, "hardware": "H100-SXM"} for j in some_jobs])
    np.testing.assert_array_equal(art.encode(rows), plain.encode(rows))
    np.testing.assert_array_equal(art.predict_log(rows), plain.predict_log(rows))


def test_compiler_missing_or_failing_falls_back(compiled_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    art = load_artifact(compiled_dir)
    monkeypatch.setattr(compiled, "unavailable", lambda: "lleaves is not installed (lleaves)")
    assert compiled.compile_artifact(art) == "lightgbm: lleaves is not installed (lleaves)"
    monkeypatch.setattr(compiled, "unavailable", lambda: None)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(compiled, "_compile_one", broken)
    assert compiled.compile_artifact(art).startswith("lightgbm: compiling failed (OSError")
    r = Ranker(art, compiled=True)
    assert r.model_info()["scoring"].startswith("lightgbm")
    assert r.rank({"family_id": "f", "model_type": "m", "trainer_count": 1,
                   "batch_size": 8}).ok


def test_use_lightgbm_drops_the_compiled_scorers(compiled_dir: Path,
                                                 some_jobs: list[dict[str, Any]]) -> None:
    art, plain = load_artifact(compiled_dir), load_artifact(compiled_dir)
    compiled.compile_artifact(art, build=False)
    assert art.snapshot.pairs is not None and art.snapshot.pairs.scorers_
    compiled.use_lightgbm(art)
    assert art.extra["scoring"] == "lightgbm"
    assert art.snapshot.pairs.scorers_ == {}
    rows = jobs_frame([{**j, "hardware": "L4"} for j in some_jobs])
    np.testing.assert_array_equal(art.predict_log(rows), plain.predict_log(rows))
