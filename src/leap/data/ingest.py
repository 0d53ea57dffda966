"""Read attempt files (CSV, Parquet, JSON Lines), validate each row with a reason, store them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from leap.catalog import Catalog
from leap.data.readers import (
    FORMATS,
    check_columns,
    check_text_file,
    file_format,
    printable,
    read_attempts_file,
)
from leap.data.store import Store
from leap.data.validate import (
    COUNT_COLUMNS,
    OPTIONAL_MINIMUM,
    IngestLimits,
    Validated,
    validate,
)
from leap.errors import DataError

__all__ = [
    "COUNT_COLUMNS", "FORMATS", "OPTIONAL_MINIMUM", "CheckedFile", "IngestLimits",
    "IngestReport", "Validated", "check_columns", "check_files", "check_text_file",
    "expand_inputs", "file_format", "ingest_files", "ingest_table", "new_files", "printable",
    "read_attempts_file", "store_checked", "validate",
]


# Ingest -----------------------------------------------------------------------------------
@dataclass
class IngestReport:
    """What ingesting one input did. ``rows_read = added + already_stored + quarantined``."""

    source: str
    rows_read: int
    added: int
    already_stored: int
    quarantined: int
    unknown_columns: list[str] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    batch_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _report(origin: str, rows: int, v: Validated, r: Any) -> IngestReport:
    return IngestReport(source=origin, rows_read=rows, added=r.added,
                        already_stored=r.already_stored, quarantined=r.quarantined,
                        unknown_columns=list(v.unknown_columns), reasons=dict(v.reasons),
                        batch_id=r.batch_id)


def ingest_table(store: Store, table: pa.Table, catalog: Catalog, *, origin: str,
                 limits: IngestLimits | None = None) -> IngestReport:
    """Validate ``table`` and add it to ``store`` as one atomic batch.

    Parameters
    ----------
    store : Store
        Open for writing.
    table : pyarrow.Table
        Attempt rows (see :func:`validate`).
    catalog : Catalog
        Known hardware.
    origin : str
        Recorded as the batch's source, e.g. ``"simulate seed=1"``.
    limits : IngestLimits, optional
        Plausibility rules (see :func:`validate`).

    Returns
    -------
    IngestReport

    Examples
    --------
    >>> import tempfile
    >>> from leap.catalog import Catalog
    >>> rows = pa.table({"attempt_id": ["a1"], "family_id": ["f"], "model_type": ["m"],
    ...     "submitted_at": ["2024-05-01T12:00:00Z"], "hardware": ["H100-SXM"],
    ...     "trainer_count": [2], "batch_size": [64], "status": ["succeeded"],
    ...     "throughput": [1500.5]})
    >>> with Store(Path(tempfile.mkdtemp()) / "s.duckdb") as store:
    ...     ingest_table(store, rows, Catalog.default(), origin="doc").added
    1
    """
    v = validate(table, catalog, origin=origin, limits=limits)
    r = store.add_batch(v.good, v.quarantined, source=origin)
    return _report(origin, table.num_rows, v, r)


@dataclass
class CheckedFile:
    """One input file, read and validated, not yet stored (see :func:`check_files`)."""

    origin: str
    rows_read: int
    validated: Validated
    size_bytes: int | None = None
    mtime_ns: int | None = None


_GLOB_CHARS = frozenset("*?[")


def expand_inputs(inputs: Sequence[Path | str]) -> list[Path]:
    """Files named by ``inputs``: files as given, directories searched recursively for
    attempt files (e.g. a Hive-partitioned export ``attempts/date=2026-01-12/part-0.parquet``),
    and glob patterns (``exports/**/*.parquet``) expanded; sorted within each input, each file
    once.

    Raises
    ------
    DataError
        For a directory with no attempt file or a pattern that matches nothing.

    Examples
    --------
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / "date=2026-01-02").mkdir(); (d / "date=2026-01-01").mkdir()
    >>> for day in ("01", "02"):
    ...     _ = (d / f"date=2026-01-{day}" / "part-0.parquet").write_bytes(b"")
    >>> [p.parent.name for p in expand_inputs([d])]
    ['date=2026-01-01', 'date=2026-01-02']
    """
    import glob

    out: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and not any(part.startswith((".", "_")) for part in
                                       p.relative_to(path).parts)
                           and _known_format(p))
            if not found:
                raise DataError(f"{path}: no attempt files (.parquet, .csv, .jsonl ...) in this "
                                "directory or below")
            out += found
        elif not path.exists() and _GLOB_CHARS & set(str(item)):
            found = sorted(Path(p) for p in glob.glob(str(item), recursive=True)
                           if Path(p).is_file())
            if not found:
                raise DataError(f"{item}: no file matches this pattern")
            out += found
        else:
            out.append(path)
    return list(dict.fromkeys(out))


def _known_format(path: Path) -> bool:
    try:
        file_format(path)
    except DataError:
        return False
    return True


def new_files(store: Store, paths: Sequence[Path]) -> list[Path]:
    """The files of ``paths`` not ingested before with their current size and modification
    time (what ``leap ingest --incremental`` reads)."""
    seen = store.ingested_files()
    out = []
    for p in paths:
        st = Path(p).stat()
        if seen.get(str(Path(p).resolve())) != (st.st_size, st.st_mtime_ns):
            out.append(p)
    return out


def check_files(paths: Sequence[Path], catalog: Catalog,
                progress: Callable[[str], None] | None = None,
                limits: IngestLimits | None = None) -> list[CheckedFile]:
    """Read and validate every file, writing nothing (the first half of :func:`ingest_files`).

    Raises
    ------
    DataError
        For the first unreadable or malformed file.
    """
    say = progress or (lambda _msg: None)
    for path in paths:  # cheap checks first: a typo in the last name fails before any reading
        file_format(Path(path))
        if not Path(path).is_file():
            raise DataError(f"{path}: no such file")
    checked: list[CheckedFile] = []
    for path in paths:
        say(f"reading {path}")
        st = Path(path).stat()  # before reading: a file rewritten meanwhile is read again
        table = read_attempts_file(Path(path))
        origin = str(Path(path).resolve())
        v = validate(table, catalog, origin=origin, limits=limits)
        say(f"validated {path}: {table.num_rows:,} rows, {v.quarantined.num_rows:,} "
            "quarantined")
        checked.append(CheckedFile(origin, table.num_rows, v, st.st_size, st.st_mtime_ns))
    return checked


def store_checked(store: Store, checked: Sequence[CheckedFile],
                  progress: Callable[[str], None] | None = None) -> list[IngestReport]:
    """Add files from :func:`check_files` to ``store`` in ONE transaction (all or nothing)."""
    say = progress or (lambda _msg: None)
    reports: list[IngestReport] = []
    with store.batch() as batch:
        for i, c in enumerate(checked, 1):
            say(f"writing {c.origin} ({i}/{len(checked)})")
            r = batch.add(c.validated.good, c.validated.quarantined, source=c.origin)
            if c.size_bytes is not None and c.mtime_ns is not None:
                batch.record_file(c.origin, c.size_bytes, c.mtime_ns, c.rows_read)
            reports.append(_report(c.origin, c.rows_read, c.validated, r))
        say("committing")
    say("committed")
    return reports


def ingest_files(store: Store, paths: Sequence[Path], catalog: Catalog,
                 progress: Callable[[str], None] | None = None,
                 limits: IngestLimits | None = None) -> list[IngestReport]:
    """Ingest files as ONE atomic batch: all of them are stored, or none.

    Every file is read and validated first, so an unreadable file or missing column
    anywhere aborts before anything is written; then one transaction adds them in order
    (an ``attempt_id`` seen in an earlier file counts as already stored).

    Parameters
    ----------
    store : Store
        Open for writing.
    paths : sequence of Path
        Files to ingest (see :func:`read_attempts_file`).
    catalog : Catalog
        Known hardware.
    progress : callable, optional
        Called with a short line at each step (read, validated, writing, committed).
    limits : IngestLimits, optional
        Plausibility rules (see :func:`validate`); pass ``now`` to refuse future times.

    Returns
    -------
    list of IngestReport
        One per path, in order.

    Raises
    ------
    DataError
        For the first unreadable or malformed file; the store is untouched.

    Examples
    --------
    >>> import tempfile
    >>> from leap.catalog import Catalog
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a.csv").write_text(
    ...     "attempt_id,family_id,model_type,submitted_at,hardware,trainer_count,batch_size,"
    ...     "status,throughput\\na1,f,m,2024-05-01T12:00:00Z,H100-SXM,1,32,failed,\\n")
    >>> with Store(d / "s.duckdb") as store:
    ...     [r.added for r in ingest_files(store, [d / "a.csv", d / "a.csv"], Catalog.default())]
    [1, 0]
    """
    return store_checked(store, check_files(paths, catalog, progress, limits), progress)
