"""Work kept on disk from one nightly run to the next.

Consecutive nights repeat most of their work: their windows share all but one day, and the
pair models of the weekly refit days. :class:`DiskCache` keeps such work in a folder per
entry, named by a digest of everything that made it (the caller's :func:`digest` of its
inputs, with :func:`source_digest` among them, so another leap version never reads an older
one's entry). What the next night can read is exactly what this night read or wrote, so a
night ends by removing every other entry (:meth:`DiskCache.prune`). An entry is written to a
temporary folder and renamed into place, and one that does not load is removed and made
again: deleting the whole folder is always safe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from leap.errors import ArtifactError

T = TypeVar("T")


class DiskCache:
    """Entries in ``directory``, one folder each (see the module docstring); ``used``: the
    keys this object asked for or wrote; of them ``found``, those it read an entry of, and
    ``made``, those it wrote one of."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.used: set[str] = set()
        self.found: set[str] = set()
        self.made: set[str] = set()

    def read(self, key: str, load: Callable[[Path], T | None]) -> T | None:
        """``load(folder)`` of the entry ``key``; ``None`` when there is none or it does not
        load (it is then removed, to be written again)."""
        self.used.add(key)
        entry = self.directory / key
        if not entry.is_dir():
            return None
        try:
            value = load(entry)
        except (ArtifactError, OSError, ValueError, KeyError):
            shutil.rmtree(entry, ignore_errors=True)
            return None
        self.found.add(key)
        return value

    def has(self, key: str) -> bool:
        """Whether an entry ``key`` is kept (not counted as used: :meth:`read` it to use it)."""
        return (self.directory / key).is_dir()

    def write(self, key: str, save: Callable[[Path], object]) -> None:
        """Keep what ``save(folder)`` writes as the entry ``key`` (a concurrent writer's
        entry for the same key, made of the same inputs, is left as it is; a disk that
        refuses leaves no entry)."""
        self.used.add(key)
        # Named by process and thread: two Dask tasks may write one entry at once.
        tmp = self.directory / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            save(tmp)
            os.rename(tmp, self.directory / key)
            self.made.add(key)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)

    def prune(self) -> int:
        """Remove every entry this object neither read nor wrote (and any left
        half-written); returns how many."""
        if not self.directory.is_dir():
            return 0
        stale = [e for e in self.directory.iterdir() if e.name not in self.used]
        for entry in stale:
            shutil.rmtree(entry, ignore_errors=True)
        return len(stale)


def digest(parts: object, *blobs: bytes) -> str:
    """A key: the SHA-256 of ``parts`` (as JSON) and then ``blobs``, in hex (32 digits)."""
    h = hashlib.sha256(json.dumps(parts).encode())
    for blob in blobs:
        h.update(blob)
    return h.hexdigest()[:32]


@functools.cache
def source_digest() -> str:
    """A digest of leap's source (every ``.py`` and ``.pyx`` file of the package): any
    change of code starts every cache afresh."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.pyx")]):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()
