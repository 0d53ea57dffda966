"""Shared fixtures: a small simulated fleet in a store, and a model trained on it.

Both are session-scoped and built once (a few seconds for the fleet, ~20 s for the model),
so every test that needs real attempts or a real artifact uses the real simulator and the
real training code, just on a small fleet.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from leap.catalog import Catalog
from leap.config import Workspace
from leap.data.store import Store
from leap.features.pairs import PairParams
from leap.model.artifact import Registry
from leap.model.train import train_nightly
from leap.model.window import TrainConfig
from leap.sim.run import simulate
from leap.sim.scenario import Scenario

SMALL_DAYS = 12
SMALL_SEED = 7
SMALL_START = datetime(2026, 1, 1, tzinfo=UTC)
#: The held-out day of the small trained model (the last simulated day).
SMALL_AS_OF = datetime(2026, 1, 12, tzinfo=UTC)
SMALL_WINDOW = 10
#: Seconds a test gives a `leap serve` subprocess to stop after SIGTERM: a graceful stop took
#: over 20 s once with the test files running side by side on a busy 2-core host.
SERVER_STOP_S = 60


def small_scenario() -> Scenario:
    return Scenario.load().override(attempts_per_day=1500, initial_families=400,
                                    n_model_types=60, new_families_per_day=8.0)


#: The pair boosters of the small fleet: a few hundred families need far fewer and smaller
#: trees than the default fleet's (fitted and compiled several times a suite run).
SMALL_PAIR_PARAMS = PairParams(rounds=60, num_leaves=31, shape_rounds=60, shape_num_leaves=31)


def small_train_config(**changes: Any) -> TrainConfig:
    return replace(TrainConfig(window_days=SMALL_WINDOW, n_specialists=3,
                               pair_params=SMALL_PAIR_PARAMS), **changes)


@pytest.fixture(scope="session")
def sim_workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A workspace whose store holds 12 days of a small simulated fleet (read it, don't write)."""
    ws = Workspace(tmp_path_factory.mktemp("sim-home")).ensure()
    with Store(ws.store_path) as store:
        simulate(store, Catalog.default(), small_scenario(), days=SMALL_DAYS, seed=SMALL_SEED,
                 start=SMALL_START)
    return ws


@pytest.fixture(scope="session")
def trained_workspace(sim_workspace: Workspace,
                      tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A copy of :func:`sim_workspace` with a published cascade (K = 3) trained on it."""
    home = tmp_path_factory.mktemp("trained-home")
    shutil.copy(sim_workspace.store_path, home / "leap.duckdb")
    ws = Workspace(home)
    with Store(ws.store_path, read_only=True) as store:
        train_nightly(store, Catalog.default(), Registry(ws.models_dir), as_of=SMALL_AS_OF,
                      cfg=small_train_config())
    return ws


@pytest.fixture
def fresh_copy(trained_workspace: Workspace, tmp_path: Path) -> Workspace:
    """A private, writable copy of the trained workspace (store and models)."""
    home = tmp_path / "home"
    shutil.copytree(trained_workspace.home, home)
    return Workspace(home)
