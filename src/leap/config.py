"""Workspace configuration, built once at the edge (CLI or app factory) and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = Path(".leap")


@dataclass(frozen=True)
class Workspace:
    """Where leap keeps its state: the attempt store and the published models.

    Examples
    --------
    >>> ws = Workspace(Path("/tmp/leap-home"))
    >>> ws.store_path.name
    'leap.duckdb'
    """

    home: Path
    catalog_path: Path | None = None

    @property
    def store_path(self) -> Path:
        return self.home / "leap.duckdb"

    @property
    def models_dir(self) -> Path:
        return self.home / "models"

    @property
    def cache_dir(self) -> Path:
        """What a nightly training keeps for the next (:class:`leap.model.window.NightCache`)."""
        return self.home / "cache"

    @property
    def work_dir(self) -> Path:
        """Scratch space for resumable jobs (backtests) and reports."""
        return self.home / "work"

    def ensure(self) -> Workspace:
        self.home.mkdir(parents=True, exist_ok=True)
        return self
