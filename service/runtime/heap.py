"""What the C library's allocator (glibc's malloc) is told that Python cannot tell it: give the heap
a build freed back to the system (`release_freed`). No library of Python's does it; where the C
library is not glibc (musl, macOS) the allocator is left as it is. Measured in docs/benchmarks.md,
"A worker's memory"."""

from __future__ import annotations

import ctypes
from contextlib import suppress


def _glibc() -> ctypes.CDLL | None:
    with suppress(OSError):
        return ctypes.CDLL("libc.so.6")
    return None


def release_freed() -> None:
    """Return the freed heap to the system (`malloc_trim`): glibc keeps freed memory in its arenas,
    and after the first large array is freed its dynamic mmap threshold sends arrays up to 32 MiB
    there too, so a process that built something large and dropped it kept its pages. Of a thread's
    arena glibc returns the free pages inside it, not its top: a build on the follower's thread keeps
    part (20,000 faces: 60 -> 39 MiB kept; on the main thread 48 -> 1)."""
    libc = _glibc()
    if libc is not None:
        with suppress(AttributeError):
            libc.malloc_trim(0)
