"""The self-contained model artifact and the registry of published versions.

An artifact is a directory: LightGBM text models, the history snapshot (Parquet), the feature
spec, the catalog snapshot, window and metrics, and a manifest with versions and a SHA-256 of
every file. No pickle. Publishing writes a hidden temporary directory, renames it into place,
then swaps the ``LATEST`` pointer with an atomic rename: a reader sees the old model or the
new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap import __version__
from leap.catalog import Catalog
from leap.errors import ArtifactError, CatalogError
from leap.features.columns import Columns
from leap.features.encode import (
    FEATURE_NAMES,
    FEATURE_VERSION,
    FeatureSpec,
    base_margin,
    encode,
    novelty,
)
from leap.features.history import Snapshot
from leap.model.cascade import Model, model_from_files
from leap.model.intervals import IntervalCalibrator

ARTIFACT_VERSION = 1
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "LATEST"
LOG = "published.jsonl"
INTERVALS = "intervals.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Artifact:
    """A loaded model with everything serving needs; :meth:`predict_log` is the one entry."""

    version: str
    path: Path | None
    manifest: dict[str, Any]
    model: Model
    snapshot: Snapshot
    spec: FeatureSpec
    catalog: Catalog
    intervals: IntervalCalibrator | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.full_spec = FeatureSpec(names=FEATURE_NAMES, vocab=self.spec.vocab)
        self.model_cols = np.array([FEATURE_NAMES.index(n) for n in self.spec.names],
                                   dtype=np.intp)

    @property
    def fallback_log_tp(self) -> float:
        return float(self.manifest["fallback_log_throughput"])

    def encode(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Model rows for ``jobs`` (each with a ``hardware`` column) via the one feature path."""
        return encode(jobs, self.snapshot, self.catalog, self.spec)

    def encode_full(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Every feature column (:data:`~leap.features.encode.FEATURE_NAMES`) of ``jobs``."""
        return encode(jobs, self.snapshot, self.catalog, self.full_spec)

    def predict_encoded(self, X_full: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Log samples/s and its interval ``(pred, lo, hi)`` for rows from :meth:`encode_full`.

        Without calibrated intervals (never for a model this leap trained), ``lo`` and ``hi``
        are NaN.
        """
        X = X_full[:, self.model_cols]
        if len(X) == 0:
            return np.empty(0), np.empty(0), np.empty(0)
        pred = np.asarray(self.model.predict(X, base=base_margin(X, self.spec,
                                                                 self.fallback_log_tp)))
        if self.intervals is None:
            return pred, np.full(len(pred), np.nan), np.full(len(pred), np.nan)
        lo, hi = self.intervals.offsets(novelty(X_full, FEATURE_NAMES))
        return pred, pred + lo, pred + hi

    def predict_interval(self, jobs: Columns | pd.DataFrame
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Predicted log samples/s with its interval, ``(pred, lo, hi)``, per job row."""
        return self.predict_encoded(self.encode_full(jobs))

    def predict_log(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Predicted log samples/s for each job row on its ``hardware``."""
        X = self.encode(jobs)
        return self.model.predict(X, base=base_margin(X, self.spec, self.fallback_log_tp))

    def predict(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Predicted samples/s for each job row on its ``hardware``."""
        return np.exp(self.predict_log(jobs))


def write_artifact(directory: Path, *, model: Model, snapshot: Snapshot, spec: FeatureSpec,
                   catalog: Catalog, info: dict[str, Any],
                   intervals: IntervalCalibrator | None = None) -> Path:
    """Write a complete artifact into ``directory`` (which must not exist) and return it."""
    if directory.exists():
        raise ArtifactError(f"artifact directory {directory} already exists")
    directory.mkdir(parents=True)
    model_dir = directory / "model"
    model_dir.mkdir()
    for name, text in model.to_files().items():
        (model_dir / name).write_text(text)
    snapshot.save(directory / "snapshot")
    (directory / "feature_spec.json").write_text(spec.to_json())
    (directory / "catalog.toml").write_text(catalog.to_toml())
    if intervals is not None:
        (directory / INTERVALS).write_text(intervals.to_json())
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    manifest = {
        "artifact_version": ARTIFACT_VERSION,
        "schema_version": SCHEMA_VERSION,
        "feature_version": FEATURE_VERSION,
        "leap_version": __version__,
        "created_at": datetime.now(UTC).isoformat(),
        "model_kind": model.kind,
        "catalog_fingerprint": catalog.fingerprint(),
        **info,
        "files": {str(p.relative_to(directory)): _sha256(p) for p in files},
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return directory


def load_artifact(directory: Path, *, verify: bool = True) -> Artifact:
    """Load an artifact, checking versions and (by default) every file's checksum."""
    mpath = directory / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{directory} is not a leap model artifact (no {MANIFEST})")
    try:
        manifest = json.loads(mpath.read_text())
    except ValueError as exc:
        raise ArtifactError(f"{mpath} is not valid JSON ({exc}); the artifact is corrupt") from None
    for key, want in (("artifact_version", ARTIFACT_VERSION), ("schema_version", SCHEMA_VERSION),
                      ("feature_version", FEATURE_VERSION)):
        got = manifest.get(key)
        if got != want:
            raise ArtifactError(f"{directory}: {key} is {got!r} but this leap reads {want}; "
                                "retrain with this version (leap train)")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ArtifactError(f"{mpath} lists no files; the artifact is corrupt")
    if verify:
        for rel, digest in files.items():
            p = directory / rel
            if not p.is_file():
                raise ArtifactError(f"{directory}: file {rel} is missing; the artifact is "
                                    "incomplete (republish or roll back)")
            if _sha256(p) != digest:
                raise ArtifactError(f"{directory}: checksum mismatch for {rel}; the file was "
                                    "modified or corrupted (republish or roll back)")
    model_files = {p.name: p.read_text() for p in (directory / "model").iterdir()
                   if p.is_file()}
    model = model_from_files(model_files)
    spec = FeatureSpec.from_json((directory / "feature_spec.json").read_text())
    try:
        catalog = Catalog.from_toml((directory / "catalog.toml").read_text(),
                                    f"{directory}/catalog.toml")
    except CatalogError as exc:
        raise ArtifactError(str(exc)) from None
    snapshot = Snapshot.load(directory / "snapshot")
    intervals = IntervalCalibrator.from_json((directory / INTERVALS).read_text()) \
        if (directory / INTERVALS).is_file() else None
    return Artifact(version=str(manifest.get("version", directory.name)), path=directory,
                    manifest=manifest, model=model, snapshot=snapshot, spec=spec,
                    catalog=catalog, intervals=intervals)


class Registry:
    """Published model versions under ``models_dir`` and the ``LATEST`` pointer.

    Examples
    --------
    >>> # reg = Registry(workspace.models_dir)
    >>> # reg.publish(tmp_dir, "20260201-01"); reg.latest_version()
    """

    def __init__(self, models_dir: Path) -> None:
        self.root = models_dir

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file())

    def latest_version(self) -> str | None:
        p = self.root / LATEST
        if not p.is_file():
            return None
        v = p.read_text().strip()
        return v or None

    def path(self, version: str) -> Path:
        p = self.root / version
        if not (p / MANIFEST).is_file():
            known = ", ".join(self.versions()) or "none"
            raise ArtifactError(f"no model version '{version}' in {self.root} (known: {known})")
        return p

    def load(self, version: str | None = None, *, verify: bool = True) -> Artifact:
        """Load ``version`` (default: the latest published)."""
        if version is None:
            version = self.latest_version()
            if version is None:
                raise ArtifactError(f"no published model in {self.root}; run `leap train` first")
        return load_artifact(self.path(version), verify=verify)

    def new_version(self, as_of: datetime) -> str:
        stem = as_of.strftime("%Y%m%d")
        taken = {v for v in self.versions() if v.startswith(stem)}
        n = 1
        while f"{stem}-{n:02d}" in taken:
            n += 1
        return f"{stem}-{n:02d}"

    def staging_dir(self, version: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        d = self.root / f".staging-{version}-{os.getpid()}"
        if d.exists():
            shutil.rmtree(d)
        return d

    def publish(self, staged: Path, version: str, *, make_latest: bool = True) -> Path:
        """Move a fully written artifact into place, then point ``LATEST`` at it atomically."""
        final = self.root / version
        if final.exists():
            raise ArtifactError(f"model version {version} already exists in {self.root}")
        os.replace(staged, final)
        if make_latest:
            self._set_latest(version, "publish")
        return final

    def rollback(self, to: str | None = None) -> str:
        """Point ``LATEST`` back at ``to`` (default: the version published before the current)."""
        current = self.latest_version()
        if to is None:
            older = [v for v in self.versions() if current is None or v < current]
            if not older:
                raise ArtifactError("there is no earlier model version to roll back to "
                                    f"(versions: {', '.join(self.versions()) or 'none'})")
            to = older[-1]
        self.path(to)
        self._set_latest(to, "rollback")
        return to

    def history(self) -> list[dict[str, Any]]:
        p = self.root / LOG
        if not p.is_file():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def _set_latest(self, version: str, action: str) -> None:
        tmp = self.root / f".{LATEST}.{os.getpid()}.tmp"
        tmp.write_text(version + "\n")
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.root / LATEST)
        with (self.root / LOG).open("a") as f:
            f.write(json.dumps({"at": datetime.now(UTC).isoformat(), "action": action,
                                "version": version}) + "\n")
