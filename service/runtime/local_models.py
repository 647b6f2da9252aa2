"""The two models run in this process: through a micro-batcher each (one per detector input size),
or on the engine's thread pool when batching is off; warmed up once at every shape they will see.
`Engine` runs them through this, or through `service.runtime.hosted_models` when a model host runs them
for several worker processes (which runs this in its own process)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial

import numpy as np

from service.core.pipeline import FacePipeline
from service.core.settings import Settings
from service.metrics import Metrics
from service.runtime.batching import MicroBatcher

log = logging.getLogger("facegate.engine")


def first_row(rows: Future) -> Future:
    """A future of the first of `rows`' rows (a batcher answers a job with all of its rows);
    cancelling it cancels the job, so a batcher drops the rows of a request that went away."""
    row: Future = Future()
    row.add_done_callback(lambda r: rows.cancel() if r.cancelled() else None)

    def done(f: Future) -> None:
        if row.done():
            return
        if f.cancelled():
            row.cancel()
        elif (exc := f.exception()) is not None:
            row.set_exception(exc)
        else:
            row.set_result(f.result()[0])

    rows.add_done_callback(done)
    return row


class LocalModels:
    def __init__(self, settings: Settings, pipeline: FacePipeline, metrics: Metrics, executor: Executor | None, batching: bool = True):
        """`executor` runs the models when `batching` is off (None: always batch, as the model host does)."""
        self.pipeline = pipeline
        self.metrics = metrics
        self.executor = executor
        embedder, detector = pipeline.require_embedder(), pipeline.detector
        self.embedder, self.detector = embedder, detector
        self.embed_batcher: MicroBatcher | None = None
        self.detect_batchers: dict[int, MicroBatcher] = {}
        self._closing = threading.Event()
        self._warm_up_thread: threading.Thread | None = None
        if batching or executor is None:
            self.embed_batcher = MicroBatcher(embedder.embed, embedder.shapes.largest, settings.batch_wait_ms, metrics, "embedder")
            self.detect_batchers = {
                size: MicroBatcher(detector.infer, detector.shapes.largest, settings.batch_wait_ms, metrics, "detector")
                for size in detector.sizes
            }

    def describe(self) -> dict:
        """What /readyz reports of how the models run."""
        return {
            "batching": self.embed_batcher is not None,
            "embed_batch_sizes": list(self.embedder.shapes.sizes),
            "detect_batch_sizes": list(self.detector.shapes.sizes),
            "detect_image_sizes": list(self.detector.sizes),
        }

    def detect(self, canvas: np.ndarray) -> Future:
        """One letterboxed canvas → a future of its candidates."""
        if size_batcher := self.detect_batchers.get(len(canvas)):
            return first_row(size_batcher.submit(canvas[None]))
        assert self.executor is not None  # no batcher only with an executor
        return self.executor.submit(lambda: self.detector.infer(canvas[None])[0])

    def embed(self, crops: np.ndarray) -> Future:
        """Aligned crops → a future of their embeddings."""
        if self.embed_batcher:
            return self.embed_batcher.submit(crops)
        assert self.executor is not None
        return self.executor.submit(self._embed_now, crops)

    def _embed_now(self, crops: np.ndarray) -> np.ndarray:
        embeddings = self.embedder.embed(crops)
        self.metrics.embedder_ran(len(embeddings))
        return embeddings

    def start_warm_up(self, done: Callable[[str | None], None]) -> None:
        """Warm up in the background: /healthz answers meanwhile; close() waits for it, since a model
        still running when the interpreter exits aborts the process."""
        self._warm_up_thread = threading.Thread(target=self.warm_up, args=(done,), name="facegate-warmup", daemon=True)
        self._warm_up_thread.start()

    def warm_up(self, done: Callable[[str | None], None]) -> None:
        """Run each model once at every shape it will see (the detector: each batch at each image
        size), in the thread that will run it (its micro-batcher's: a GPU provider keeps state per
        thread), then report (None, or the error).
        Stops between shapes once close() was called (a start-up that failed after it began)."""
        started = time.perf_counter()
        detector, embedder = self.detector, self.embedder
        runs: list[Callable[[], object]] = [
            partial(self._warm, self.detect_batchers.get(size), detector.infer, np.zeros((n, size, size, 3), np.uint8))
            for size in detector.sizes
            for n in detector.shapes.sizes
        ]
        runs += [
            partial(self._warm, self.embed_batcher, embedder.embed, np.zeros((n, *embedder.size, 3), np.uint8))
            for n in embedder.shapes.sizes
        ]
        try:
            for run in runs:
                if self._closing.is_set():
                    return
                run()
        except Exception as exc:  # reported by /readyz; the service stays up and says why
            log.error("warm-up failed: %s", exc)
            done(f"{type(exc).__name__}: {exc}")
            return
        log.info("warm-up done in %.1f s (embedder batches %s)", time.perf_counter() - started, list(embedder.shapes.sizes))
        done(None)

    @staticmethod
    def _warm(batcher: MicroBatcher | None, run: Callable[[np.ndarray], object], rows: np.ndarray) -> None:
        """One warm-up run at exactly `rows`' shape: through the batcher (alone in its queue: nothing
        is served before the warm-up is done), else here."""
        if batcher is None:
            run(rows)
        else:
            batcher.submit(rows, counted=False).result()

    def close(self) -> None:
        self._closing.set()
        if self._warm_up_thread is not None:
            self._warm_up_thread.join()
        for batcher in (self.embed_batcher, *self.detect_batchers.values()):
            if batcher:
                batcher.close()
