"""Backtest: planning, per-night metrics, resume after a kill, and serial = Dask results."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from conftest import small_train_config
from leap import metrics
from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.errors import ConfigError, ParamError
from leap.eval.backtest import (
    FORMAT_VERSION,
    Night,
    comparable,
    last_full_day,
    night_path,
    plan_nights,
    run_backtest,
)
from leap.eval.backtest_summary import BacktestSummary, summarize
from leap.eval.baselines import gpu_hours, lookup_comparison
from leap.eval.parallel import Parallel
from leap.eval.studies import eval_day

# Three days of training per night and the global model keep each fit to a second or two
# (the cascade runs the same night code; only the model differs).
CFG = small_train_config(window_days=3, model_kind="global")
LAST = datetime(2026, 1, 12, tzinfo=UTC)


def test_plan_nights_ends_at_the_last_full_day(sim_workspace: Workspace) -> None:
    with Store(sim_workspace.store_path, read_only=True) as store:
        assert last_full_day(store) == LAST
        days = plan_nights(store, 3, 3)
        assert days == [LAST - timedelta(days=2), LAST - timedelta(days=1), LAST]
        assert plan_nights(store, 2, 3, end=LAST - timedelta(days=1))[-1] == LAST - timedelta(
            days=1)
        with pytest.raises(ParamError, match=r"need 23 days .* use nights 9") as err:
            plan_nights(store, 20, 3)
        # The library names its parameters; the CLI names its flags.
        assert err.value.params == ("nights", "window_days")
        assert "use --nights 9 or a shorter --window-days" in err.value.render(
            {"nights": "--nights", "window_days": "--window-days"})
        with pytest.raises(ConfigError, match="after the last full day"):
            plan_nights(store, 1, 3, end=LAST + timedelta(days=1))
        with pytest.raises(ConfigError, match=r"^nights must be >= 1"):
            plan_nights(store, 0, 3)


def test_the_cli_names_flags_where_the_library_names_parameters(
        sim_workspace: Workspace) -> None:
    from typer.testing import CliRunner

    from leap.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["--home", str(sim_workspace.home), "backtest", "--nights",
                                   "20", "--window-days", "3", "--json"])
    assert res.exit_code == 1
    assert "use --nights 9 or a shorter --window-days" in " ".join(res.output.split())


def test_parallel_settings() -> None:
    assert sorted(Parallel().map(abs, [-2, 1])) == [(0, 2), (1, 1)]
    assert list(Parallel(workers=3).map(abs, [])) == []
    with pytest.raises(ConfigError, match="workers must be a whole number"):
        Parallel(workers=0)
    with pytest.raises(ConfigError, match="scheduler address like tcp://"):
        Parallel(dask="10.0.0.5:8786")


def test_summary_is_median_min_max_over_nights() -> None:
    nights = [{"held_out": {"accuracy": a, "accuracy_gpu_hours": g}}
              for a, g in ((0.7, 0.6), (0.9, float("nan")), (0.8, 0.5))]
    s = summarize(nights)
    assert s.to_dict()["accuracy"] == {"median": 0.8, "min": 0.7, "max": 0.9,
                                       "mean": pytest.approx(0.8), "n": 3}
    gpu = s.figure("accuracy_gpu_hours")
    assert gpu is not None and gpu.n == 2 and gpu.median == 0.55
    assert s.figure("oracle_ceiling") is None and s.to_dict()["oracle_ceiling"] is None
    assert s.paper["accuracy_median"] == 0.77
    assert BacktestSummary.from_dict(s.to_dict()) == s


@pytest.fixture(scope="module")
def serial_run(sim_workspace: Workspace, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[Path, list[Night], list[list[str]]]:
    """2 nights, then 3 nights with the same settings (the second run resumes the first)."""
    work = tmp_path_factory.mktemp("bt-serial")
    first = run_backtest(sim_workspace.store_path, Catalog.default(), CFG, nights=2,
                         work_dir=work)
    seen: list[tuple[int, int]] = []
    second = run_backtest(sim_workspace.store_path, Catalog.default(), CFG, nights=3,
                          work_dir=work, progress=lambda d, t, n: seen.append((d, t)))
    assert seen[0] == (2, 3) and seen[-1] == (3, 3)  # the bar starts at the reused nights
    return second.run_dir, second.nights, [first.computed, second.computed, second.reused]


def test_a_longer_backtest_resumes_with_one_new_fit(
        serial_run: tuple[Path, list[Night], list[list[str]]]) -> None:
    run_dir, nights, (first, computed, reused) = serial_run
    assert first == ["2026-01-11", "2026-01-12"]
    assert computed == ["2026-01-10"] and reused == ["2026-01-11", "2026-01-12"]
    assert [n.day for n in nights] == ["2026-01-10", "2026-01-11", "2026-01-12"]
    for n in nights:
        assert night_path(run_dir, n.day).is_file()
    assert json.loads((run_dir / "settings.json").read_text())["format"] == FORMAT_VERSION
    assert (run_dir / "model-2026-01-12" / "manifest.json").is_file()


def test_a_killed_backtest_recomputes_only_the_missing_night(
        sim_workspace: Workspace, serial_run: tuple[Path, list[Night], list[list[str]]],
        tmp_path: Path) -> None:
    run_dir, nights, _ = serial_run
    work = tmp_path / "work"
    copy = work / run_dir.name
    copy.mkdir(parents=True)
    for n in nights[:2]:
        src = night_path(run_dir, n.day)
        (copy / src.name).write_text(src.read_text())
    # What a kill can leave: a temporary file that was never renamed, and no third night.
    (copy / ".night-2026-01-12.json.123.tmp").write_text("{half")
    again = run_backtest(sim_workspace.store_path, Catalog.default(), CFG, nights=3,
                         work_dir=work)
    assert again.computed == ["2026-01-12"]
    assert [comparable(n) for n in again.nights] == [comparable(n) for n in nights]


def test_night_figures_match_the_definitions(
        sim_workspace: Workspace, serial_run: tuple[Path, list[Night], list[list[str]]]) -> None:
    run_dir, nights, _ = serial_run
    night = nights[-1]
    with Store(sim_workspace.store_path, read_only=True) as store:
        # The model the backtest kept for its last night: no new fit.
        ed = eval_day(store, Catalog.default(), CFG, as_of=LAST,
                      saved=run_dir / "model-2026-01-12")
    assert ed.source.startswith("kept by the backtest")
    actual = ed.held["throughput"].to_numpy(dtype=float)
    held = night.held_out
    assert held.n == len(ed.held)
    assert held.accuracy == pytest.approx(metrics.accuracy(ed.held_pred, actual))
    assert held.accuracy_gpu_hours == pytest.approx(
        metrics.accuracy(ed.held_pred, actual, gpu_hours(ed.held)))
    assert held.median_ape == pytest.approx(metrics.median_ape(ed.held_pred, actual))
    assert held.coverage == 1.0
    seen, unseen = held.seen_families, held.unseen_families
    assert seen.n + unseen.n == held.n
    lookup = night.lookup.to_dict()
    again = lookup_comparison(ed.past, ed.held, ed.held_pred, ed.artifact.catalog).to_dict()
    assert lookup.pop("keys") == again.pop("keys")
    # NaN-safe: a group without rows has NaN figures.
    assert json.dumps(lookup.pop("spec_ratio_transfer"), sort_keys=True) == json.dumps(
        again.pop("spec_ratio_transfer"), sort_keys=True)
    assert lookup == pytest.approx(again)
    ceiling = night.oracle_ceiling
    assert ceiling is not None and held.accuracy < ceiling.accuracy <= 1.0
    hist = night.error_hist
    assert sum(hist.counts) == held.n
    assert np.isclose(hist.log10_edges[0], -1.0)


def test_dask_local_cluster_gives_the_serial_results(
        sim_workspace: Workspace, serial_run: tuple[Path, list[Night], list[list[str]]],
        tmp_path: Path) -> None:
    _, nights, _ = serial_run
    # Two nights, one on each worker at once: the serial run's last two.
    result = run_backtest(sim_workspace.store_path, Catalog.default(), CFG, nights=2,
                          work_dir=tmp_path, parallel=Parallel(workers=2, dask="local"))
    assert sorted(result.computed) == ["2026-01-11", "2026-01-12"]
    assert result.settings["backend"] == "dask"
    assert [comparable(n) for n in result.nights] == [comparable(n) for n in nights[1:]]


@pytest.mark.slow
def test_local_processes_give_the_serial_results(
        sim_workspace: Workspace, serial_run: tuple[Path, list[Night], list[list[str]]],
        tmp_path: Path) -> None:
    _, nights, _ = serial_run
    result = run_backtest(sim_workspace.store_path, Catalog.default(), CFG, nights=3,
                          work_dir=tmp_path, parallel=Parallel(workers=2))
    assert [comparable(n) for n in result.nights] == [comparable(n) for n in nights]


def test_eval_day_prefers_the_published_model_of_the_day(trained_workspace: Workspace) -> None:
    with Store(trained_workspace.store_path, read_only=True) as store:
        ed = eval_day(store, Catalog.default(), CFG, models_dir=trained_workspace.models_dir)
        assert ed.source.startswith("published") and ed.as_of == LAST
        assert len(ed.day) > len(ed.held) > 0 and len(ed.held_pred) == len(ed.held)
        assert ed.past["submitted_at"].max() < LAST
        with pytest.raises(ParamError, match="use source train"):
            eval_day(store, Catalog.default(), CFG, as_of=LAST - timedelta(days=1),
                     models_dir=trained_workspace.models_dir, source="published")
        with pytest.raises(ConfigError, match="must be auto, published or train"):
            eval_day(store, Catalog.default(), CFG, source="latest")


def test_a_night_trained_alone_equals_the_backtest_night(
        sim_workspace: Workspace, serial_run: tuple[Path, list[Night], list[list[str]]]) -> None:
    # The backtest reused encoded days from its other nights; a fresh fit must agree.
    _, nights, _ = serial_run
    day = LAST - timedelta(days=1)
    with Store(sim_workspace.store_path, read_only=True) as store:
        ed = eval_day(store, Catalog.default(), CFG, as_of=day, source="train")
    assert ed.source == "trained on 2026-01-08..2026-01-10"
    held = next(n for n in nights if n.day == "2026-01-11").held_out
    actual = ed.held["throughput"].to_numpy(dtype=float)
    assert held.accuracy == metrics.accuracy(ed.held_pred, actual)


def test_one_test_of_a_simulated_store(sim_workspace: Workspace, tmp_path: Path) -> None:
    from leap.eval.oracle import is_simulated, oracle_ceiling, oracle_fleet
    from leap.model.window import load_attempts, succeeded_attempts

    with Store(sim_workspace.store_path, read_only=True) as store:
        assert is_simulated(store)
        fleet = oracle_fleet(store)
        assert fleet is not None
        day = succeeded_attempts(load_attempts(store, LAST, LAST + timedelta(days=1)),
                                 Catalog.default())
        ceiling = oracle_ceiling(fleet, day)
        # The truth is not the measurement (noise), but it is close to it.
        assert 0.5 < ceiling.accuracy < 1.0 and 0.0 < ceiling.median_ape < 0.2
    with Store(tmp_path / "real.duckdb") as store:
        assert not is_simulated(store) and oracle_fleet(store) is None
        for key in ("scenario", "seed", "start"):
            store.set_meta(f"sim.{key}", "x")
        store.set_meta("sim.version", "0")
        # Simulated, but by another simulator: no oracle for an optional figure, and a
        # study that needs one stops with the fix.
        assert is_simulated(store) and oracle_fleet(store) is None
        with pytest.raises(ConfigError, match="simulator version 0"):
            oracle_fleet(store, strict=True)
