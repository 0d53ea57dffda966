"""Tests for reading and validating attempt files, and ingesting them into the store."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leap.catalog import Catalog
from leap.data.ingest import (
    Validated,
    check_files,
    file_format,
    ingest_files,
    ingest_table,
    read_attempts_file,
    validate,
)
from leap.data.schema import ATTEMPTS_SCHEMA
from leap.data.store import Store
from leap.errors import DataError

DATA = Path(__file__).parent / "data"
CATALOG = Catalog.default()
TS_HELP = ("expected an ISO-8601 timestamp such as 2024-05-01T12:00:00Z (no offset means UTC)")

BASE = {
    "attempt_id": "x1", "family_id": "fam", "model_type": "bert",
    "submitted_at": "2024-05-01T12:00:00Z", "hardware": "H100-SXM", "trainer_count": "2",
    "batch_size": "64", "status": "succeeded", "throughput": "1500.5", "num_params": "1e9",
    "precision": "bf16", "devices_per_trainer": "8", "tensor_parallel": "2",
    "duration_hours": "1.5",
}


def csv_text(rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(BASE), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def validate_rows(tmp_path: Path, rows: list[dict[str, str]]) -> Validated:
    path = tmp_path / "in.csv"
    path.write_text(csv_text(rows))
    return validate(read_attempts_file(path), CATALOG, origin=str(path))


# One bad field at a time (on a row that is otherwise valid) and the reason it must give.
BAD_CASES: list[tuple[dict[str, str], str]] = [
    ({"attempt_id": ""}, "missing required field 'attempt_id'"),
    ({"family_id": ""}, "missing required field 'family_id'"),
    ({"model_type": "   "}, "missing required field 'model_type'"),
    ({"submitted_at": ""}, "missing required field 'submitted_at'"),
    ({"submitted_at": "yesterday"}, f"ill-typed field 'submitted_at': {TS_HELP}"),
    ({"submitted_at": "1714564800"}, f"ill-typed field 'submitted_at': {TS_HELP}"),
    ({"submitted_at": "2024-02-30T00:00:00Z"}, f"ill-typed field 'submitted_at': {TS_HELP}"),
    ({"hardware": ""}, "missing required field 'hardware'"),
    ({"hardware": "H100-SXN"}, "unknown hardware 'H100-SXN'; did you mean 'H100-SXM'? "
                               "Fix the name or add it to your catalog TOML"),
    ({"hardware": "Quantum-9000"}, "unknown hardware 'Quantum-9000'; fix the name or add it "
                                   "to your catalog TOML"),
    ({"trainer_count": ""}, "missing required field 'trainer_count'"),
    ({"trainer_count": "two"}, "ill-typed field 'trainer_count': expected an integer"),
    ({"trainer_count": "1.5"}, "ill-typed field 'trainer_count': expected an integer"),
    ({"trainer_count": "0"}, "trainer_count must be >= 1 (the number of trainers)"),
    ({"trainer_count": "-2"}, "trainer_count must be >= 1 (the number of trainers)"),
    ({"batch_size": "0"}, "batch_size must be >= 1 (per-trainer samples per step)"),
    ({"batch_size": "-64"}, "batch_size must be >= 1 (per-trainer samples per step)"),
    ({"batch_size": "big"}, "ill-typed field 'batch_size': expected an integer"),
    ({"status": ""}, "missing required field 'status'"),
    ({"status": "sucess"}, "unknown status 'sucess'; did you mean 'succeeded'? Status must be "
                           "one of succeeded, failed, oom, preempted"),
    ({"status": "exploded"}, "unknown status 'exploded'; status must be one of succeeded, "
                             "failed, oom, preempted"),
    ({"throughput": ""}, "missing throughput on a succeeded attempt"),
    ({"throughput": "-5"}, "throughput must be a finite number > 0 on a succeeded attempt"),
    ({"throughput": "0"}, "throughput must be a finite number > 0 on a succeeded attempt"),
    ({"throughput": "nan"}, "throughput must be a finite number > 0 on a succeeded attempt"),
    ({"throughput": "inf"}, "throughput must be a finite number > 0 on a succeeded attempt"),
    ({"throughput": "fast"}, "ill-typed field 'throughput': expected a number"),
    ({"status": "failed"}, "throughput must be empty unless status is succeeded (this attempt "
                           "is failed)"),
    ({"status": "oom", "throughput": "3"}, "throughput must be empty unless status is "
                                           "succeeded (this attempt is oom)"),
    ({"num_params": "-1"}, "optional field 'num_params' must be a finite number >= 0"),
    ({"num_params": "many"}, "ill-typed optional field 'num_params': expected a number"),
    ({"precision": "bf17"}, "unknown precision 'bf17'; did you mean 'bf16'? Precision must be "
                            "one of fp32, tf32, bf16, fp16, fp8"),
    ({"devices_per_trainer": "0"}, "optional field 'devices_per_trainer' must be >= 1"),
    ({"tensor_parallel": "2.5"}, "ill-typed optional field 'tensor_parallel': expected an "
                                 "integer"),
    ({"duration_hours": "inf"}, "optional field 'duration_hours' must be a finite number >= 0"),
]


@pytest.mark.parametrize(("change", "reason"), BAD_CASES,
                         ids=[f"{k}={v!r}" for c, _ in BAD_CASES for k, v in
                              list(c.items())[-1:]])
def test_each_bad_field_quarantines_its_row_with_reason(
        tmp_path: Path, change: dict[str, str], reason: str) -> None:
    good = {**BASE, "attempt_id": "g1"}
    v = validate_rows(tmp_path, [good, {**BASE, **change}])
    assert v.good.column("attempt_id").to_pylist() == ["g1"]
    bad = v.quarantined.to_pylist()
    assert len(bad) == 1
    assert bad[0]["reason"] == reason
    assert bad[0]["row_number"] == 2
    assert bad[0]["source"] == str(tmp_path / "in.csv")
    record = json.loads(bad[0]["record"])
    for key, value in change.items():  # the original text is kept, empty as null
        assert record[key] == (value or None)
    assert v.reasons == {reason: 1}


def test_valid_variants_are_normalised(tmp_path: Path) -> None:
    rows = [
        {**BASE, "attempt_id": "z", "submitted_at": "2024-05-01T12:00:00Z"},
        {**BASE, "attempt_id": "plus2", "submitted_at": "2024-05-01T14:00:00+02:00"},
        {**BASE, "attempt_id": "naive", "submitted_at": "2024-05-01 12:00:00"},
        {**BASE, "attempt_id": "minus5", "submitted_at": "2024-05-01T07:00:00-05:00",
         "status": "SUCCEEDED", "precision": "BF16", "trainer_count": "2.0"},
        {**BASE, "attempt_id": "failed", "status": " failed ", "throughput": "",
         "trainer_count": "1e1", "num_params": "", "precision": ""},
    ]
    v = validate_rows(tmp_path, rows)
    assert v.quarantined.num_rows == 0
    assert v.good.schema.equals(ATTEMPTS_SCHEMA)
    g = v.good.to_pydict()
    noon = datetime(2024, 5, 1, 12, tzinfo=UTC)
    assert g["submitted_at"][:4] == [noon] * 4
    assert g["status"] == ["succeeded"] * 4 + ["failed"]
    assert g["precision"][3] == "bf16"
    assert g["trainer_count"][3:] == [2, 10]
    assert g["throughput"][4] is None and g["num_params"][4] is None
    assert g["model_category"] == [None] * 5  # absent optional column: null


def test_duplicate_attempt_id_keeps_the_first_valid_row(tmp_path: Path) -> None:
    rows = [
        {**BASE, "attempt_id": "d", "batch_size": "1"},
        {**BASE, "attempt_id": "d", "batch_size": "2"},
        {**BASE, "attempt_id": "d", "batch_size": "3"},
        {**BASE, "attempt_id": "e", "hardware": "nope"},  # invalid first ...
        {**BASE, "attempt_id": "e", "batch_size": "5"},   # ... so this valid one is kept
    ]
    v = validate_rows(tmp_path, rows)
    assert v.good.column("batch_size").to_pylist() == [1, 5]
    dup = "duplicate attempt_id within the input (the first valid row with it was kept)"
    assert [(r["row_number"], r["reason"]) for r in v.quarantined.to_pylist()] == [
        (2, dup), (3, dup),
        (4, "unknown hardware 'nope'; fix the name or add it to your catalog TOML")]


def test_first_failing_check_is_the_reason(tmp_path: Path) -> None:
    v = validate_rows(tmp_path, [{**BASE, "family_id": "", "hardware": "nope",
                                  "trainer_count": "0"}])
    assert list(v.reasons) == ["missing required field 'family_id'"]


def test_unknown_columns_are_reported_and_ignored() -> None:
    v = validate(read_attempts_file(DATA / "attempts_bad.csv"), CATALOG, origin="bad")
    assert v.unknown_columns == ["cluster"]
    assert "cluster" not in v.good.column_names
    assert v.good.column("attempt_id").to_pylist() == ["b01", "b07"]
    assert v.quarantined.num_rows == 6
    assert sum(v.reasons.values()) == 6


def small_expected() -> pa.Table:
    return validate(read_attempts_file(DATA / "attempts_small.csv"), CATALOG, origin="x").good


def test_small_fixture_is_all_valid_and_in_utc() -> None:
    good = small_expected()
    assert good.num_rows == 12
    ts = dict(zip(good.column("attempt_id").to_pylist(),
                  good.column("submitted_at").to_pylist(), strict=True))
    assert ts["s05"] == datetime(2024, 5, 1, 23, tzinfo=UTC)
    assert ts["s06"] == datetime(2024, 5, 2, 6, tzinfo=UTC)
    assert ts["s11"] == datetime(2024, 5, 3, 10, tzinfo=UTC)


def test_json_lines_with_mixed_types_reads_like_csv(tmp_path: Path) -> None:
    table = read_attempts_file(DATA / "attempts_small.jsonl")
    v = validate(table, CATALOG, origin="jsonl")
    assert v.quarantined.num_rows == 0
    assert v.unknown_columns == ["scheduler_note"]
    assert v.good.equals(small_expected())
    nd = tmp_path / "a.ndjson"
    nd.write_bytes((DATA / "attempts_small.jsonl").read_bytes())
    assert validate(read_attempts_file(nd), CATALOG, origin="nd").good.equals(small_expected())


def test_parquet_and_gzipped_csv_read_like_csv(tmp_path: Path) -> None:
    typed = small_expected()
    pq.write_table(typed, tmp_path / "a.parquet")
    pq.write_table(typed, tmp_path / "a.pq")
    with gzip.open(tmp_path / "a.csv.gz", "wb") as f:
        f.write((DATA / "attempts_small.csv").read_bytes())
    for name in ("a.parquet", "a.pq", "a.csv.gz"):
        table = read_attempts_file(tmp_path / name)
        assert validate(table, CATALOG, origin=name).good.equals(typed), name


def test_parquet_with_loose_types(tmp_path: Path) -> None:
    rows = pa.table({
        "attempt_id": ["p1", "p2", "p3"], "family_id": [1, 2, 3], "model_type": ["m"] * 3,
        "submitted_at": pa.array([datetime(2024, 5, 1, 12)] * 3, pa.timestamp("ms")),
        "hardware": ["H100-SXM"] * 3, "trainer_count": [2.0, 2.5, float("nan")],
        "batch_size": pa.array([64, 64, 64], pa.int32()), "status": ["succeeded"] * 3,
        "throughput": [10, 20, 30],
    })
    pq.write_table(rows, tmp_path / "loose.parquet")
    v = validate(read_attempts_file(tmp_path / "loose.parquet"), CATALOG, origin="p")
    assert v.good.to_pydict()["family_id"] == ["1"]
    assert v.good.to_pydict()["submitted_at"] == [datetime(2024, 5, 1, 12, tzinfo=UTC)]
    assert v.good.to_pydict()["throughput"] == [10.0]
    assert v.reasons == {"ill-typed field 'trainer_count': expected an integer": 2}


def test_file_format_by_name() -> None:
    assert [file_format(Path(n)) for n in ("A.CSV", "a.csv.gz", "a.pq", "a.ndjson.gz")] == [
        "csv", "csv", "parquet", "jsonl"]
    with pytest.raises(DataError, match=r"a\.xlsx: unsupported file type; name it \.csv"):
        file_format(Path("a.xlsx"))


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.csv", None, r"missing\.csv: no such file"),
    ("junk.parquet", b"attempt_id,status\n1,2\n", r"junk\.parquet: cannot read as Parquet"),
    ("empty.csv", b"", r"empty\.csv: cannot read as CSV: Empty CSV file"),
    ("ragged.csv", b"attempt_id,family_id,model_type,submitted_at,hardware,trainer_count,"
     b"batch_size,status,throughput\na,f,m,2024-05-01,T4,1,1,failed,\nb,f\n",
     r"ragged\.csv: 1 malformed CSV line\(s\) with the wrong number of fields: line 3 has 2 "
     r"fields, the header 9"),
    ("broken.jsonl", b'{"attempt_id": "a"}\n{"attempt_id": \n',
     r"broken\.jsonl: cannot read as JSON Lines: .*[Mm]alformed JSON"),
    ("twice.csv", b"attempt_id,status,status\n", r"twice\.csv: column 'status' appears more "
     r"than once; keep one"),
    ("binary.parquet", bytes(range(256)) * 4, r"binary\.parquet: cannot read as Parquet"),
])
def test_unreadable_inputs_are_one_clear_error(tmp_path: Path, name: str,
                                               content: bytes | None, message: str) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_attempts_file(tmp_path / name)


def test_missing_required_column_names_file_columns_and_likely_fix() -> None:
    with pytest.raises(DataError, match=r"attempts_missing_column\.csv: missing required "
                                        r"column\(s\) 'status'; for 'status' did you mean "
                                        r"'statuss'\?; an attempts file needs attempt_id, "):
        read_attempts_file(DATA / "attempts_missing_column.csv")


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(DataError, match=r"dir\.csv: not a file"):
        read_attempts_file(tmp_path / "dir.csv")


def test_header_only_csv_is_zero_rows(tmp_path: Path) -> None:
    (tmp_path / "h.csv").write_text(csv_text([]))
    v = validate(read_attempts_file(tmp_path / "h.csv"), CATALOG, origin="h")
    assert (v.good.num_rows, v.quarantined.num_rows) == (0, 0)


# Ingest into a store ----------------------------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "leap.duckdb")
    yield s
    s.close()


def test_reingest_adds_nothing_anywhere(store: Store) -> None:
    paths = [DATA / "attempts_small.csv", DATA / "attempts_bad.csv"]
    first = ingest_files(store, paths, CATALOG)
    assert [(r.rows_read, r.added, r.already_stored, r.quarantined) for r in first] == [
        (12, 12, 0, 0), (8, 2, 0, 6)]
    assert first[1].unknown_columns == ["cluster"]
    counts = (store.count(), store.quarantine_count())
    again = ingest_files(store, paths, CATALOG)
    assert [r.quarantined for r in again] == [0, 6]  # still counted, not stored twice
    assert [(r.added, r.already_stored) for r in again] == [(0, 12), (0, 2)]
    assert (store.count(), store.quarantine_count()) == counts == (14, 6)
    assert len({r.batch_id for r in first}) == 1  # one call, one batch


def test_same_ids_in_another_file_of_the_same_call_count_as_already_stored(
        store: Store) -> None:
    reports = ingest_files(store, [DATA / "attempts_small.csv", DATA / "attempts_small.jsonl"],
                           CATALOG)
    assert [(r.added, r.already_stored) for r in reports] == [(12, 0), (0, 12)]
    assert store.count() == 12


def test_a_bad_file_anywhere_aborts_the_whole_call(store: Store) -> None:
    ingest_files(store, [DATA / "attempts_bad.csv"], CATALOG)
    before = (store.count(), store.quarantine_count(), store.stats()["batches"])
    seen: list[str] = []
    with pytest.raises(DataError, match="missing required column"):
        ingest_files(store, [DATA / "attempts_small.csv", DATA / "attempts_missing_column.csv"],
                     CATALOG, progress=seen.append)
    assert (store.count(), store.quarantine_count(), store.stats()["batches"]) == before
    assert not any(m.startswith("writing") for m in seen)
    with pytest.raises(DataError, match=r"nope\.csv: no such file"):
        check_files([DATA / "attempts_small.csv", DATA / "nope.csv"], CATALOG,
                    progress=seen.append)


def test_ingest_table_from_arrow_keeps_a_typed_table_exactly(store: Store) -> None:
    typed = small_expected()
    report = ingest_table(store, typed, CATALOG, origin="simulate seed=1")
    assert (report.source, report.rows_read, report.added) == ("simulate seed=1", 12, 12)
    assert store.attempts().sort_by("attempt_id").equals(typed.sort_by("attempt_id"))


def test_user_catalog_makes_a_new_hardware_name_valid(tmp_path: Path) -> None:
    toml = tmp_path / "catalog.toml"
    spec = {k: v for k, v in CATALOG["H100-SXM"].__dict__.items()}
    spec["name"] = "H100-internal"
    lines = ["[[hardware]]"] + [f"{k} = {json.dumps(v)}" for k, v in spec.items()]
    toml.write_text("\n".join(lines) + "\n")
    rows = [{**BASE, "hardware": "H100-internal"}]
    (tmp_path / "in.csv").write_text(csv_text(rows))
    table = read_attempts_file(tmp_path / "in.csv")
    assert validate(table, CATALOG, origin="x").quarantined.num_rows == 1
    assert validate(table, Catalog.load(toml), origin="x").good.num_rows == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(BAD_CASES)), st.integers(0, 5)), max_size=30))
def test_every_row_is_either_kept_or_quarantined(picks: list[tuple[int, int]]) -> None:
    rows = []
    for case, ident in picks:  # case == len(BAD_CASES) means a valid row
        change = BAD_CASES[case][0] if case < len(BAD_CASES) else {}
        rows.append({**BASE, "attempt_id": f"id{ident}", **change})
    table = pacsv.read_csv(io.BytesIO(csv_text(rows).encode()), convert_options=(
        pacsv.ConvertOptions(column_types=dict.fromkeys(BASE, pa.string()))))
    v = validate(table, CATALOG, origin="prop")
    assert v.good.num_rows + v.quarantined.num_rows == len(rows)
    ids = v.good.column("attempt_id").to_pylist()
    assert len(ids) == len(set(ids))
    numbers = v.quarantined.column("row_number").to_pylist()
    assert len(set(numbers)) == len(numbers) and all(1 <= n <= len(rows) for n in numbers)
    assert sum(v.reasons.values()) == v.quarantined.num_rows


KILL_SCRIPT = """
import sys, time
from pathlib import Path
from leap.catalog import Catalog
from leap.data.ingest import ingest_files
from leap.data.store import Store

def progress(msg):
    # Stop inside the transaction, after the big first file is written, before the commit.
    if msg.startswith("writing") and "(2/2)" in msg:
        print("mid-transaction", flush=True)
        time.sleep(120)

with Store(Path(sys.argv[1])) as store:
    ingest_files(store, [Path(p) for p in sys.argv[2:]], Catalog.default(), progress)
"""


def test_sigkill_during_ingest_leaves_store_as_before(tmp_path: Path) -> None:
    big = tmp_path / "big.parquet"
    n = 130_000  # over one DuckDB row group (122,880): written to the file pre-commit
    pq.write_table(pa.table({
        "attempt_id": np.char.add("k", np.arange(n).astype(str)), "family_id": ["f"] * n,
        "model_type": ["m"] * n,
        "submitted_at": pa.array(np.full(n, np.datetime64("2024-06-01T00:00", "us")),
                                 pa.timestamp("us", tz="UTC")),
        "hardware": ["T4"] * n, "trainer_count": np.ones(n, np.int64),
        "batch_size": np.full(n, 32), "status": ["succeeded"] * n, "throughput": np.ones(n)}),
        big)
    path = tmp_path / "leap.duckdb"
    with Store(path) as s:
        ingest_files(s, [DATA / "attempts_small.csv"], CATALOG)
        before = (s.count(), s.quarantine_count(), s.stats())
    size_before = path.stat().st_size
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(path), str(big), str(DATA / "attempts_bad.csv")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "mid-transaction", proc.stderr.read() if proc.stderr else ""
        assert path.stat().st_size > size_before  # rows of big.parquet are in the file
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    with Store(path, read_only=True) as s:
        after = (s.count(), s.quarantine_count(), s.stats())
    assert after == before
    with Store(path) as s:  # the next ingest works and adds the whole batch
        reports = ingest_files(s, [big], CATALOG)
        assert reports[0].added == n


def test_bench_generator_matches_validation() -> None:
    """The benchmark's ~1% invalid rows are exactly what validation quarantines."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        from bench_ingest import make_table
    finally:
        sys.path.remove(str(bench))
    table, n_bad = make_table(5_000, seed=3)
    v = validate(table, CATALOG, origin="bench")
    assert v.good.num_rows + v.quarantined.num_rows == 5_000
    assert 0.8 * n_bad <= v.quarantined.num_rows <= n_bad
    prefixes = ("unknown hardware 'H10O'", "trainer_count must be >= 1",
                "unknown status 'sucess'; did you mean 'succeeded'?",
                "duplicate attempt_id within the input",
                "throughput must be a finite number > 0 on a succeeded attempt")
    assert all(r.startswith(prefixes) for r in v.reasons)
    assert len(v.reasons) == len(prefixes)
