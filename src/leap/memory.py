"""Freed memory handed back to the operating system, where the allocators keep it.

Two allocators hold on to what training frees. glibc keeps what a thread frees in that
thread's own heap, and arrays of a few MB come from those heaps once larger ones were freed:
after a window's days were encoded on two threads, a fleet four times the default held
several hundred MB of free heap through the fit. Arrow's pool keeps the buffers of the
columns ``to_pandas`` copied out, and of a frame of attempts let go.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pyarrow as pa

_MALLOC_TRIM: Callable[[int], int] | None
try:  # glibc's; elsewhere there is nothing to trim
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):
    _MALLOC_TRIM = None


def release_free_memory() -> None:
    """Hand the free pages of Arrow's memory pool and of the C heap back to the operating
    system (a few milliseconds; the C heap's only with glibc's ``malloc_trim``)."""
    pa.default_memory_pool().release_unused()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
