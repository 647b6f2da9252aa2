"""Fixed batch shapes and micro-batching.

A model runs only at a few batch sizes (`BatchShapes`): a batch is padded up to the next size and
one above the largest is split. Every shape a session will ever see is then known at start-up and
warmed there, so no request pays for a provider's per-shape work (cuDNN's algorithm search, memory
allocation, a TensorRT engine build).

Micro-batching: a single thread owns a model. It takes the first waiting job, then keeps collecting
jobs until the batch is full or `max_wait_ms` has passed, runs the model once and hands each job
its rows. Callers get a `concurrent.futures.Future`, which asyncio code awaits without blocking.
"""

from __future__ import annotations

import bisect
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from service.metrics import Metrics


class BatchShapes:
    """The batch sizes a model is run at, smallest first."""

    def __init__(self, sizes: Iterable[int]):
        self.sizes = tuple(sorted(set(sizes)))
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {sizes!r}")

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def bucket(self, n: int) -> int:
        """The smallest size holding n rows (n ≤ largest)."""
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def run(self, fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
        """fn over x's rows, fn only ever called with a bucket's number of rows: zero rows pad a
        chunk up to its bucket and their outputs are dropped (models here treat rows independently).
        No rows: fn decides (the embedder answers without running its session)."""
        if not len(x):
            return fn(x)
        out = []
        for start in range(0, len(x), self.largest):
            chunk = x[start : start + self.largest]
            size = self.bucket(len(chunk))
            if size > len(chunk):
                chunk = np.concatenate([chunk, np.zeros((size - len(chunk), *chunk.shape[1:]), chunk.dtype)])
            out.append(fn(chunk)[: min(len(x) - start, self.largest)])
        return np.concatenate(out)


@dataclass
class _Job:
    rows: np.ndarray
    future: Future = field(default_factory=Future)
    queued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    def __init__(
        self,
        run: Callable[[np.ndarray], np.ndarray],
        max_batch: int,
        max_wait_ms: float,
        metrics: Metrics,
        role: str = "embedder",
    ):
        """`run`: N input rows → N output rows (the caller makes it run at fixed shapes).
        `role`: embedder or detector, the metrics it counts under."""
        self._run_model = run
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.role = role
        self._metrics = metrics
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"facegate-batcher-{role}", daemon=True)
        self._thread.start()

    def submit(self, rows: np.ndarray) -> Future:
        """N input rows (N×H×W×3 crops, or images) → a future of their N output rows."""
        job = _Job(np.asarray(rows))
        self._jobs.put(job)
        return job.future

    def close(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        jobs, size = [first], len(first.rows)
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
            size += len(job.rows)
        return jobs, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._jobs.get()
            if first is None:
                return
            jobs, stop = self._collect(first)
            # A request whose task was cancelled cancels its Future (asyncio.wrap_future): its rows are
            # dropped here. The others become running, which no cancel can undo: setting a cancelled
            # Future's result raises, and that ended this thread, leaving every later job waiting forever.
            jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if jobs:
                self._run_batch(jobs)

    def _run_batch(self, jobs: list[_Job]) -> None:
        started = time.perf_counter()
        try:
            for job in jobs:
                self._metrics.waited(self.role, started - job.queued)
            outputs = self._run_model(np.concatenate([j.rows for j in jobs]))
            self._metrics.model_ran(self.role, len(outputs))
        except BaseException as exc:  # handed to every waiting request, never lost in this thread
            for job in jobs:
                job.future.set_exception(exc)
            return
        start = 0
        for job in jobs:
            job.future.set_result(outputs[start : start + len(job.rows)])
            start += len(job.rows)
