"""The novel model's shrink on types a family never ran on: its chosen share against none.

Usage::

    python bench/bench_shrink.py [--home /tmp/leap-bench] [--days 2026-01-24,2026-01-25]

For each held-out day: train on the window before it (nothing is published; the share of the
novel model's correction is chosen on the window's validation day, see
:class:`leap.model.split.NoveltySplitModel`), then score the day's succeeded attempts, as
they came, twice with the same model: at the chosen share and at share 1 (the model as
fitted). Prints the attempts within ±20% per novelty group and night, pooled over the
nights, and writes ``bench/results/bench_shrink.json``. The store must hold the days (e.g.
``leap --home DIR simulate --days 31 --seed 1``). Run it alone: one night takes a few
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from leap.catalog import Catalog
from leap.data.store import Store
from leap.features.encode import NOVELTY_GROUPS, novelty
from leap.metrics import within
from leap.model.train import train_window
from leap.model.window import TrainConfig, window_attempts

OUT = Path(__file__).parent / "results" / "bench_shrink.json"
DAYS = "2026-01-24,2026-01-25,2026-01-26,2026-01-27,2026-01-28"


def night(home: Path, day: str) -> dict[str, object]:
    """One night: the chosen share and, per group, (attempts, hits at it, hits at 1)."""
    as_of = datetime.fromisoformat(day).replace(tzinfo=UTC)
    cfg = TrainConfig()
    with Store(home / "leap.duckdb", read_only=True) as store:
        attempts = window_attempts(store, as_of, cfg)
    wm = train_window(attempts, Catalog.default(), as_of, cfg)
    art = wm.artifact
    X = art.encode(wm.eval_jobs)
    group = novelty(X, list(art.spec.names))
    actual = wm.eval_jobs["throughput"].to_numpy(dtype=np.float64)
    chosen = getattr(art.model, "shrink_", 1.0)
    hit_chosen = within(np.exp(art.predict_rows(X)), actual)
    if hasattr(art.model, "shrink_"):
        art.model.shrink_ = 1.0
    hit_one = within(np.exp(art.predict_rows(X)), actual)
    groups = {name: [int((group == i).sum()), int(hit_chosen[group == i].sum()),
                     int(hit_one[group == i].sum())] for i, name in enumerate(NOVELTY_GROUPS)}
    return {"day": day, "share": chosen, "groups": groups}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=Path("/tmp/leap-bench"))
    ap.add_argument("--days", default=DAYS, help="Held-out days, comma-separated.")
    args = ap.parse_args()
    nights = []
    for day in args.days.split(","):
        rec = night(args.home, day)
        nights.append(rec)
        print(json.dumps(rec), flush=True)
    pooled = {g: [sum(n["groups"][g][k] for n in nights) for k in range(3)]  # type: ignore[index]
              for g in NOVELTY_GROUPS}
    pooled["unobserved_together"] = [sum(pooled[g][k] for g in NOVELTY_GROUPS
                                         if g.startswith("unobserved")) for k in range(3)]
    print(f"{'pooled':26s} {'attempts':>8s} {'chosen':>7s} {'share 1':>7s}")
    for g, (n, a, b) in pooled.items():
        print(f"{g:26s} {n:8d} {100 * a / max(n, 1):6.1f}% {100 * b / max(n, 1):6.1f}%")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"nights": nights, "pooled": pooled}, indent=2))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
