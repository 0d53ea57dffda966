"""History snapshot: statistics of a fleet's past attempts as of a point in time.

One rule serves training and serving: the snapshot *as of* ``t`` summarises the succeeded
attempts submitted in ``[t - lookback_days, t)``. Serving uses the snapshot as of the end of
the training window (it travels inside the model artifact); each training row uses the
snapshot as of the start of its own day, exactly what a nightly model would have served that
day. Nothing at or after ``as_of`` is ever read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from leap.catalog import Catalog
from leap.data.usage import usable_attempts
from leap.errors import ArtifactError
from leap.features.columns import SMALL, Columns, key_column, key_texts, nan_to, positions
from leap.features.groupstats import Selection, SortedGroups
from leap.features.pair_rows import ordered_pairs
from leap.features.pairs import PairModel
from leap.features.physics import estimates
from leap.features.transfer import TransferIndex

KEY_SEP = "\x1f"
#: Days that count as "recent" for the ``*_last_*`` statistics.
RECENT_DAYS = 2
#: Plain snapshots whose (family, type)-keyed parts a builder keeps for masked snapshots of
#: the same time: more than the days training builds at once.
PLAIN_KEPT = 4


@dataclass(frozen=True)
class Level:
    """One grouping of history: its key columns and the values it summarises.

    ``y`` is log throughput; ``r`` is the residual of log throughput over the physics
    estimate (``log_phys_sps``, taken as 0 where the job lacks the columns it needs), which
    transfers across hardware and job shapes.
    """

    name: str
    keys: tuple[str, ...]
    values: tuple[str, ...]

    @property
    def stats(self) -> tuple[str, ...]:
        out = [f"{self.name}_n", f"{self.name}_days_since"]
        for v in self.values:
            out += [f"{self.name}_med_{v}", f"{self.name}_last_{v}"]
        out.append(f"{self.name}_sd_{self.values[0]}")
        return tuple(out)


LEVELS: tuple[Level, ...] = (
    # The exact configuration on this hardware: the previous system's lookup-table key.
    Level("fam_hw_shape", ("family_id", "hardware", "shape"), ("y", "r")),
    Level("fam_hw_tc", ("family_id", "hardware", "trainer_count"), ("y", "r")),
    Level("fam_hw", ("family_id", "hardware"), ("y", "r")),
    # The same job shape on other hardware: what spec-ratio scaling transfers.
    Level("fam_shape", ("family_id", "shape"), ("r",)),
    Level("fam_vendor", ("family_id", "vendor"), ("r",)),
    Level("fam", ("family_id",), ("r",)),
    Level("mt_hw", ("model_type", "hardware"), ("r",)),
    Level("mt", ("model_type",), ("r",)),
)

#: The key columns in which one job's rows (a request's, one per candidate type) differ.
_TYPE_KEYS = frozenset({"hardware", "vendor"})
_STRING_KEYS = ("family_id", "model_type", "model_category", "precision", "hardware", "vendor",
                "shape")
#: The cross-type transfer table of a snapshot (see :mod:`leap.features.transfer`).
TRANSFER = "transfer"
TRANSFER_COLUMNS = ("level", "key", "hw_a", "hw_b", "d_med", "n", "sxy", "sxx")


def key_strings(parts: Sequence[np.ndarray], sep: str = KEY_SEP) -> np.ndarray:
    """Join per-column key texts into one string per row (the lookup key of a level)."""
    n = len(parts[0]) if parts else 0
    if n <= SMALL:
        return np.array([sep.join(p[i] for p in parts) for i in range(n)], dtype=object)
    joined = pd.Series(parts[0], dtype=object)
    for p in parts[1:]:
        joined = joined + sep + pd.Series(p, dtype=object)
    return joined.to_numpy(dtype=object)


def shape_keys(jobs: Columns) -> np.ndarray:
    """A job's shape as text, ``trainers/devices per trainer/batch size`` (-1 = missing).

    The shape is one part of a level's key, so it must not contain :data:`KEY_SEP`.
    """
    whole = [nan_to(jobs.num(c), -1.0).astype(np.int64)
             for c in ("trainer_count", "devices_per_trainer", "batch_size")]
    groups = jobs.job_groups()
    if groups is not None and len(groups[0]) < len(jobs):  # jobs' rows: a key a job
        heads, job = groups
        return _shape_texts([a[heads] for a in whole])[job]
    return _shape_texts(whole)


def _shape_texts(whole: list[np.ndarray]) -> np.ndarray:
    """:func:`shape_keys` of the whole numbers of the three shape columns."""
    if len(whole[0]) <= SMALL:  # requests' rows: no arrays of texts to join
        return np.array(["/".join(map(str, row)) for row in zip(*(a.tolist() for a in whole),
                                                                 strict=True)], dtype=object)
    # Made text and joined once per distinct shape (a day of attempts has a few hundred):
    # a twentieth of the time of joining every row's numbers as text.
    parts = [pd.factorize(a) for a in whole]
    shape, keys = _group_ids([codes for codes, _ in parts])
    return key_strings([distinct[keys[:, j]].astype(str)
                        for j, (_, distinct) in enumerate(parts)], sep="/")[shape]


def _table_keys(table: pd.DataFrame, keys: tuple[str, ...]) -> np.ndarray:
    return key_strings([key_column(table[k]) for k in keys])


#: Rows :func:`prepare_history` reduces at a time: its physics estimates and shape keys cost
#: about 1.5 KB a row while they are built, against some 130 bytes a row kept.
PREPARE_CHUNK_ROWS = 200_000


def prepare_history(attempts: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    """Reduce attempts to what history needs: succeeded rows with ``y`` and residual ``r``.

    Rows whose hardware is not in ``catalog`` are dropped (they cannot be scored anyway).
    Each row is filtered and reduced on its own, so a large window is reduced in chunks of
    :data:`PREPARE_CHUNK_ROWS` (the same result, a bounded peak: no filtered copy of the
    whole window is made).
    """
    chunks = (usable_attempts(attempts.iloc[i:i + PREPARE_CHUNK_ROWS], catalog)
              for i in range(0, len(attempts), PREPARE_CHUNK_ROWS))
    parts = [_prepare_rows(ok, catalog) for ok in chunks if len(ok)]
    if len(parts) == 1:
        return parts[0]
    if not parts:  # nothing usable: the empty result keeps the columns of one
        return _prepare_rows(usable_attempts(attempts.iloc[:0], catalog), catalog)
    return pd.concat(parts, ignore_index=True)


def _prepare_rows(ok: pd.DataFrame, catalog: Catalog) -> pd.DataFrame:
    cols = Columns.from_frame(ok)  # once, for the physics and the shape keys
    phys = estimates(cols, catalog)["log_phys_sps"]
    y = np.log(ok["throughput"].to_numpy(dtype=np.float64))
    vendor_of = {n: catalog[n].vendor for n in catalog}
    return pd.DataFrame({
        "family_id": ok["family_id"].astype(str),
        "model_type": ok["model_type"].astype(str),
        **{c: (key_texts(ok[c]) if c in ok.columns else "None")
           for c in ("model_category", "precision")},
        "hardware": ok["hardware"].astype(str),
        "vendor": ok["hardware"].map(vendor_of).astype(str),
        "trainer_count": ok["trainer_count"].astype(np.int64),
        "shape": shape_keys(cols),
        "submitted_at": ok["submitted_at"],
        "y": y,
        # Without a physics estimate (no FLOPs or parameter counts) the residual is the log
        # throughput itself: history still carries each family's level.
        "r": y - np.nan_to_num(phys, nan=0.0),
    })


class Snapshot:
    """History statistics per level as of ``as_of``: what serving looks jobs up in.

    Each level is a string index of keys and a float matrix of its :attr:`Level.stats`;
    ``key_texts`` (level name -> :func:`key_strings` of its table's keys, row for row) spares
    joining them again where the caller has them.
    """

    def __init__(self, as_of: datetime, lookback_days: int,
                 tables: dict[str, pd.DataFrame], pairs: PairModel | None = None,
                 key_texts: Mapping[str, np.ndarray] | None = None) -> None:
        self.as_of = as_of
        self.lookback_days = lookback_days
        self.tables = tables
        #: The night's pair model (:mod:`leap.features.pairs`); ``None`` without one.
        self.pairs = pairs
        self._transfer: TransferIndex | None = None
        self._index: dict[str, tuple[pd.Index, np.ndarray]] = {}
        self._small: dict[str, dict[tuple[str, ...], int]] = {}
        for level in LEVELS:
            t = tables[level.name]
            idx = pd.Index(key_texts[level.name] if key_texts is not None
                           else _table_keys(t, level.keys), dtype=object)
            # One more row, all NaN, last: the row a key without history (position -1) reads.
            values = np.full((len(t) + 1, len(level.stats)), np.nan)
            values[:-1] = t[list(level.stats)].to_numpy(dtype=np.float64)
            self._index[level.name] = (idx, values)

    def lookup(self, keys: Mapping[str, np.ndarray], level: Level,
               jobs: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Stats of ``level`` for each row of ``keys`` (key column -> text array).

        Rows whose key has no history get NaN. A few rows (a launch-time request) are looked
        up by key tuples in a dict, which spares joining their key texts, once :meth:`warm`
        built it: a snapshot built for one small set of rows (as training's hidden-row sets
        are) would spend more building the dict of every key than the lookup saves.
        ``jobs``: the rows are numbered by job
        (:meth:`Columns.job_groups`), so a level keyed by the job alone is one lookup a job.
        """
        idx, values = self._index[level.name]
        parts = [keys[k] for k in level.keys]
        if not len(parts[0]) or not _TYPE_KEYS.isdisjoint(level.keys):
            jobs = None
        if jobs is not None:
            parts = [p[jobs[0]] for p in parts]
        table = self._small.get(level.name)
        if table is not None and len(parts[0]) <= SMALL:
            pos = np.array([table.get(t, -1) for t in zip(*parts, strict=True)],
                           dtype=np.int64)
        else:
            pos = positions(idx, key_strings(parts))
        if jobs is not None:
            pos = pos[jobs[1]]
        return values[pos]  # -1, no history: the last row, NaN

    def warm(self, catalog: Catalog | None = None) -> None:
        """Build the per-level dicts of small lookups now, and the transfer index's state for
        ``catalog`` (serving does this at load, so the first request after a model swap is
        as fast as the others)."""
        for level in LEVELS:
            if level.name not in self._small:
                self._small[level.name] = {tuple(k.split(KEY_SEP)): i for i, k
                                           in enumerate(self._index[level.name][0])}
        self.transfer.warm(catalog)

    @property
    def transfer(self) -> TransferIndex:
        """Cross-type transfer of each family's level (built on first use)."""
        if self._transfer is None:
            self._transfer = TransferIndex(self.tables["fam_hw"], self.tables[TRANSFER],
                                           self.pairs, self.tables["fam_hw_shape"])
        return self._transfer

    def n_keys(self) -> dict[str, int]:
        return {name: len(t) for name, t in self.tables.items()}

    # Persistence (inside the model artifact) --------------------------------------------
    def save(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for name, table in self.tables.items():
            path = directory / f"{name}.parquet"
            pq.write_table(pa.Table.from_pandas(table, preserve_index=False), path)
            written.append(path)
        meta = directory / "snapshot.json"
        meta.write_text(json.dumps({"as_of": self.as_of.isoformat(),
                                    "lookback_days": self.lookback_days}))
        written.append(meta)
        if self.pairs is not None:
            written += self.pairs.save(directory)
        return written

    @classmethod
    def load(cls, directory: Path) -> Snapshot:
        try:
            meta = json.loads((directory / "snapshot.json").read_text())
            tables = {name: pq.read_table(directory / f"{name}.parquet").to_pandas()
                      for name in (*(lv.name for lv in LEVELS), TRANSFER)}
        except (OSError, ValueError, KeyError) as exc:
            raise ArtifactError(f"history snapshot in {directory} is unreadable: {exc}") from None
        wanted = {lv.name: lv.keys + lv.stats for lv in LEVELS} | {TRANSFER: TRANSFER_COLUMNS}
        for name, columns in wanted.items():
            missing = set(columns) - set(tables[name].columns)
            if missing:
                raise ArtifactError(f"history snapshot table '{name}' in {directory} lacks "
                                    f"columns {sorted(missing)}; retrain with this leap version")
        return cls(datetime.fromisoformat(meta["as_of"]), int(meta["lookback_days"]), tables,
                   PairModel.load(directory))


def _group_ids(codes: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Group of each row by its key codes (non-negative integers), numbered in the order of
    the key tuples (what ``ORDER BY`` the keys gives), and each group's key codes.

    >>> gid, keys = _group_ids([np.array([1, 0, 1]), np.array([0, 5, 0])])
    >>> gid.tolist(), keys.tolist()
    ([1, 0, 1], [[0, 5], [1, 0]])
    """
    sizes = [int(c.max()) + 1 if len(c) else 1 for c in codes]
    if float(np.prod(sizes, dtype=np.float64)) < 2.0**62:
        combined = np.zeros(len(codes[0]), dtype=np.int64)
        for c, size in zip(codes, sizes, strict=True):
            combined = combined * size + c
        # Hashed, then only the distinct keys sorted: np.unique sorted every row.
        first_seen, uniq = pd.factorize(combined)
        order = np.argsort(uniq)
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        gid, uniq = rank[first_seen], uniq[order]
        keys = np.empty((len(uniq), len(codes)), dtype=np.int64)
        for j in range(len(codes) - 1, -1, -1):
            uniq, keys[:, j] = np.divmod(uniq, sizes[j])
        return gid.astype(np.int64), keys
    uniq, gid = np.unique(np.column_stack(codes), axis=0, return_inverse=True)
    return gid.reshape(-1).astype(np.int64), uniq


class HistoryBuilder:
    """Builds snapshots as of any time from one prepared history frame.

    The rows are grouped by every level's keys and each value is sorted within its groups
    once, here (:class:`~leap.features.groupstats.SortedGroups`); a snapshot is then a mask
    over the rows (the lookback range, less any excluded pairs), linear in the rows. Every
    statistic is exact (counts, ages, medians: what SQL gives over the same rows) or summed
    in a fixed order, on one thread, so the same history gives the same snapshot to the last
    bit.

    Examples
    --------
    Not run here (it needs a workspace)::

        builder = HistoryBuilder(prepare_history(attempts, catalog), lookback_days=30)
        snap = builder.snapshot(datetime(2026, 1, 31, tzinfo=UTC))
    """

    def __init__(self, history: pd.DataFrame, *, lookback_days: int = 30,
                 pairs: Callable[[datetime], PairModel | None] | None = None) -> None:
        self.lookback_days = lookback_days
        # The pair model as of a time (a :class:`~leap.features.pairs.PairSchedule`).
        self.pairs = pairs
        at = pd.to_datetime(history["submitted_at"], utc=True)
        order = np.argsort(at.to_numpy(dtype="datetime64[ns]").view(np.int64), kind="stable")
        #: Submission times in ns since the epoch, ascending (the rows' order from here on).
        self._time = at.to_numpy(dtype="datetime64[ns]").view(np.int64)[order]
        self._labels: dict[str, np.ndarray] = {}
        codes: dict[str, np.ndarray] = {}
        for col in (*_STRING_KEYS, "trainer_count"):
            # Numbered in the frame's own strings, then put in time order: the same codes and
            # labels as numbering Python strings in time order, ten times faster on Arrow
            # strings (4x fleet: 0.1 s a column instead of 1-1.8 s).
            c, labels = pd.factorize(history[col], sort=True)
            codes[col] = c[order].astype(np.int32)
            self._labels[col] = np.asarray(labels, dtype=object if col != "trainer_count"
                                           else np.int64)
        y = history["y"].to_numpy(dtype=np.float64)[order]
        r = history["r"].to_numpy(dtype=np.float64)[order]
        values = {"y": y, "r": r, "p": y - r}
        self._codes = {c: codes[c] for c in ("model_type", "model_category", "precision")}
        n_hw = len(self._labels["hardware"])
        #: (family, type) pair of each row, as ``family code * types + type code``.
        self._pair = codes["family_id"].astype(np.int64) * n_hw + codes["hardware"]
        #: Each row's trainer-count code (:meth:`snapshot`'s ``exclude_trainer_counts_from``).
        self._trainer_count = codes["trainer_count"]
        # The rows in the order of each value, shared by every level's groups.
        index = np.int32 if len(y) < 2**31 else np.int64
        value_orders = {v: np.argsort(a, kind="stable").astype(index) for v, a in values.items()}
        self._groups: dict[str, SortedGroups] = {}
        #: Each level's groups: their key columns, and those joined (the snapshot's index).
        self._keys: dict[str, list[np.ndarray]] = {}
        self._key_texts: dict[str, np.ndarray] = {}
        #: The (family, type) pair of each group of the levels keyed by both (as ``_pair``).
        self._group_pair: dict[str, np.ndarray] = {}
        for level in LEVELS:
            gid, keys = _group_ids([codes[k] for k in level.keys])
            wanted = level.values + (("p",) if level.name == _FAMILY_TYPE else ())
            self._groups[level.name] = SortedGroups(gid, len(keys),
                                                    {v: values[v] for v in wanted}, value_orders)
            labels = [self._labels[k][keys[:, j]] for j, k in enumerate(level.keys)]
            self._keys[level.name] = labels
            self._key_texts[level.name] = key_strings([np.asarray(v.astype(str), dtype=object)
                                                       for v in labels])
            if {"family_id", "hardware"} <= set(level.keys):
                family = keys[:, level.keys.index("family_id")].astype(np.int64)
                self._group_pair[level.name] = family * n_hw + keys[:, level.keys.index(
                    "hardware")]
            if level.name == _FAMILY_TYPE:
                #: The (family code, type code) of each (family, type) group.
                self._family_type = keys
        #: What the latest snapshots built without exclusions hold for masked ones of the
        #: same time (see :meth:`snapshot`), by time: the :data:`PLAIN_KEPT` latest built
        #: (training may build a few days at once, on threads).
        self._plain: dict[datetime, _PlainParts] = {}

    def close(self) -> None:
        """Let the sorted rows go (no snapshot can be built after)."""
        self._groups.clear()
        self._plain.clear()

    def snapshot(self, as_of: datetime, *, exclude: pd.DataFrame | None = None,
                 exclude_hardware: Sequence[str] = (),
                 exclude_families: Sequence[str] = (),
                 exclude_trainer_counts_from: pd.DataFrame | None = None) -> Snapshot:
        """The snapshot of attempts submitted in ``[as_of - lookback_days, as_of)``.

        ``exclude`` (columns ``family_id``, ``hardware``) removes every attempt of those
        (family, type) pairs first: the snapshot is exactly the one a fleet would have had if
        those families had never run on those types (how training learns to transfer).
        ``exclude_hardware`` removes every attempt on those types: the fleet as it would have
        been had nobody run on them (how training calibrates a new type's interval).
        ``exclude_families`` removes every attempt of those families (all of a model type's:
        how training calibrates a new model type's interval).
        ``exclude_trainer_counts_from`` (columns ``family_id``, ``hardware``,
        ``trainer_count``) removes every attempt of those families on those types at that
        trainer count or a larger one, keeping their smaller ones there (how training
        calibrates the interval of a trainer count new to its pair: a job scaled out).
        """
        if as_of.tzinfo is None:
            raise ValueError("as_of must be timezone-aware (UTC)")
        as_of = as_of.astimezone(UTC)
        start, end, recent = (int(np.searchsorted(self._time, _ns(t))) for t in (
            as_of - timedelta(days=self.lookback_days), as_of,
            as_of - timedelta(days=RECENT_DAYS)))
        kept = excluded = None
        if (exclude is not None and len(exclude)) or len(exclude_hardware) \
                or len(exclude_families):
            n_hw = len(self._labels["hardware"])
            excluded = np.zeros(len(self._labels["family_id"]) * n_hw, dtype=bool)
            if exclude is not None and len(exclude):
                family = self._encode_labels("family_id", exclude["family_id"])
                hw = self._encode_labels("hardware", exclude["hardware"])
                known = (family >= 0) & (hw >= 0)
                excluded[family[known] * n_hw + hw[known]] = True
            if len(exclude_hardware):
                hidden = self._encode_labels("hardware", pd.Series(list(exclude_hardware)))
                excluded.reshape(-1, n_hw)[:, hidden[hidden >= 0]] = True
            if len(exclude_families):
                gone = self._encode_labels("family_id", pd.Series(list(exclude_families)))
                excluded.reshape(-1, n_hw)[gone[gone >= 0], :] = True
            kept = ~excluded[self._pair]
        runs = exclude_trainer_counts_from is not None and len(exclude_trainer_counts_from) > 0
        if runs:
            # Only some rows of a pair go: nothing is taken from the plain snapshot below.
            kept_runs = self._kept_below(exclude_trainer_counts_from)
            kept = kept_runs if kept is None else kept & kept_runs
        # A group of a level keyed by (family, type) holds the rows of one pair: it is either
        # excluded whole or has exactly the rows, and so the statistics, it has without
        # exclusions. Those levels are taken from the plain snapshot as of the same time
        # (training builds it first) instead of being computed again.
        plain = None if runs else self._plain.get(as_of)
        tables, texts, pair_levels = {}, {}, {}
        for lv in LEVELS:
            if plain is not None and excluded is not None and lv.name in self._group_pair:
                table, text, pair = plain.levels[lv.name]
                keep = ~excluded[pair]
                tables[lv.name] = table[keep].reset_index(drop=True)
                texts[lv.name] = text[keep]
                continue
            groups = self._groups[lv.name]
            full = groups.select(start, end, kept)
            present = np.flatnonzero(full.count() > 0)
            tables[lv.name] = self._level(lv, full, groups.select(max(start, recent), end, kept),
                                          present, as_of)
            texts[lv.name] = self._key_texts[lv.name][present]
            if lv.name in self._group_pair:
                pair_levels[lv.name] = (tables[lv.name], texts[lv.name],
                                        self._group_pair[lv.name][present])
            if lv.name == _FAMILY_TYPE:
                pair_stats = self._family_type_stats(full, present, tables[lv.name])
        if plain is not None and excluded is not None:
            keep = ~excluded[plain.levels[_FAMILY_TYPE][2]]
            pair_stats = {k: v[keep] for k, v in plain.pair_stats.items()}
        elif kept is None:
            self._plain[as_of] = _PlainParts(pair_levels, pair_stats)
            for old in list(self._plain)[:-PLAIN_KEPT]:
                self._plain.pop(old, None)
        tables[TRANSFER] = self._transfer_table(pair_stats)
        return Snapshot(as_of, self.lookback_days, tables,
                        self.pairs(as_of) if self.pairs is not None else None, texts)

    def _kept_below(self, runs: pd.DataFrame) -> np.ndarray:
        """Per row: False where its family and type are one of ``runs``'s and its trainer
        count is that run's or larger (the smallest where a pair is given twice)."""
        family = self._encode_labels("family_id", runs["family_id"])
        hw = self._encode_labels("hardware", runs["hardware"])
        counts = pd.to_numeric(runs["trainer_count"], errors="coerce").to_numpy(np.float64)
        known = (family >= 0) & (hw >= 0) & ~np.isnan(counts)
        n_hw = len(self._labels["hardware"])
        below = np.full(len(self._labels["family_id"]) * n_hw, np.inf)
        np.minimum.at(below, family[known] * n_hw + hw[known], counts[known])
        return self._labels["trainer_count"][self._trainer_count] < below[self._pair]

    def _encode_labels(self, col: str, values: pd.Series) -> np.ndarray:
        """Integer codes of ``values`` in column ``col`` (-1 where history never saw one)."""
        return pd.Index(self._labels[col]).get_indexer(values.astype(str)).astype(np.int64)

    def _level(self, level: Level, full: Selection, recent: Selection, present: np.ndarray,
               as_of: datetime) -> pd.DataFrame:
        """One level's table: the groups with rows in ``full`` (``present``), in key order.
        Key texts stay object arrays: pandas' own strings cost a conversion each way."""
        n = full.count()
        latest = self._time[full.last_row()[present]]
        # Seconds from the latest attempt's whole second to as_of (SQL's date_diff('second')).
        seconds = _ns(as_of) // 10**9 - latest // 10**9
        out = {**{k: pd.Series(v[present], dtype=v.dtype)
                  for k, v in zip(level.keys, self._keys[level.name], strict=True)},
               f"{level.name}_n": n[present].astype(np.float64),
               f"{level.name}_days_since": seconds / 86400.0}
        for v in level.values:
            out[f"{level.name}_med_{v}"] = full.median(v)[present]
            # The most recent days alone: they catch step changes the long median lags.
            out[f"{level.name}_last_{v}"] = recent.median(v)[present]
        v0 = level.values[0]
        out[f"{level.name}_sd_{v0}"] = full.std(v0)[present]
        return pd.DataFrame(out)

    def _family_type_stats(self, family_type: Selection, present: np.ndarray,
                           table: pd.DataFrame) -> dict[str, np.ndarray]:
        """What the transfer table reads of each (family, type) group with rows: its family
        and type codes, model type, category and precision codes (their smallest over its
        rows), and median residual and physics estimate. ``family_type`` is the snapshot's
        rows grouped by (family, type), ``present`` the groups it holds rows of, ``table``
        their level table (whose median residual this is)."""
        return {"family": self._family_type[present, 0], "hw": self._family_type[present, 1],
                **{c: family_type.minimum(self._codes[c])[present].astype(np.int64)
                   for c in ("model_type", "model_category", "precision")},
                "r": table[f"{_FAMILY_TYPE}_med_r"].to_numpy(dtype=np.float64),
                "phys": family_type.median("p")[present]}

    def _transfer_table(self, stats: Mapping[str, np.ndarray]) -> pd.DataFrame:
        """Cross-type differences of the residual ``r`` between families' median levels.

        For every family that ran on two types A and B in the window, ``r(B) - r(A)`` of its
        median residuals is one sample of how B compares with A beyond the physics estimate.
        Their median and count per (model type, A, B), per (model category and precision, A,
        B) and per (precision, A, B); keys are :data:`~leap.features.transfer.TRANSFER_LEVELS`
        texts. ``stats``: :meth:`_family_type_stats` of the snapshot's (family, type) groups.
        """
        family, hw, r, phys = stats["family"], stats["hw"], stats["r"], stats["phys"]
        mt, cat, prec = stats["model_type"], stats["model_category"], stats["precision"]
        # Every ordered pair (a, b) of one family's types, a != b (the groups come sorted by
        # family).
        a, b = ordered_pairs(family)
        d, dp = r[b] - r[a], phys[b] - phys[a]
        mts, cats, precs, hws = (self._labels[c] for c in ("model_type", "model_category",
                                                           "precision", "hardware"))
        parts = []
        for level, k1, k2 in (("all", None, prec[a]), ("cat", cat[a], prec[a]),
                              ("mt", mt[a], None)):
            gid, keys = _group_ids([k for k in (k1, k2) if k is not None] + [hw[a], hw[b]])
            pairs = SortedGroups(gid, len(keys), {"d": d}).select(0, len(d))
            text = (precs[keys[:, 0]] if level == "all" else mts[keys[:, 0]] if level == "mt"
                    else cats[keys[:, 0]] + "/" + precs[keys[:, 1]])
            parts.append(pd.DataFrame({
                "level": np.full(len(keys), level, dtype=object),
                "key": pd.Series(text, dtype=object),
                "hw_a": pd.Series(hws[keys[:, -2]], dtype=object),
                "hw_b": pd.Series(hws[keys[:, -1]], dtype=object),
                "d_med": pairs.median("d"), "n": pairs.count().astype(np.float64),
                # Sums over the pairs of d = r(B) - r(A) times, and of the square of, the
                # difference of their physics estimates: the slope of how much of the
                # physics gain between two types a job actually gets (see TransferIndex).
                "sxy": _finite_sums(gid, d * dp, len(keys)),
                "sxx": _finite_sums(gid, dp * dp, len(keys))}))
        return pd.concat(parts, ignore_index=True)


def _finite_sums(gid: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum of the finite ``values`` per group in whole 1e-9 units (0 for a group without
    any): an integer sum, exact below 2**53 units whatever the order, where a term too small
    to matter adds nothing (so a gain slope is not read off differences of rounding noise).

    >>> _finite_sums(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 4e-10, np.inf]), 2).tolist()
    [0.3, 0.0]
    """
    ok = np.isfinite(values)
    units = np.round(values[ok] * 1e9)
    return np.bincount(gid[ok], weights=units, minlength=n_groups) / 1e9


class _PlainParts(NamedTuple):
    """What a snapshot without exclusions gives masked snapshots of the same time."""

    #: Each (family, type)-keyed level: its table, key texts and each row's pair.
    levels: dict[str, tuple[pd.DataFrame, np.ndarray, np.ndarray]]
    #: :meth:`HistoryBuilder._family_type_stats` of its (family, type) groups.
    pair_stats: dict[str, np.ndarray]


#: The level whose groups are (family, type) pairs: the transfer table's families.
_FAMILY_TYPE = "fam_hw"


def _ns(t: datetime) -> int:
    """``t`` in whole nanoseconds since the epoch."""
    return int(pd.Timestamp(t).value)
