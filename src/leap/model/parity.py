"""Proof that training and serving build identical features (``leap check-features``).

For a sample of stored attempts of one day it builds the features twice:

* the training path: stored attempt rows (outcome columns and all) encoded against the
  in-memory snapshot as of the start of that day, exactly as nightly training does;
* the serving path: each attempt turned into a JSON job request (launch-time fields only),
  parsed back and encoded on its own type with :meth:`Columns.from_request` against the same
  snapshot after a Parquet save/load round trip, exactly as the ranker does from an artifact.

It also scrambles the outcome columns of the training rows and re-encodes (an outcome must
never change a feature), and checks that every feature a model uses is one a request can
supply.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from leap.catalog import Catalog
from leap.data.schema import JOB_COLUMNS, OUTCOME_COLUMNS
from leap.data.store import Store
from leap.errors import ParamError
from leap.features.columns import Columns
from leap.features.encode import FEATURE_NAMES, FeatureSpec, encode
from leap.features.history import HistoryBuilder, Snapshot, prepare_history
from leap.model.window import day_start, default_as_of, load_attempts, succeeded_attempts


@dataclass
class ParityReport:
    as_of: datetime
    rows: int
    features: int
    mismatched_features: dict[str, int] = field(default_factory=dict)
    outcome_sensitive_features: list[str] = field(default_factory=list)
    unsuppliable_features: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.mismatched_features or self.outcome_sensitive_features
                    or self.unsuppliable_features)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "as_of": self.as_of.isoformat(), "rows": self.rows,
                "features": self.features, "mismatched_features": self.mismatched_features,
                "outcome_sensitive_features": self.outcome_sensitive_features,
                "unsuppliable_features": self.unsuppliable_features}


def _diff(a: np.ndarray, b: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    bad = (~same).sum(axis=0)
    return {n: int(k) for n, k in zip(names, bad, strict=True) if k}


def _requests(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as JSON job requests, as a scheduler would send them (no outcome, no ids)."""
    job = rows[[c for c in JOB_COLUMNS if c in rows.columns]]
    records = pa.Table.from_pandas(job, preserve_index=False).to_pylist()
    return list(json.loads(json.dumps(records)))


def check_parity(store: Store, catalog: Catalog, *, as_of: datetime | None = None,
                 lookback_days: int = 30, sample: int = 1000, seed: int = 0,
                 spec: FeatureSpec | None = None) -> ParityReport:
    """Compare training-path and serving-path features for ``sample`` attempts of one day.

    ``as_of`` is the start of the day whose attempts are checked (default: the last day in
    the store). ``spec`` is the model's feature spec (default: all features, vocabularies
    from the sampled rows).
    """
    if as_of is None:
        as_of = default_as_of(store) - timedelta(days=1)
    as_of = day_start(as_of)
    attempts = load_attempts(store, as_of - timedelta(days=lookback_days),
                             as_of + timedelta(days=1))
    day_rows = succeeded_attempts(attempts[attempts["submitted_at"] >= as_of], catalog)
    if len(day_rows) == 0:
        raise ParamError(f"no succeeded attempts on {as_of:%Y-%m-%d} to check; pick another "
                         "day with {as_of}")
    rng = np.random.default_rng(seed)
    if len(day_rows) > sample:
        day_rows = day_rows.iloc[np.sort(rng.choice(len(day_rows), sample, replace=False))]
    day_rows = day_rows.reset_index(drop=True)
    spec = spec or FeatureSpec.fit(day_rows, catalog)

    builder = HistoryBuilder(prepare_history(attempts[attempts["submitted_at"] < as_of],
                                             catalog), lookback_days=lookback_days)
    snap = builder.snapshot(as_of)
    builder.close()
    X_train = encode(day_rows, snap, catalog, spec)

    with tempfile.TemporaryDirectory() as tmp:
        snap.save(Path(tmp))
        served_snap = Snapshot.load(Path(tmp))
    # Serving: each attempt becomes one request on its own type, encoded like the ranker does.
    hardware = day_rows["hardware"].to_numpy()
    X_serve = np.vstack([encode(Columns.from_request(job, [hw]), served_snap, catalog, spec)
                         for job, hw in zip(_requests(day_rows), hardware, strict=True)])

    scrambled = day_rows.copy()
    for c in OUTCOME_COLUMNS:
        if c in scrambled.columns:
            scrambled[c] = scrambled[c].sample(frac=1.0, random_state=seed).to_numpy()
    X_scrambled = encode(scrambled, snap, catalog, spec)

    return ParityReport(
        as_of=as_of, rows=len(day_rows), features=len(spec.names),
        mismatched_features=_diff(X_train, X_serve, spec.names),
        outcome_sensitive_features=sorted(_diff(X_train, X_scrambled, spec.names)),
        unsuppliable_features=[n for n in spec.names if n not in FEATURE_NAMES],
    )
