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
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from leap import __version__
from leap.catalog import Catalog
from leap.errors import ArtifactError, CatalogError, did_you_mean
from leap.features.columns import Columns
from leap.features.encode import (
    FEATURE_NAMES,
    FEATURE_VERSION,
    FeatureSpec,
    base_margin,
    encode,
    feature_positions,
    jobs_frame,
    new_trainer_count,
    new_vendor,
    novelty,
)
from leap.features.history import Snapshot
from leap.model.intervals import IntervalCalibrator
from leap.model.split import Model, model_from_files
from leap.model.verify import probe_jobs, proof_key, read_proof, write_proof

ARTIFACT_VERSION = 1
#: Manifest key: whether a trainer count new to its (family, type) pair is served the base
#: margin alone (:func:`leap.model.train.judge_new_trainer_count`). Absent (a model trained
#: before the judgement): no.
NEW_TRAINER_COUNT_ALONE = "new_trainer_count_base_alone"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "LATEST"
LOG = "published.jsonl"
INTERVALS = "intervals.json"
#: Jobs scored at write time, with the predictions: a loaded model must reproduce them.
PROBE = "probe.json"
#: What a model version may be called: a plain name, never a path.
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: Largest difference (log samples/s) between recorded and recomputed probe predictions.
PROBE_TOLERANCE = 1e-6
DEFAULT_VERIFY_TIMEOUT_S = 300.0


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Prediction(NamedTuple):
    """Per row: predicted log samples/s, its interval ``[lo, hi]`` (log) and novelty group
    (index into :data:`~leap.features.encode.NOVELTY_GROUPS`)."""

    log: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    group: np.ndarray


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
        self._absent: np.ndarray | None = None

    @property
    def fallback_log_tp(self) -> float:
        return float(self.manifest["fallback_log_throughput"])

    @property
    def new_trainer_count_alone(self) -> bool:
        return bool(self.manifest.get(NEW_TRAINER_COUNT_ALONE, False))

    def encode(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Model rows for ``jobs`` (each with a ``hardware`` column) via the one feature path."""
        return encode(jobs, self.snapshot, self.catalog, self.spec)

    def encode_full(self, jobs: Columns | pd.DataFrame, threads: int = 1) -> np.ndarray:
        """Every feature column (:data:`~leap.features.encode.FEATURE_NAMES`) of ``jobs``
        (a large batch on ``threads``, see :func:`~leap.features.encode.encode`)."""
        return encode(jobs, self.snapshot, self.catalog, self.full_spec, threads=threads)

    def _absent_types(self) -> np.ndarray:
        """Per code of the hardware vocabulary: whether nobody ran on the type in the
        snapshot's window (it has no family level there)."""
        if self._absent is None:
            ran = self.snapshot.transfer.hw_pos
            self._absent = np.array([h not in ran for h in self.spec.vocab.get("hardware", [])],
                                    dtype=bool)
        return self._absent

    def predict_rows(self, X: np.ndarray) -> np.ndarray:
        """Log samples/s of rows encoded with the model's own spec (:meth:`encode`): the
        trees' correction on the base margin.

        A type nobody ran on in the snapshot's window takes the history-adjusted estimate
        alone where there is one: the trees' correction is learned on the types they saw,
        and on types held out entirely (the default fleet's B200, public tables' newest
        types) it moved that estimate away from the truth more often than toward it (see the
        closing notes of issue 10). So does a trainer count the family never ran on a type
        it ran on (:func:`new_trainer_count`), unless the window showed the trees'
        correction, learned where the family's runs surround the job's scale, doing at least
        as well there (:data:`NEW_TRAINER_COUNT_ALONE`).
        """
        base = base_margin(X, self.spec, self.fallback_log_tp)
        pred = np.asarray(self.model.predict(X, base=base))
        names = list(self.spec.names)
        if len(X):
            alone = new_trainer_count(X, names) if self.new_trainer_count_alone \
                else np.zeros(len(X), dtype=bool)
            if "hardware" in names:
                alone |= self.on_new_type(X, names)
            pred = history_alone(pred, base, X, names, alone)
        return pred

    def on_new_type(self, X: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Whether each encoded row (columns ``names``, with ``hardware``) is on a type
        nobody ran on in the snapshot's window (or one outside the model's vocabulary)."""
        code = X[:, feature_positions(tuple(names))["hardware"]]
        unknown = np.isnan(code)
        return unknown | self._absent_types()[np.where(unknown, 0, code).astype(np.intp)]

    def predict_encoded(self, X_full: np.ndarray) -> Prediction:
        """Log samples/s, its interval and novelty group for rows from :meth:`encode_full`.

        A model trained on too few rows to calibrate intervals has NaN ``lo`` and ``hi``.
        """
        X = self.spec.from_full(X_full)
        group = novelty(X_full, FEATURE_NAMES)
        if len(X) == 0:
            return Prediction(np.empty(0), np.empty(0), np.empty(0), group)
        pred = self.predict_rows(X)
        if self.intervals is None:
            return Prediction(pred, np.full(len(pred), np.nan), np.full(len(pred), np.nan),
                              group)
        lo, hi = self.interval_offsets(X_full, FEATURE_NAMES, group)
        return Prediction(pred, pred + lo, pred + hi, group)

    def interval_offsets(self, X: np.ndarray, names: Sequence[str], group: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
        """Log offsets of the 80% interval of encoded rows (columns ``names``) in novelty
        ``group``: per vendor cell, and widened on a type nobody ran on in the window, for a
        model type nobody ran in it (no model-type history, ``mt_n``) and at a trainer count
        new to the row's (family, type) pair."""
        if self.intervals is None:
            raise ArtifactError("this model has no intervals (too few validation rows)")
        pos = feature_positions(tuple(names))
        new_type = self.on_new_type(X, names) if "hardware" in pos else None
        new_model_type = np.isnan(X[:, pos["mt_n"]]) if "mt_n" in pos else None
        return self.intervals.offsets(group, new_vendor(X, names), new_type, new_model_type,
                                      new_trainer_count(X, names))

    def predict_interval(self, jobs: Columns | pd.DataFrame, threads: int = 1) -> Prediction:
        """:meth:`predict_encoded` of ``jobs``: log samples/s, interval and novelty group."""
        return self.predict_encoded(self.encode_full(jobs, threads))

    def predict_log(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Predicted log samples/s for each job row on its ``hardware`` (the one path:
        :meth:`predict_encoded`, which the ranker uses too)."""
        return self.predict_interval(jobs)[0]

    def predict(self, jobs: Columns | pd.DataFrame) -> np.ndarray:
        """Predicted samples/s for each job row on its ``hardware``."""
        return np.exp(self.predict_log(jobs))


def history_alone(pred: np.ndarray, base: np.ndarray, X: np.ndarray, names: Sequence[str],
                  alone: np.ndarray) -> np.ndarray:
    """``pred`` (the trees' correction on the base margin ``base``), except on the rows
    ``alone`` marks (a type nobody ran on in the window; a trainer count new to its pair where
    judged so) that have a history-adjusted estimate (``hist_est``): there the base margin
    alone (see :meth:`Artifact.predict_rows`).

    >>> X = np.array([[1.0], [np.nan], [1.0]])
    >>> history_alone(np.zeros(3), np.ones(3), X, ["hist_est"],
    ...               np.array([True, True, False])).tolist()
    [1.0, 0.0, 0.0]
    """
    if "hist_est" not in names:
        return pred
    use = np.asarray(alone, dtype=bool) & np.isfinite(X[:, list(names).index("hist_est")])
    return np.where(use, base, pred)


def write_artifact(directory: Path, *, model: Model, snapshot: Snapshot, spec: FeatureSpec,
                   catalog: Catalog, info: dict[str, Any],
                   intervals: IntervalCalibrator | None = None) -> Path:
    """Write a complete artifact into ``directory`` (which must not exist) and return it.

    Besides the model it records :data:`PROBE`: fixed probe jobs and this model's predictions
    for them, which :func:`verify_artifact` later asks the loaded files to reproduce.
    """
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
    probe = probe_jobs(snapshot, spec, catalog)
    fallback = float(info.get("fallback_log_throughput", 0.0))
    live = Artifact(version="probe", path=None, manifest={
        "fallback_log_throughput": fallback,
        NEW_TRAINER_COUNT_ALONE: bool(info.get(NEW_TRAINER_COUNT_ALONE, False))},
                    model=model, snapshot=snapshot, spec=spec, catalog=catalog)
    (directory / PROBE).write_text(json.dumps(
        {"jobs": probe, "log_throughput": [float(x) for x in live.predict_log(jobs_frame(probe))]}))
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


def _read_text(path: Path) -> str:
    """A text file of an artifact; bytes that are not UTF-8 mean a corrupt artifact."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path} is not UTF-8 text (byte {exc.start}); the artifact is "
                            "corrupt (republish or roll back)") from None
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror}; the artifact is incomplete "
                            "(republish or roll back)") from None


def load_artifact(directory: Path, *, verify: bool = True) -> Artifact:
    """Load an artifact, checking versions and (by default) every file's checksum."""
    mpath = directory / MANIFEST
    if not mpath.is_file():
        raise ArtifactError(f"{directory} is not a leap model artifact (no {MANIFEST})")
    try:
        manifest = json.loads(_read_text(mpath))
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
    model_files = {p.name: _read_text(p) for p in (directory / "model").iterdir()
                   if p.is_file()}
    model = model_from_files(model_files)
    spec = FeatureSpec.from_json(_read_text(directory / "feature_spec.json"))
    try:
        catalog = Catalog.from_toml(_read_text(directory / "catalog.toml"),
                                    f"{directory}/catalog.toml")
    except CatalogError as exc:
        raise ArtifactError(str(exc)) from None
    snapshot = Snapshot.load(directory / "snapshot")
    intervals = IntervalCalibrator.from_json(_read_text(directory / INTERVALS)) \
        if (directory / INTERVALS).is_file() else None
    return Artifact(version=str(manifest.get("version", directory.name)), path=directory,
                    manifest=manifest, model=model, snapshot=snapshot, spec=spec,
                    catalog=catalog, intervals=intervals)


_VERIFIED: dict[tuple[str, str], dict[str, Any]] = {}
_VERIFIED_LOCK = threading.Lock()


def verify_artifact(directory: Path, *, timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S
                    ) -> dict[str, Any]:
    """Prove that ``directory`` loads and reproduces its probe, in a child process.

    A checksum proves the bytes are the ones written, not that they load: LightGBM can abort
    or segfault on a malformed model text. So a short-lived ``python -m leap.model.verify``
    loads the artifact and scores its :data:`PROBE` jobs; the artifact is trusted only when
    that child exits 0 and its predictions match the recorded ones. A crash, a hang (after
    ``timeout_s``) or a mismatch is an :class:`~leap.errors.ArtifactError`, never a crash of
    the caller. A pass is remembered for this process (keyed by the manifest's bytes) and
    written beside the manifest for later processes (:data:`~leap.model.verify.PROOF`: the
    child runs again whenever the files or the code that loads them change).

    Returns
    -------
    dict
        The child's report: ``ok``, ``rows`` scored and ``max_abs_diff``.

    Raises
    ------
    ArtifactError
        The artifact is not proven loadable and sane; the message says why.

    Examples
    --------
    Not run here (it needs a workspace)::

        verify_artifact(registry.path("20260201-01"))["ok"]
    """
    directory = Path(directory)
    mpath = directory / MANIFEST
    try:
        manifest = mpath.read_bytes()
    except OSError:
        raise ArtifactError(f"{directory} is not a leap model artifact (no {MANIFEST})") from None
    key = (str(directory.resolve()), hashlib.sha256(manifest).hexdigest())
    with _VERIFIED_LOCK:
        if key in _VERIFIED:
            return _VERIFIED[key]
    proof = proof_key(directory, manifest)
    earlier = read_proof(directory, proof)
    if earlier is not None:
        with _VERIFIED_LOCK:
            _VERIFIED[key] = earlier
        return earlier
    src = str(Path(__file__).resolve().parents[2])  # so the child imports this same leap
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH", "")) if p)}
    try:
        proc = subprocess.run([sys.executable, "-m", "leap.model.verify", str(directory)],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              check=False, errors="replace")
    except subprocess.TimeoutExpired:
        raise ArtifactError(f"{directory}: loading and scoring the model took more than "
                            f"{timeout_s:g} s in a check process; the artifact is refused "
                            "(republish or roll back)") from None
    except OSError as exc:
        raise ArtifactError(f"{directory}: cannot start the model check process "
                            f"({exc.strerror})") from None
    report: dict[str, Any] = {}
    lines = proc.stdout.strip().splitlines()
    if lines:
        try:
            report = json.loads(lines[-1])
        except ValueError:
            report = {}
    if proc.returncode != 0 or not report.get("ok"):
        if proc.returncode < 0:
            why = (f"the model crashed the check process (signal {-proc.returncode}); a model "
                   "file is malformed although its checksum matches")
        else:
            why = str(report.get("reason") or (proc.stderr.strip().splitlines() or
                                               [f"exit status {proc.returncode}"])[-1])
        raise ArtifactError(f"{directory}: model failed verification: {why} (republish or "
                            "roll back to a good version)")
    write_proof(directory, proof, report)
    with _VERIFIED_LOCK:
        _VERIFIED[key] = report
    return report


def check_version_name(version: object) -> str:
    """``version`` if it is a plain version name; a path or anything else is refused.

    Raises
    ------
    ArtifactError
        Naming the value and the allowed form.

    Examples
    --------
    >>> check_version_name("20260201-01")
    '20260201-01'
    """
    if not isinstance(version, str) or not VERSION_PATTERN.fullmatch(version) \
            or set(version) == {"."}:
        raise ArtifactError(f"model version {str(version)[:200]!r} is not a version name: use "
                            "a name listed by `leap models list` (letters, digits, '.', '_' "
                            "and '-'; no paths)")
    return version


class Registry:
    """Published model versions under ``models_dir`` and the ``LATEST`` pointer.

    Examples
    --------
    Not run here (it needs a workspace)::

        reg = Registry(workspace.models_dir)
        reg.publish(tmp_dir, "20260201-01"); reg.latest_version()
    """

    def __init__(self, models_dir: Path, *,
                 verify_timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S) -> None:
        self.root = Path(models_dir)
        self.verify_timeout_s = verify_timeout_s

    def versions(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.is_symlink() and VERSION_PATTERN.fullmatch(p.name)
                      and (p / MANIFEST).is_file())

    def latest_version(self) -> str | None:
        p = self.root / LATEST
        if not p.is_file():
            return None
        try:
            v = p.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return v or None

    def path(self, version: str) -> Path:
        """The directory of ``version``: a plain name of a directory directly in the root."""
        check_version_name(version)
        p = self.root / version
        if p.is_symlink() or not (p / MANIFEST).is_file():
            known = ", ".join(self.versions()) or "none"
            raise ArtifactError(f"no model version '{version}' in {self.root} (known: "
                                f"{known}{did_you_mean(version, self.versions())})")
        return p

    def verify(self, version: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """:func:`verify_artifact` for a published ``version`` (raises ArtifactError)."""
        return verify_artifact(self.path(version), timeout_s=timeout_s or self.verify_timeout_s)

    def load(self, version: str | None = None, *, verify: bool = True,
             probe: bool = True) -> Artifact:
        """Load ``version`` (default: the latest published).

        With ``probe`` (default) it is first proven loadable and sane in a child process
        (:func:`verify_artifact`), so a malformed model cannot crash this one.
        """
        if version is None:
            version = self.latest_version()
            if version is None:
                raise ArtifactError(f"no published model in {self.root}; run `leap train` first")
        path = self.path(version)
        if probe:
            verify_artifact(path, timeout_s=self.verify_timeout_s)
        return load_artifact(path, verify=verify)

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
        """Move a fully written artifact into place, then point ``LATEST`` at it atomically.

        The staged artifact is first proven loadable and sane (:func:`verify_artifact`); one
        that is not is refused and nothing moves.
        """
        check_version_name(version)
        final = self.root / version
        if final.exists():
            raise ArtifactError(f"model version {version} already exists in {self.root}")
        verify_artifact(staged, timeout_s=self.verify_timeout_s)
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
        self.verify(to)  # before LATEST moves: a version that does not load is refused
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
