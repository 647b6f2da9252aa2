"""What the C library's allocator (glibc's malloc) is told that Python cannot tell it: give the heap
a build freed back to the system (`release_freed`), and keep a process's threads to few arenas
(`fewer_arenas`). No library of Python's does either; where the C library is not glibc (musl,
macOS) the allocator is left as it is. Measured in docs/benchmarks.md, "A worker's memory"."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from contextlib import suppress

log = logging.getLogger("facegate.heap")
M_ARENA_MAX = -8  # glibc's malloc.h
QUIET = 30.0  # FACEGATE_IDLE_TRIM_SECONDS' default: a request after a trim pays its page faults again (about 10 ms of a
# 60 ms /verify), so not one of a steady trickle


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


def fewer_arenas(most: int = 2) -> None:
    """At most `most` malloc arenas for the threads this process starts from now on (MALLOC_ARENA_MAX,
    set from inside: call it before the threads start). glibc gives each new thread an arena of its
    own, up to 8 per core, each keeping its freed pages: the model host's threads (a connection per
    worker, the batchers, onnxruntime's pools) held 30-43 MiB more (2,000 faces, paired: 349-351 -> 308-321 MiB),
    for no measured speed (a paired run of the models in 4 threads: CPU 1.00x, docs/benchmarks.md)."""
    libc = _glibc()
    if libc is not None:
        with suppress(AttributeError):
            libc.mallopt(M_ARENA_MAX, most)


def fewer_arenas_here_and_in_children(most: int = 2) -> None:
    """`fewer_arenas` for this process and, through MALLOC_ARENA_MAX (read by glibc as a process
    starts), the processes it starts: where the models run inside the HTTP processes (no model host),
    their threads took an arena each there too (one process at 20,000 faces: 445 -> 373 MiB PSS, the
    same req/s, docs/benchmarks.md). Under a model host the HTTP processes run no model: one arena there
    (`most` 1), whose top the idle trim can give back, as it cannot a thread arena's (`--workers 3`, 100
    MiB held by the last burst: 586 -> 560 MiB with the trim, the same req/s). A MALLOC_ARENA_MAX the
    operator set is left as it is."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    fewer_arenas(most)
    os.environ["MALLOC_ARENA_MAX"] = str(most)


class IdleTrim:
    """Gives back the heap a burst of work freed (`release_freed`) once the work stops for `quiet`
    seconds. glibc keeps a freed image in its heap (its trim threshold follows the largest block freed:
    twice a 1.7-megapixel photo's 4.9 MiB): at rest after 30 /verify, the processes of `--workers 3` held 90 MiB
    of the last burst's images and model buffers (675 -> 583 MiB, the model host 238 -> 168). A fixed
    mmap threshold gives each back as it is freed, and cost 15-20 % of the req/s in page faults; this
    trims once, when idle, and never while work goes on. `quiet` 0: never."""

    def __init__(self, quiet: float = QUIET):
        self.quiet = quiet
        self.work = 0  # bumped by each piece of work (a lost update only delays a trim)
        self.also: list[Callable[[], None]] = []  # what else is given back at the same moments (the spare decoders)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def note(self) -> None:
        self.work += 1

    def start(self) -> None:
        if not self.quiet:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="facegate-idle-trim", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        seen = trimmed = self.work
        while not self._stop.wait(self.quiet):
            now = self.work
            if now == seen != trimmed:  # work happened, then none for a whole period
                for give_back in self.also:
                    try:
                        give_back()
                    except Exception:  # one that failed (closing as the app stops) leaves the trim running
                        log.exception("giving back idle memory failed")
                release_freed()
                trimmed = now
            seen = now
