"""The child side of :func:`leap.model.artifact.verify_artifact`: load one artifact, score its
probe jobs, compare with the predictions recorded at training time, print one JSON line.

Run as ``python -m leap.model.verify DIR``. It runs in a short-lived process of its own so that
a native crash of the model parser (LightGBM can abort or segfault on a malformed model text
whose checksum matches) ends this process, never the server or command that asked.
Exit status 0 means the artifact loaded and reproduced its probe; anything else is a refusal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leap.catalog import Catalog
    from leap.features.encode import FeatureSpec
    from leap.features.history import Snapshot


def probe_jobs(snapshot: Snapshot, spec: FeatureSpec, catalog: Catalog) -> list[dict[str, Any]]:
    """A small fixed set of (job, hardware) rows that exercises the model: known and unseen
    families, a few model types and job shapes, on every type of the catalog (up to 64)."""
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
    hardware = list(catalog)[:64]
    return [{**job, "hardware": hw} for job in jobs for hw in hardware]


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
    sys.exit(main())
