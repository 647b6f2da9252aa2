"""Micro-batching: the faces of concurrent requests go to the embedder in one run.

A single thread owns the embedder. It takes the first waiting job, then keeps collecting jobs
until the batch is full or `max_wait_ms` has passed, runs the model once and hands each job its
rows. Callers get a `concurrent.futures.Future`, which asyncio code awaits without blocking.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from service.metrics import Metrics


@dataclass
class _Job:
    crops: np.ndarray
    future: Future = field(default_factory=Future)
    queued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    def __init__(self, embed: Callable[[np.ndarray], np.ndarray], max_batch: int, max_wait_ms: float, metrics: Metrics):
        self._embed = embed
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self._metrics = metrics
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="facegate-batcher", daemon=True)
        self._thread.start()

    def submit(self, crops: np.ndarray) -> Future:
        """N×H×W×3 RGB crops → a future of their N×D embeddings."""
        job = _Job(np.asarray(crops))
        self._jobs.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        jobs, size = [first], len(first.crops)
        deadline = time.perf_counter() + self.max_wait
        while size < self.max_batch:
            remaining = deadline - time.perf_counter()
            try:
                job = self._jobs.get(timeout=remaining) if remaining > 0 else self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            size += len(job.crops)
        return jobs, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._jobs.get()
            if first is None:
                return
            jobs, stop = self._collect(first)
            started = time.perf_counter()
            for job in jobs:
                self._metrics.queue_wait.observe(started - job.queued)
            try:
                embeddings = self._embed(np.concatenate([j.crops for j in jobs]))
            except BaseException as exc:  # handed to every waiting request, never lost in this thread
                for job in jobs:
                    job.future.set_exception(exc)
                continue
            self._metrics.embedder_ran(len(embeddings))
            start = 0
            for job in jobs:
                job.future.set_result(embeddings[start : start + len(job.crops)])
                start += len(job.crops)
