"""Gallery counts and replication status for /readyz and /metrics, which must answer during a
database outage: one read at a time runs on its own thread, a caller waits for it at most `wait`
seconds, and otherwise gets the last values read (None before the first), marked stale."""

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
    fresh: bool  # read just now; False: the database did not answer in time (the values are the last known)
    read_at: float | None  # time.time() of the values, None when never read


class GalleryStats:
    def __init__(self, gallery: GalleryStore, wait: float = 0.25):
        self.gallery, self.wait = gallery, wait
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="facegate-gallery-stats")
        self._pending: Future | None = None
        self._last: tuple[dict | None, dict | None, dict | None, float | None] = (None, None, None, None)

    def _read(self) -> tuple[dict, dict | None, dict | None, float]:
        return self.gallery.counts(), self.gallery.replication(), self.gallery.index_info(), time.time()

    async def snapshot(self) -> Snapshot:
        if self._pending is None or self._pending.done():  # the event loop is one thread: no race here
            self._pending = self._executor.submit(self._read)
        try:
            self._last = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._pending)), self.wait)
            return Snapshot(*self._last[:3], True, self._last[3])
        except (asyncio.TimeoutError, FacegateError):
            return Snapshot(*self._last[:3], False, self._last[3])

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
