"""Gallery counts and replication status for /readyz and /metrics, which must answer during a
database outage and on a gallery whose count takes seconds: one read at a time runs on its own
thread, a caller waits for it at most `wait` seconds and otherwise gets the last values read (None
before the first). A read that finishes after its caller gave up is kept, never thrown away: the next
caller gets it. The values are stale when the last read failed, or when the read under way has taken
longer than twice the last good one (a slow database that answers as usual is not an outage)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from service.core.errors import FacegateError
from service.gallery.interface import GalleryStore


@dataclass(frozen=True)
class Snapshot:
    counts: dict[str, int] | None
    replication: dict | None
    index: dict | None  # the vector index: backend, parameters, size
    fresh: bool  # False: the database did not answer as it usually does (the values are the last known)
    read_at: float | None  # time.time() of the values, None when never read


@dataclass(frozen=True)
class _Read:
    counts: dict[str, int]
    replication: dict | None
    index: dict | None
    read_at: float
    took: float  # seconds the read took


class GalleryStats:
    def __init__(self, gallery: GalleryStore, wait: float = 0.25):
        self.gallery, self.wait = gallery, wait
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="facegate-gallery-stats")
        self._pending: Future[_Read] | None = None
        self._started = 0.0  # time.monotonic() when the pending read started
        self._last: _Read | None = None  # the last good read (set on the reading thread: one assignment)
        self._failed = False  # the last read that finished raised

    def _read(self) -> _Read:
        start = time.monotonic()
        index = self.gallery.index_info()
        # the index's size read once: Milvus counts with a query, which /readyz must not run twice
        counts = self.gallery.counts(searchable=index["size"] if index is not None else None)
        return _Read(counts, self.gallery.replication(), index, time.time(), time.monotonic() - start)

    def _keep(self, future: Future[_Read]) -> None:
        """Done callback: a late result is the last known one, whoever waited for it."""
        if future.cancelled():
            return
        if future.exception() is None:
            self._last, self._failed = future.result(), False
        else:
            self._failed = True

    def _snapshot(self, fresh: bool) -> Snapshot:
        last = self._last
        if last is None:
            return Snapshot(None, None, None, False, None)
        return Snapshot(last.counts, last.replication, last.index, fresh, last.read_at)

    async def snapshot(self) -> Snapshot:
        if self._pending is None or self._pending.done():  # the event loop is one thread: no race here
            self._started = time.monotonic()
            self._pending = self._executor.submit(self._read)
            self._pending.add_done_callback(self._keep)
        try:
            read = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._pending)), self.wait)
            return Snapshot(read.counts, read.replication, read.index, True, read.read_at)
        except asyncio.TimeoutError:
            last = self._last
            usual = last is not None and not self._failed and time.monotonic() - self._started <= 2 * last.took
            return self._snapshot(usual)
        except FacegateError:
            return self._snapshot(False)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
