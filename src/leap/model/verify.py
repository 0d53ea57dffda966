"""The child side of :func:`leap.model.artifact.verify_artifact`: load one artifact, score its
probe jobs, compare with the predictions recorded at training time, print one JSON line.

Run as ``python -m leap.model.verify DIR``. It runs in a short-lived process of its own so that
a native crash of the model parser (LightGBM can abort or segfault on a malformed model text
whose checksum matches) ends this process, never the server or command that asked.
Exit status 0 means the artifact loaded and reproduced its probe; anything else is a refusal.

A pass is written beside the manifest as :data:`PROOF`, keyed by :func:`proof_key`: the
manifest's bytes (which hold every file's checksum), the artifact's file names, and the code
that loaded them (this leap's source, the libraries, Python, the machine). A later process
that finds a matching proof skips the child: the same bytes were already loaded and scored by
the same code. Any change to either, or a file added to the artifact, gives another key, and
the child runs again. The proof vouches for the files the manifest lists, so it holds only
where loading checks those checksums (:func:`~leap.model.artifact.load_artifact`'s default).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leap.catalog import Catalog
    from leap.features.encode import FeatureSpec
    from leap.features.history import Snapshot


#: The record of a passed check, written beside the manifest (see the module docstring).
PROOF = "verified.json"
#: Files beside the model that are not part of what the check loaded: the proof itself and
#: the compiled-trees cache (:mod:`leap.model.compiled`, checked against LightGBM on load).
_NOT_LOADED = (PROOF, "compiled")


@functools.cache
def _runtime() -> str:
    """This leap's source and the versions of what loads a model, as one digest."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    for dist in ("lightgbm", "numpy", "pandas", "pyarrow"):
        try:
            h.update(f"{dist} {version(dist)}\0".encode())
        except PackageNotFoundError:
            h.update(f"{dist} -\0".encode())
    h.update(f"{sys.version}|{platform.machine()}".encode())
    return h.hexdigest()


def proof_key(directory: Path, manifest: bytes) -> str:
    """What a check of ``directory`` proves: its manifest's bytes, the names of its files and
    the code that loaded them (:func:`_runtime`)."""
    h = hashlib.sha256(manifest)
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and rel.parts[0] not in _NOT_LOADED:
            h.update(rel.as_posix().encode() + b"\0")
    h.update(_runtime().encode())
    return h.hexdigest()


def read_proof(directory: Path, key: str) -> dict[str, Any] | None:
    """The report of an earlier check with this ``key``, or None (none, another key, or
    unreadable: the check then runs again)."""
    try:
        doc = json.loads((directory / PROOF).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(
            doc.get("report"), dict) or doc["report"].get("ok") is not True:
        return None
    return dict(doc["report"])


def write_proof(directory: Path, key: str, report: dict[str, Any]) -> bool:
    """Record a passed check (atomically; False where the folder is not writable, which only
    means the next process checks again)."""
    tmp = directory / f".{PROOF}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"key": key, "report": report}) + "\n")
        os.replace(tmp, directory / PROOF)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def probe_jobs(snapshot: Snapshot, spec: FeatureSpec, catalog: Catalog) -> list[dict[str, Any]]:
    """A small fixed set of (job, hardware) rows that exercises the model: known and unseen
    families, a few model types and job shapes, and known families in a shape next to ones
    they ran on a type (:func:`_near_shapes`), on every type of the catalog (up to 64)."""
    fam = snapshot.tables.get("fam_hw")
    families = sorted({str(f) for f in fam["family_id"].dropna().unique()}) \
        if fam is not None and "family_id" in fam.columns else []
    picked = [*families[::max(1, len(families) // 3)][:3], "__leap_probe_unseen__"]
    types = list(spec.vocab.get("model_type", []))[:2] or ["__leap_probe_type__"]
    shapes: list[dict[str, Any]] = [
        {"trainer_count": 1, "batch_size": 32},
        {"trainer_count": 4, "batch_size": 1024, "devices_per_trainer": 1, "precision": "bf16",
         "num_params": 3.0e8, "flops_per_sample": 1.8e9},
    ]
    jobs = [{"family_id": f, "model_type": types[i % len(types)], **shape}
            for i, f in enumerate(picked) for shape in shapes]
    jobs += [{**job, "model_type": types[0]} for job in _near_shapes(snapshot)]
    hardware = list(catalog)[:64]
    return [{**job, "hardware": hw} for job in jobs for hw in hardware]


def _near_shapes(snapshot: Snapshot, count: int = 3) -> list[dict[str, Any]]:
    """Up to ``count`` known families, each in a shape one sample of batch from one it ran on
    a type where it ran two shapes or more: rows whose level on that type is read from its
    nearest shapes there (the shape boosters' carry, blended with the flat carry by the pair
    model's share). An older leap that reads the carry otherwise predicts these rows
    otherwise, so the artifact fails its probe there instead of serving other figures."""
    table = snapshot.tables.get("fam_hw_shape")
    if table is None or len(table) == 0:
        return []
    # Group sizes first: the shapes of only the few cells picked are listed (listing every
    # cell's took 0.6 s of the default fleet's publish, 1.5 s of the harder fleet's).
    sizes = table.groupby(["family_id", "hardware"], sort=True).size()
    cells = sizes.index[sizes.to_numpy() >= 2]
    jobs = []
    for family, hardware in list(cells)[::max(1, len(cells) // count)][:count]:
        ran = sorted(map(str, table["shape"][(table["family_id"] == family)
                                             & (table["hardware"] == hardware)]))
        trainers, per_trainer, batch = (int(x) for x in ran[0].split("/"))
        if min(trainers, per_trainer, batch) < 1 or f"{trainers}/{per_trainer}/{batch + 1}" \
                in ran:
            continue
        jobs.append({"family_id": str(family), "trainer_count": trainers,
                     "devices_per_trainer": per_trainer, "batch_size": batch + 1})
    return jobs


def check(directory: Path) -> dict[str, Any]:
    """Load ``directory`` and score its probe; the result says ``ok`` and why not."""
    import numpy as np

    from leap.errors import LeapError
    from leap.features.encode import jobs_frame
    from leap.model.artifact import PROBE, PROBE_TOLERANCE, _read_text, load_artifact

    try:
        art = load_artifact(directory)
        path = directory / PROBE
        recorded: list[float] | None = None
        if path.is_file():
            doc = json.loads(_read_text(path))
            jobs, recorded = doc["jobs"], doc["log_throughput"]
        else:  # an artifact written before probes were recorded: it must at least score
            jobs = probe_jobs(art.snapshot, art.spec, art.catalog)
        got = np.asarray(art.predict_log(jobs_frame(jobs)), dtype=np.float64)
    except LeapError as exc:
        return {"ok": False, "reason": str(exc)}
    except (ValueError, KeyError, TypeError) as exc:
        return {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
    if not np.all(np.isfinite(got)):
        return {"ok": False, "reason": f"{int((~np.isfinite(got)).sum())} of {len(got)} probe "
                "predictions are not finite"}
    if recorded is None:
        return {"ok": True, "rows": len(got), "max_abs_diff": None}
    want = np.asarray(recorded, dtype=np.float64)
    if want.shape != got.shape:
        return {"ok": False, "reason": f"the probe records {len(want)} predictions but "
                f"{len(got)} rows were scored"}
    diff = float(np.max(np.abs(want - got))) if len(got) else 0.0
    if not diff <= PROBE_TOLERANCE:
        return {"ok": False, "reason": f"probe predictions differ from those recorded at "
                f"training time by up to {diff:.3g} log samples/s (tolerance "
                f"{PROBE_TOLERANCE:g})", "max_abs_diff": diff}
    return {"ok": True, "rows": len(got), "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m leap.model.verify ARTIFACT_DIR\n")
        return 2
    result = check(Path(args[0]))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    from leap.model.imports import without_sklearn

    without_sklearn()  # the check needs LightGBM's Booster only
    sys.exit(main())
