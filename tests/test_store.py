"""Tests for the DuckDB attempt store: layout, idempotent batches, windows, meta, atomicity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from leap.data.schema import ATTEMPTS_SCHEMA, QUARANTINE_SCHEMA
from leap.data.store import Store
from leap.errors import DataError

T0 = datetime(2024, 5, 1, tzinfo=UTC)


def make_rows(n: int, *, start: int = 0, t0: datetime = T0) -> pa.Table:
    """``n`` valid attempts, one per hour from ``t0``, ids ``a{start}..``."""
    idx = np.arange(start, start + n)
    succeeded = idx % 4 != 3
    hours = idx.astype("timedelta64[h]").astype("timedelta64[us]")
    return pa.table({
        "attempt_id": np.char.add("a", idx.astype(str)),
        "family_id": np.char.add("f", (idx % 3).astype(str)),
        "model_type": np.char.add("m", (idx % 2).astype(str)),
        "submitted_at": pa.array(np.datetime64(t0.replace(tzinfo=None), "us") + hours,
                                 pa.timestamp("us", tz="UTC")),
        "hardware": np.where(idx % 2 == 0, "H100-SXM", "A100-SXM4-80GB"),
        "trainer_count": (idx % 8 + 1).astype(np.int64),
        "batch_size": np.full(n, 64, np.int64),
        "status": np.where(succeeded, "succeeded", "failed"),
        "throughput": pa.array(np.linspace(10.0, 1e5, n), mask=~succeeded),
    })


def no_bad() -> pa.Table:
    return QUARANTINE_SCHEMA.empty_table()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "home" / "leap.duckdb")
    yield s
    s.close()


def test_attempts_table_has_schema_columns_in_order_then_bookkeeping(store: Store) -> None:
    rows = store.con.execute("SELECT column_name, data_type FROM information_schema.columns "
                             "WHERE table_name = 'attempts' ORDER BY ordinal_position"
                             ).fetchall()
    names = [r[0] for r in rows]
    assert names == [*ATTEMPTS_SCHEMA.names, "batch_id", "ingested_at"]
    types = dict(rows)
    assert types["submitted_at"] == "TIMESTAMP WITH TIME ZONE"
    assert types["trainer_count"] == "BIGINT"
    assert types["throughput"] == "DOUBLE"


def test_add_batch_counts_and_reingest_adds_nothing(store: Store) -> None:
    first = store.add_batch(make_rows(10), no_bad(), source="t")
    assert (first.added, first.already_stored, first.quarantined) == (10, 0, 0)
    # Half overlapping: the overlap is "already stored", the rest is new.
    second = store.add_batch(make_rows(10, start=5), no_bad(), source="t")
    assert (second.added, second.already_stored) == (5, 5)
    assert second.batch_id == first.batch_id + 1
    again = store.add_batch(make_rows(15), no_bad(), source="t")
    assert (again.added, again.already_stored) == (0, 15)
    assert store.count() == 15


def test_round_trip_keeps_values_and_types(store: Store) -> None:
    rows = make_rows(6)
    store.add_batch(rows, no_bad(), source="t")
    back = store.attempts()
    assert back.schema.equals(ATTEMPTS_SCHEMA)
    assert back.select(rows.column_names).equals(rows.cast(back.select(rows.column_names).schema))
    assert back.column("model_category").null_count == 6


def test_a_large_read_hands_duckdb_memory_back_and_keeps_the_limit(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import leap.data.store as store_module

    def limit() -> str:
        return str(store.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])

    default = limit()
    store.add_batch(make_rows(40), no_bad(), source="t")
    released: list[bool] = []
    real = Store.release_memory
    monkeypatch.setattr(Store, "release_memory", lambda s: (released.append(True), real(s)))
    store.attempts()
    assert released == []  # a small read keeps DuckDB's cache
    monkeypatch.setattr(store_module, "RELEASE_ROWS", 40)
    first = store.attempts()
    assert released == [True]
    assert limit() == default  # the limit is back where it was
    assert store.attempts().equals(first)  # and the store reads the same after it


def test_quarantined_rows_are_stored_once_with_source(store: Store) -> None:
    bad = pa.table({"source": [None, "other.csv"], "row_number": [3, 7],
                    "reason": ["r1", "r2"], "record": ['{"a":1}', '{"b":2}']})
    r = store.add_batch(make_rows(1), bad, source="in.csv")
    assert (r.quarantined, r.quarantine_new) == (2, 2)
    r = store.add_batch(make_rows(1), bad, source="in.csv")
    assert (r.quarantined, r.quarantine_new) == (2, 0)
    q = store.quarantined().to_pylist()
    assert [(x["source"], x["row_number"], x["reason"]) for x in q] == [
        ("in.csv", 3, "r1"), ("other.csv", 7, "r2")]
    assert store.quarantine_count() == 2


def test_exception_inside_batch_rolls_everything_back(store: Store) -> None:
    store.add_batch(make_rows(3), no_bad(), source="t")
    with pytest.raises(RuntimeError, match="boom"), store.batch() as b:
        b.add(make_rows(10, start=100), no_bad(), source="t")
        raise RuntimeError("boom")
    assert store.count() == 3
    assert store.con.execute("SELECT count(*) FROM batches").fetchall()[0][0] == 1


def test_repeated_ids_in_good_rows_are_refused(store: Store) -> None:
    rows = pa.concat_tables([make_rows(2), make_rows(1)])
    with pytest.raises(DataError, match="1 repeated attempt_id"):
        store.add_batch(rows, no_bad(), source="dup")
    assert store.count() == 0


def test_good_rows_missing_a_required_column_are_refused(store: Store) -> None:
    with pytest.raises(DataError, match=r"lack required column.*status"):
        store.add_batch(make_rows(2).drop_columns(["status"]), no_bad(), source="x")


def test_attempts_window_is_half_open_and_naive_means_utc(store: Store) -> None:
    store.add_batch(make_rows(48), no_bad(), source="t")  # hourly over two days
    day2 = store.attempts(start=T0 + timedelta(days=1), end=T0 + timedelta(days=2))
    assert day2.num_rows == 24
    assert day2.column("submitted_at")[0].as_py() == T0 + timedelta(days=1)
    naive = store.attempts(start=datetime(2024, 5, 2), end=datetime(2024, 5, 3))
    assert naive.equals(day2)
    # The same instant written with another offset selects the same rows.
    plus2 = timezone(timedelta(hours=2))
    shifted = store.attempts(start=datetime(2024, 5, 2, 2, tzinfo=plus2))
    assert shifted.num_rows == 24
    ids = store.attempts(columns=["attempt_id", "throughput"])
    assert ids.column_names == ["attempt_id", "throughput"]
    assert ids.column("attempt_id").to_pylist()[:3] == ["a0", "a1", "a2"]


def test_attempts_rejects_unknown_column_with_suggestion(store: Store) -> None:
    with pytest.raises(DataError, match="unknown attempt column 'throughtput'; did you mean "
                                        "'throughput'"):
        store.attempts(columns=["throughtput"])


def test_time_range_is_none_when_empty_then_utc_aware(store: Store) -> None:
    assert store.time_range() is None
    store.add_batch(make_rows(5), no_bad(), source="t")
    first, last = store.time_range() or (None, None)
    assert first == T0 and last == T0 + timedelta(hours=4)
    assert first is not None and first.tzinfo is not None


def test_meta_set_get_overwrite_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "leap.duckdb"
    with Store(path) as s:
        assert s.get_meta("seed") is None
        s.set_meta("seed", "1")
        s.set_meta("seed", "2")
        s.set_meta("scenario", "days = 30\n")
    with Store(path, read_only=True) as s:
        assert s.get_meta("seed") == "2"
        assert s.get_meta("scenario") == "days = 30\n"


def test_read_only_store_must_exist_and_refuses_writes(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no attempt store at .*leap\.duckdb; ingest attempts"):
        Store(tmp_path / "leap.duckdb", read_only=True)
    Store(tmp_path / "leap.duckdb").close()
    with Store(tmp_path / "leap.duckdb", read_only=True) as s, \
            pytest.raises(DataError, match="open read-only"):
        s.add_batch(make_rows(1), no_bad(), source="t")


def test_a_foreign_duckdb_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE things (x INT)")
    con.close()
    with pytest.raises(DataError, match="is not a leap attempt store"):
        Store(path, read_only=True)


def test_stats_on_hand_made_rows(store: Store) -> None:
    empty = store.stats()
    assert empty["attempts"] == 0 and empty["first_submitted_at"] is None
    assert empty["per_status"] == {"succeeded": 0, "failed": 0, "oom": 0, "preempted": 0}
    store.add_batch(make_rows(30), no_bad(), source="t")  # 24 on day 1, 6 on day 2
    s = store.stats()
    assert s["attempts"] == 30
    assert s["per_day"] == [{"date": "2024-05-01", "attempts": 24},
                            {"date": "2024-05-02", "attempts": 6}]
    assert s["per_hardware"] == {"A100-SXM4-80GB": 15, "H100-SXM": 15}
    assert s["per_status"] == {"succeeded": 23, "failed": 7, "oom": 0, "preempted": 0}
    assert (s["families"], s["model_types"], s["days"], s["batches"]) == (3, 2, 2, 1)
    assert s["first_submitted_at"] == "2024-05-01T00:00:00+00:00"
    assert s["last_submitted_at"] == "2024-05-02T05:00:00+00:00"


def test_second_writer_gets_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "leap.duckdb"
    Store(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from leap.data.store import Store
            s = Store(Path({str(path)!r}))
            print("ready", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(DataError, match="in use by another leap process"):
            Store(path)
    finally:
        holder.kill()
        holder.wait()


KILL_SCRIPT = """
import sys, time
from pathlib import Path
from tests.test_store import make_rows, no_bad
from leap.data.store import Store
with Store(Path(sys.argv[1])) as store, store.batch() as batch:
    # Large enough that DuckDB writes row groups to the file before the commit.
    batch.add(make_rows(300_000, start=1_000), no_bad(), source="doomed")
    store.set_meta("doomed", "yes")
    print("mid-transaction", flush=True)
    time.sleep(120)
"""


def test_sigkill_mid_transaction_leaves_store_as_before(tmp_path: Path) -> None:
    path = tmp_path / "leap.duckdb"
    with Store(path) as s:
        s.add_batch(make_rows(100), no_bad(), source="before")
        before = (s.count(), s.quarantine_count(), s.stats()["batches"], s.get_meta("doomed"))
    size_before = path.stat().st_size
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(path)], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "mid-transaction", proc.stderr.read() if proc.stderr else ""
        # The uncommitted rows already sit in the file: the kill lands mid-write, not before.
        assert path.stat().st_size > size_before
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    with Store(path) as s:
        assert (s.count(), s.quarantine_count(), s.stats()["batches"],
                s.get_meta("doomed")) == before
        # And the store still takes writes after recovery.
        assert s.add_batch(make_rows(5, start=100), no_bad(), source="after").added == 5
