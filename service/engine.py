"""Runs the pipeline for requests without ever blocking the event loop: decode, letterbox and align
on a thread pool, detection and embedding through micro-batchers (or on the pool when batching is
off). Both models only ever run at their fixed batch shapes, each warmed up once at start-up; the
detector has a micro-batcher per image size it runs at (images of one size share a run)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from service.batching import MicroBatcher
from service.budget import PixelBudget
from service.core.cpus import available_cores
from service.core.decode import Probe
from service.core.pipeline import Detect, EmbeddedFace, FacePipeline, FacePolicy, Steps, advance
from service.core.settings import Settings
from service.metrics import Metrics

log = logging.getLogger("facegate.engine")


class Engine:
    def __init__(self, settings: Settings, pipeline: FacePipeline, metrics: Metrics):
        """`pipeline` has both models (the app builds an engine only when both loaded)."""
        self.pipeline = pipeline
        self.metrics = metrics
        self.workers = settings.worker_threads or available_cores()
        self.executor = ThreadPoolExecutor(self.workers, thread_name_prefix="facegate-infer")
        embedder, detector = pipeline.require_embedder(), pipeline.detector
        # Both run at their own batch shapes (BatchShapes): a micro-batch is at most the largest.
        self._embed, self._detect = embedder.embed, detector.infer
        self.pixels = PixelBudget(settings.max_decoded_megapixels, settings.decode_wait)
        self.embed_batcher = None
        self.detect_batchers: dict[int, MicroBatcher] = {}
        self._closing = threading.Event()
        self._warm_up_thread: threading.Thread | None = None
        if settings.batching:
            self.embed_batcher = MicroBatcher(self._embed, embedder.shapes.largest, settings.batch_wait_ms, metrics, "embedder")
            self.detect_batchers = {
                size: MicroBatcher(self._detect, detector.shapes.largest, settings.batch_wait_ms, metrics, "detector")
                for size in detector.sizes
            }

    def describe(self) -> dict:
        """What /readyz reports of how requests are served."""
        return {
            "batching": self.embed_batcher is not None,
            "embed_batch_sizes": list(self.pipeline.require_embedder().shapes.sizes),
            "detect_batch_sizes": list(self.pipeline.detector.shapes.sizes),
            "detect_image_sizes": list(self.pipeline.detector.sizes),
            "worker_threads": self.workers,
            "cores": available_cores(),
        }

    def start_warm_up(self, done: Callable[[str | None], None]) -> None:
        """Warm up in the background: /healthz answers meanwhile; close() waits for it, since a model
        still running when the interpreter exits aborts the process."""
        self._warm_up_thread = threading.Thread(target=self.warm_up, args=(done,), name="facegate-warmup", daemon=True)
        self._warm_up_thread.start()

    def warm_up(self, done: Callable[[str | None], None]) -> None:
        """Run each model once at every shape it will see (the detector: each batch at each image
        size), then report (None, or the error).
        Stops between shapes once close() was called (a start-up that failed after it began)."""
        started = time.perf_counter()
        detector, embedder = self.pipeline.detector, self.pipeline.require_embedder()
        runs: list[Callable[[], Any]] = [
            partial(detector.infer, np.zeros((n, size, size, 3), np.uint8)) for size in detector.sizes for n in detector.shapes.sizes
        ]
        runs += [partial(embedder.embed, np.zeros((n, *embedder.size, 3), np.uint8)) for n in embedder.shapes.sizes]
        runs += [self.pipeline.decoder.start] if self.pipeline.decoder else []
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

    def close(self) -> None:
        self._closing.set()
        if self._warm_up_thread is not None:
            self._warm_up_thread.join()
        for batcher in (self.embed_batcher, *self.detect_batchers.values()):
            if batcher:
                batcher.close()
        self.pipeline.close()  # first: a decode in flight ends now, not at its deadline
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _embed_now(self, crops: np.ndarray) -> np.ndarray:
        embeddings = self._embed(crops)
        self.metrics.embedder_ran(len(embeddings))
        return embeddings

    async def embed_crops(self, crops: np.ndarray) -> np.ndarray:
        if self.embed_batcher:
            return await asyncio.wrap_future(self.embed_batcher.submit(crops))
        return await self._run(self._embed_now, crops)

    async def _detect_row(self, canvas: np.ndarray) -> np.ndarray:
        if self.detect_batchers:
            return (await asyncio.wrap_future(self.detect_batchers[len(canvas)].submit(canvas[None])))[0]
        return (await self._run(self._detect, canvas[None]))[0]

    def _start(
        self, data: bytes, sent: Probe, aligned: bool, policy: FacePolicy, chips: bool, cancel: threading.Event
    ) -> tuple[Steps, tuple[bool, Any]]:
        """Decode (a large JPEG reduced) and run the steps up to their first model run, on a worker thread."""
        steps = self.pipeline.steps(self.pipeline.decode(data, reduced=True, cancel=cancel), aligned, policy, chips, sent)
        return steps, advance(steps)

    async def faces(self, data: bytes, aligned: bool = False, policy: FacePolicy = "largest", chips: bool = False) -> list[EmbeddedFace]:
        """The image's faces with their embeddings, largest first (and their chips, when asked). The
        decoded pixels are held against the pixel budget until the faces are embedded. A request
        cancelled meanwhile (its client gone) stops its probe or decode where it is."""
        cancel = threading.Event()
        try:
            sent = await self._run(self.pipeline.probe, data, cancel)
            async with self.pixels.hold(sent.budget_pixels):
                return await self._faces(data, sent, aligned, policy, chips, cancel)
        finally:
            cancel.set()  # after an answer nothing listens; after a cancellation the decoder process is stopped

    async def _faces(
        self, data: bytes, sent: Probe, aligned: bool, policy: FacePolicy, chips: bool, cancel: threading.Event
    ) -> list[EmbeddedFace]:
        """The async driver of the pipeline's steps: model runs through the micro-batchers, the
        work between them on the thread pool."""
        steps, (done, request) = await self._run(self._start, data, sent, aligned, policy, chips, cancel)
        while not done:
            result = await (self._detect_row(request.canvas) if isinstance(request, Detect) else self.embed_crops(request.crops))
            done, request = await self._run(advance, steps, result)
        return request
