"""The serving model: a loaded artifact with its ranking caches, and its hot reload.

:class:`Serving` is one loaded version (swapped as one reference); :class:`ModelWatcher`
follows a :class:`~leap.model.artifact.Registry`'s ``LATEST`` and swaps in new versions.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from leap.errors import ArtifactError, LeapError
from leap.features.columns import Columns
from leap.features.encode import FEATURE_NAMES
from leap.features.pair_rows import native_kernels
from leap.features.physics import hardware_specs, peak_flops
from leap.features.transfer import transfer_kernels
from leap.model.artifact import LATEST, Artifact, Registry

log = logging.getLogger("leap.rank")


@dataclass
class Serving:
    """A loaded artifact plus what ranking caches about it (swapped as one reference).

    Rows are encoded by the one feature path, :func:`leap.features.encode.encode`, with every
    feature column (:meth:`Artifact.encode_full`): the ranker reads ``mem_fit`` and the
    history counts for its flags, and the artifact scores them
    (:meth:`Artifact.predict_encoded`).
    """

    artifact: Artifact
    loaded_at: datetime
    pos: dict[str, int]
    specs: dict[str, np.ndarray]
    family_min_memory_gb: dict[str, float]
    _peaks: dict[str | None, np.ndarray] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return self.artifact.version

    @classmethod
    def prepare(cls, artifact: Artifact, *, compiled: bool | None = None,
                wait: bool = False) -> Serving:
        """Build the per-model caches (hardware specs, feature column positions).

        ``compiled`` chooses how the artifact's boosters are scored
        (:mod:`leap.model.compiled`): ``None`` uses compiled code already cached beside the
        artifact (checked against LightGBM; cheap), ``True`` also compiles it when missing,
        in a background thread unless ``wait`` (LightGBM scores meanwhile, with the same
        predictions), ``False`` always scores with LightGBM.
        """
        if compiled is not False:
            _use_compiled(artifact, build=bool(compiled), wait=wait)
        names = list(artifact.catalog)
        unknown = [n for n in artifact.spec.names if n not in FEATURE_NAMES]
        if unknown:
            raise ArtifactError(f"model {artifact.version} uses features this leap cannot "
                                f"compute: {unknown}; retrain it")
        # The smallest device memory each family has succeeded on: a type with at least that
        # much memory fits the family, whatever the (conservative) physics estimate says.
        artifact.snapshot.warm(artifact.catalog)
        # The compiled kernels are checked once per process: here, not on the first request.
        native_kernels()
        transfer_kernels()
        fam_hw = artifact.snapshot.tables["fam_hw"]
        memory = {n: h.memory_gb for n, h in artifact.catalog.items()}
        per_row = fam_hw["hardware"].astype(str).map(memory)
        family_min = per_row.groupby(fam_hw["family_id"].astype(str)).min().dropna()
        return cls(artifact=artifact, loaded_at=datetime.now(UTC),
                   family_min_memory_gb={str(k): float(v) for k, v in family_min.items()},
                   pos={n: i for i, n in enumerate(names)},
                   specs=hardware_specs(artifact.catalog, np.array(names, dtype=object)))

    def peak_flops(self, precision: str | None, hardware: Sequence[str]) -> np.ndarray:
        """Peak dense FLOP/s per device for ``precision`` on each of ``hardware``."""
        if precision not in self._peaks:
            n = len(self.pos)
            self._peaks[precision] = peak_flops(np.full(n, precision, dtype=object), self.specs)
        return self._peaks[precision][[self.pos[h] for h in hardware]]

    def encode(self, job: Mapping[str, Any], hardware: Sequence[str]) -> np.ndarray:
        """Every feature column of ``job`` (normalized) on each of ``hardware``."""
        return self.artifact.encode_full(Columns.from_request(job, hardware))

    def encode_many(self, requests: Sequence[tuple[Mapping[str, Any], Sequence[str]]]
                    ) -> np.ndarray:
        """:meth:`encode` of each ``(job, hardware)``, one after another, in one pass."""
        return self.artifact.encode_full(
            Columns.concat([Columns.from_request(job, hw) for job, hw in requests]))


class ModelWatcher:
    """The serving model of a :class:`Registry`, swapped when ``LATEST`` changes.

    :meth:`current` is cheap: at most every ``check_interval_s`` it stats the ``LATEST``
    file; when that changed it loads the new version fully (in a background thread unless
    ``background=False``) and then swaps one reference, so requests in flight finish on the
    model they started with. A new version is first proven loadable and sane in a child
    process (:meth:`Registry.load` with its probe), so a malformed model cannot crash the
    server. A version that fails is refused: logged, counted (``reload_failures``), named in
    ``refused_version`` / ``refused_reason``, and the previous model keeps serving. With
    ``pin`` the watcher serves that one version and never follows ``LATEST``.

    Examples
    --------
    Not run here (it needs a workspace)::

        watcher = ModelWatcher(Registry(ws.models_dir)); serving = watcher.current()
    """

    def __init__(self, registry: Registry, *, check_interval_s: float = 1.0,
                 background: bool = True,
                 prepare: Callable[[Artifact], Serving] = Serving.prepare,
                 pin: str | None = None) -> None:
        self.registry = registry
        self.pin = pin
        self.check_interval_s = check_interval_s
        self.background = background
        self._prepare = prepare
        self._serving: Serving | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._last_check = -math.inf
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._loader: threading.Thread | None = None
        self.error: str | None = None
        self.reloads = 0
        self.reload_failures = 0
        self.refused_version: str | None = None
        self.refused_reason: str | None = None

    def _latest_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.registry.root / LATEST)
        except OSError:
            return None
        # os.replace gives a new inode; mtime and size catch an in-place rewrite.
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def current(self) -> Serving | None:
        """The model to serve now (checks for a new one at most every interval)."""
        if self.pin is not None and self._stamp is not None:
            return self._serving  # a pinned version is loaded (or refused) once
        now = time.monotonic()
        if now - self._last_check >= self.check_interval_s:
            self._last_check = now
            stamp = self._latest_stamp()
            if stamp != self._stamp:
                if self.background:
                    self._start_loader()
                else:
                    self._load(stamp)
        return self._serving

    def refresh(self) -> bool:
        """Check and load now, in this thread; True when a new model was swapped in."""
        self._last_check = time.monotonic()
        return self._load(self._latest_stamp())

    def _start_loader(self) -> None:
        with self._lock:
            if self._loader is not None and self._loader.is_alive():
                return
            self._loader = threading.Thread(target=lambda: self._load(self._latest_stamp()),
                                            name="leap-model-reload", daemon=True)
            self._loader.start()

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait for a background load to finish (tests and benchmarks)."""
        loader = self._loader
        if loader is not None:
            loader.join(timeout_s)

    def _load(self, stamp: tuple[int, int, int] | None) -> bool:
        with self._load_lock:
            return self._load_locked(stamp)

    def _load_locked(self, stamp: tuple[int, int, int] | None) -> bool:
        if self.pin is not None:
            version: str | None = self.pin
            stamp = stamp or (0, 0, 0)
        else:
            version = self.registry.latest_version() if stamp is not None else None
        if version is None:
            self._stamp = stamp
            if self._serving is None:
                self.error = (f"no published model in {self.registry.root}; run `leap train` "
                              "first")
            return False
        if self._serving is not None and self._serving.version == version:
            self._stamp = stamp
            return False
        try:
            # Registry.load proves the version in a child process first (load + probe), so
            # a model that would crash LightGBM is refused here instead of killing us.
            serving = self._prepare(self.registry.load(version))
        except Exception as exc:  # a corrupt artifact can raise anything
            # (LightGBM, Arrow, JSON ...); serving must go on with the old model or fail open.
            self.reload_failures += 1
            self.refused_version = version
            self.refused_reason = _describe(exc)
            self.error = f"model version {version} failed to load: {self.refused_reason}"
            log.error("%s", self.error, exc_info=not isinstance(exc, LeapError))
            self._stamp = stamp  # retried only when LATEST changes again
            return False
        self._serving = serving
        self._stamp = stamp
        self.error = None
        self.refused_version = self.refused_reason = None
        self.reloads += 1
        log.info("serving model %s", version)
        return True

class _Static:
    """A fixed artifact in place of a watcher (no reload)."""

    def __init__(self, artifact: Artifact, prepare: Callable[[Artifact], Serving]) -> None:
        self._serving = prepare(artifact)
        self.error: str | None = None
        self.reloads = 1
        self.reload_failures = 0
        self.refused_version: str | None = None
        self.refused_reason: str | None = None

    def current(self) -> Serving | None:
        return self._serving

    def refresh(self) -> bool:
        return False

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        return None



def _describe(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text if isinstance(exc, LeapError) else f"{type(exc).__name__}: {text}"


def _use_compiled(artifact: Artifact, *, build: bool, wait: bool) -> None:
    from leap.model.compiled import COMPILED_DIR, compile_artifact

    cached = artifact.path is not None and (artifact.path / COMPILED_DIR).is_dir()
    if not build:
        if cached:  # otherwise not even lleaves is imported
            compile_artifact(artifact, build=False)
        return
    if wait:
        compile_artifact(artifact, build=True)
        return
    if cached and compile_artifact(artifact, build=False) == "compiled":
        return
    threading.Thread(target=compile_artifact, args=(artifact,), kwargs={"build": True},
                     name=f"leap-compile-{artifact.version}", daemon=True).start()
