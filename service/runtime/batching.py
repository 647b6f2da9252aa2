"""Micro-batching: a single thread owns a model. It takes the first waiting job, then keeps collecting
jobs until the batch is full or `max_wait_ms` has passed, runs the model once and hands each job
its rows. Callers get a `concurrent.futures.Future`, which asyncio code awaits without blocking.
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
    rows: np.ndarray
    counted: bool = True  # in the metrics (a warm-up's runs are not)
    future: Future = field(default_factory=Future)
    queued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    def __init__(
        self,
        run: Callable[[np.ndarray], np.ndarray | list[np.ndarray]],
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

    def submit(self, rows: np.ndarray, counted: bool = True) -> Future:
        """N input rows (N×H×W×3 crops, or images) → a future of their N output rows. `counted`:
        False for a warm-up's runs, which the metrics leave out."""
        job = _Job(np.asarray(rows), counted)
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
                if job.counted:
                    self._metrics.waited(self.role, started - job.queued)
            # One job (no concurrent work: a CPU host at low load) runs on its own rows, not on a
            # copy: for the model host these are the worker's rows in shared memory, read in place.
            outputs = self._run_model(jobs[0].rows if len(jobs) == 1 else np.concatenate([j.rows for j in jobs]))
            if any(job.counted for job in jobs):
                self._metrics.model_ran(self.role, len(outputs))
        except BaseException as exc:  # handed to every waiting request, never lost in this thread
            for job in jobs:
                job.future.set_exception(exc)
            return
        start = 0
        for job in jobs:
            job.future.set_result(outputs[start : start + len(job.rows)])
            start += len(job.rows)
