"""Compiled scoring: the model's LightGBM boosters as native code (lleaves), cached beside
the artifact and checked against LightGBM before use.

Scoring one job over 20 types with LightGBM costs about a millisecond of call overhead (the
router and ~5 specialist calls), and as much again for the pair model's boosters while its
rows are encoded (:mod:`leap.features.pairs`); the trees themselves are microseconds.
lleaves compiles each booster with LLVM into a function that scores a block of rows without
that overhead. It was chosen over treelite/tl2cgen on the reference model
(bench/bench_compile.py): per-call time of a 20-row block about 3-5x lower, predictions
within 1e-14 of LightGBM (tl2cgen: equal), at the price of a slower compile (minutes for
~1,300 trees on 2 cores, once per version).

Compilation is optional (``pip install 'leap[fast]'``); without lleaves, or when the compiled
code does not reproduce LightGBM on the fixed probe rows (:func:`leap.model.verify.probe_jobs`)
within :data:`TOLERANCE`, the model keeps scoring with LightGBM and the reason is recorded in
``artifact.extra["scoring"]``. The compiled objects are native code written by this process
(no pickle) under ``<artifact>/compiled/``, keyed by a hash of each booster's text, the
compiler versions and the CPU; a key that does not match is compiled again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from leap.model.cascade import PARALLEL_ROWS, Scorer, best_iteration
from leap.model.split import boosters, set_scorers

if TYPE_CHECKING:
    from leap.model.artifact import Artifact

log = logging.getLogger("leap.model")

#: Folder of compiled objects inside an artifact directory (not part of its checksums).
COMPILED_DIR = "compiled"
#: Largest difference allowed between compiled and LightGBM predictions on the probe rows.
TOLERANCE = 1e-9
_INDEX = "index.json"
#: Name prefix of the snapshot's pair-model boosters (:meth:`PairModel.named_boosters`).
PAIRS = "pairs"
#: LLVM inlining: ~3x faster scoring for ~8x longer compiles (tests turn it off).
INLINE = True
_LOCK = threading.Lock()


def unavailable() -> str | None:
    """Why compiled scoring cannot run here (``None`` when it can)."""
    try:
        import lleaves  # noqa: F401
        import llvmlite.binding as llvm
    except ImportError as exc:
        return f"lleaves is not installed ({exc.name}); pip install 'leap[fast]'"
    if not hasattr(llvm, "PassManagerBuilder"):  # lleaves 1.x needs llvmlite < 0.45
        return "lleaves needs llvmlite < 0.45 (pip install 'leap[fast]' pins it)"
    return None


class CompiledBooster:
    """One booster compiled to native code: ``scorer(X)`` equals ``booster.predict(X)``."""

    def __init__(self, model: Any, n_outputs: int) -> None:
        self._model = model  # keeps the compiled code (LLVM execution engine) alive
        self._entry = model._c_entry_func
        self.n_features = int(model.num_feature())
        self.n_outputs = n_outputs

    def __call__(self, X: np.ndarray) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        n = len(X)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"expected rows of {self.n_features} features, got {X.shape}")
        out = np.empty(n * self.n_outputs, dtype=np.float64)
        if n == 0:
            return out
        px = X.ctypes.data_as(_c_double_p())
        po = out.ctypes.data_as(_c_double_p())
        if n < PARALLEL_ROWS:
            self._entry(px, po, 0, n)
            return out
        # The compiled function releases the GIL: blocks of rows run on every core.
        workers = os.cpu_count() or 1
        step = -(-n // workers)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda i: self._entry(px, po, i, min(i + step, n)),
                          range(0, n, step)))
        return out


def _c_double_p() -> Any:
    import ctypes

    return ctypes.POINTER(ctypes.c_double)


def _key(text: str) -> str:
    from importlib.metadata import version

    import llvmlite.binding as llvm

    h = hashlib.sha256(text.encode())
    h.update(f"|lleaves {version('lleaves')}|llvmlite {version('llvmlite')}|"
             f"inline {INLINE}|{llvm.get_host_cpu_name()}|"
             f"{llvm.get_host_cpu_features().flatten()}".encode())
    return h.hexdigest()


def _compile_one(name: str, text: str, n_outputs: int, folder: Path | None,
                 index: dict[str, str], build: bool) -> CompiledBooster | None:
    """Load ``name`` from ``folder`` when its key matches, else compile it (when ``build``)."""
    import lleaves

    key = _key(text)
    obj = folder / f"{name}.o" if folder is not None else None
    cached = obj is not None and index.get(name) == key and obj.is_file()
    if not cached and not build:
        return None
    with tempfile.TemporaryDirectory(prefix="leap-compile-") as tmp:
        model_file = Path(tmp) / f"{name}.txt"
        model_file.write_text(text)
        model = lleaves.Model(model_file=str(model_file))
        if cached:
            model.compile(cache=str(obj))
        else:
            # Compile into the scratch folder, then move the object into place whole.
            scratch = Path(tmp) / f"{name}.o"
            model.compile(cache=str(scratch), finline=INLINE)
            if folder is not None and obj is not None:
                try:
                    folder.mkdir(exist_ok=True)
                    part = folder / f".{name}.o.{os.getpid()}.tmp"
                    part.write_bytes(scratch.read_bytes())
                    os.replace(part, obj)
                    index[name] = key
                except OSError as exc:  # a read-only artifact: compiled for this process only
                    log.info("cannot cache compiled %s in %s: %s", name, folder, exc)
    return CompiledBooster(model, n_outputs)


def compile_artifact(artifact: Artifact, *, build: bool = True) -> str:
    """Score ``artifact`` with compiled boosters when they reproduce LightGBM; say how it scores.

    Loads each booster's compiled object from ``<artifact>/compiled/`` (when its key matches)
    or, with ``build``, compiles it (slow: minutes for a large model) and caches it there.
    Then every compiled booster and the whole model are checked against LightGBM on the
    probe rows; any difference over :data:`TOLERANCE`, any failure, or a booster missing
    from the cache without ``build`` leaves the model on LightGBM.

    Returns
    -------
    str
        ``"compiled"``, or ``"lightgbm: <why>"``; also stored in ``artifact.extra["scoring"]``.

    Examples
    --------
    >>> from leap.model.compiled import unavailable
    >>> unavailable() is None or "leap[fast]" in unavailable()
    True
    """
    why = unavailable()
    if why is None:
        try:
            why = _attach(artifact, build)
        except Exception as exc:  # a compiler or cache failure must leave LightGBM scoring
            log.warning("compiled scoring unavailable for %s: %s", artifact.version, exc)
            why = f"compiling failed ({type(exc).__name__}: {str(exc)[:200]})"
    status = "compiled" if why is None else f"lightgbm: {why}"
    artifact.extra["scoring"] = status
    return status


def _attach(artifact: Artifact, build: bool) -> str | None:
    from leap.features.encode import base_margin, jobs_frame
    from leap.model.verify import probe_jobs

    folder = artifact.path / COMPILED_DIR if artifact.path is not None else None
    # One compile at a time: in this process (two reloads) and across the processes of
    # `leap serve --workers N` (a file lock), so the others load what the first compiled.
    with _LOCK, _folder_lock(folder if build else None):
        index: dict[str, str] = {}
        if folder is not None and (folder / _INDEX).is_file():
            try:
                index = dict(json.loads((folder / _INDEX).read_text()))
            except (OSError, ValueError):
                index = {}
        named = boosters(artifact.model)
        pairs = artifact.snapshot.pairs
        pair_named = pairs.named_boosters() if pairs is not None else {}
        every = {**named, **{f"{PAIRS}.{k}": b for k, b in pair_named.items()}}
        scorers: dict[str, Scorer] = {}
        for name, booster in every.items():
            text = booster.model_to_string(num_iteration=best_iteration(booster))
            compiled = _compile_one(name, text, booster.num_model_per_iteration(), folder,
                                    index, build)
            if compiled is None:
                return "no compiled model cached beside the artifact (compile it first)"
            scorers[name] = compiled
        if build and folder is not None and folder.is_dir():
            try:
                part = folder / f".{_INDEX}.{os.getpid()}.tmp"
                part.write_text(json.dumps(index, indent=1))
                os.replace(part, folder / _INDEX)
            except OSError:
                pass  # read-only: nothing was cached either
    probe = jobs_frame(probe_jobs(artifact.snapshot, artifact.spec, artifact.catalog))
    X = artifact.encode(probe)  # with LightGBM: the scorers are not attached yet
    # Each booster on rows of its own features: the model's on the probe's encoding, the
    # pair model's on the pair rows that encoding scored.
    rows = {name: X for name in named} | _pair_probe_rows(artifact, probe)
    for name, booster in every.items():
        want = np.asarray(booster.predict(rows[name], num_iteration=best_iteration(booster),
                                          num_threads=1), dtype=np.float64).ravel()
        got = scorers[name](rows[name])
        diff = float(np.max(np.abs(got - want))) if len(want) else 0.0
        if not diff <= TOLERANCE:
            return (f"compiled booster {name} differs from LightGBM by {diff:.3g} on the "
                    f"probe rows (allowed {TOLERANCE:g})")
    base = base_margin(X, artifact.spec, artifact.fallback_log_tp)
    before = artifact.model.predict(X, base=base)
    if pairs is not None:
        pairs.scorers_ = {k: scorers[f"{PAIRS}.{k}"] for k in pair_named}
    set_scorers(artifact.model, {k: scorers[k] for k in named})
    X_after = artifact.encode(probe)
    after = artifact.model.predict(X_after, base=base_margin(X_after, artifact.spec,
                                                             artifact.fallback_log_tp))
    diff = float(np.max(np.abs(after - before))) if len(before) else 0.0
    if not diff <= TOLERANCE:
        use_lightgbm(artifact)
        return f"compiled model differs from LightGBM by {diff:.3g} on the probe rows"
    return None


@contextlib.contextmanager
def _folder_lock(folder: Path | None) -> Iterator[None]:
    """An exclusive lock on ``folder`` (created) for the block; none when it is unwritable."""
    handle = None
    if folder is not None:
        try:
            folder.mkdir(exist_ok=True)
            handle = (folder / ".lock").open("a")
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()  # releases the lock


def _pair_probe_rows(artifact: Artifact, probe: Any) -> dict[str, np.ndarray]:
    """Rows to check each pair-model booster on (by name, ``pairs.<booster>``): every row
    either half of its kind (pair or shape) scores while the probe jobs are encoded."""
    pairs = artifact.snapshot.pairs
    if pairs is None:
        return {}
    named = pairs.named_boosters()
    seen: dict[str, list[np.ndarray]] = {}

    def catch(name: str, booster: Any) -> Scorer:
        def score(X: np.ndarray) -> np.ndarray:
            seen.setdefault(name.split("_")[0], []).append(X)
            return np.asarray(booster.predict(X, num_threads=1), dtype=np.float64)
        return score

    old = pairs.scorers_
    pairs.scorers_ = {k: catch(k, b) for k, b in named.items()}
    try:
        artifact.encode(probe)
    finally:
        pairs.scorers_ = old
    return {f"{PAIRS}.{k}": np.vstack(seen.get(k.split("_")[0], [np.empty((0, b.num_feature()))]))
            for k, b in named.items()}


def use_lightgbm(artifact: Artifact) -> None:
    """Score ``artifact`` with LightGBM again (drop compiled scorers)."""
    set_scorers(artifact.model, {})
    if artifact.snapshot.pairs is not None:
        artifact.snapshot.pairs.scorers_ = {}
    artifact.extra["scoring"] = "lightgbm"
