"""Runs the pipeline for requests without ever blocking the event loop: decode, letterbox and align
on a thread pool, the model runs through this process's models (`LocalModels`: micro-batchers, or
the pool when batching is off) or through a model host that runs them for every worker process of
the host (`HostedModels`). A model run is handed over on the pool too (a hosted one copies into
shared memory and writes to a socket) and awaited FACEGATE_MODEL_RUN_TIMEOUT seconds at most.
Both models only ever run at their fixed batch shapes, each warmed up once at start-up."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from service.budget import CostLanes, PixelBudget, SharedTally
from service.core.cpus import available_cores
from service.core.decode import Probe
from service.core.errors import ModelUnavailable
from service.core.pipeline import Detect, EmbeddedFace, FacePipeline, FacePolicy, Steps, advance
from service.core.settings import Settings
from service.metrics import Metrics
from service.runtime.local_models import LocalModels

log = logging.getLogger("facegate.engine")


class ModelRuns(Protocol):
    """Where the engine's model runs go: this process's models, or a model host's."""

    def detect(self, canvas: np.ndarray) -> Future: ...
    def embed(self, crops: np.ndarray) -> Future: ...
    def describe(self) -> dict: ...
    def start_warm_up(self, done: Callable[[str | None], None]) -> None: ...
    def warm_up(self, done: Callable[[str | None], None]) -> None: ...
    def close(self) -> None: ...


class Engine:
    def __init__(self, settings: Settings, pipeline: FacePipeline, metrics: Metrics, hosted: ModelRuns | None = None):
        """`pipeline` has both models (the app builds an engine only when both loaded); `hosted`: a
        model host's runs (their sessions live there), else this process runs the models."""
        self.pipeline = pipeline
        self.metrics = metrics
        self.workers = settings.worker_threads or available_cores()
        self.executor = ThreadPoolExecutor(self.workers, thread_name_prefix="facegate-infer")
        self.models: ModelRuns = hosted or LocalModels(settings, pipeline, metrics, self.executor, settings.batching)
        self.pixels = PixelBudget(settings.max_decoded_megapixels, settings.decode_wait)
        self.run_timeout = settings.model_run_timeout
        # One thread (and decoder process) is always left to cheap images; with one thread there is none to keep.
        self.lanes = CostLanes(
            settings.costly_megapixels,
            max(1, self.workers - 1),
            settings.client_megapixels,
            settings.decode_wait,
            hosted if isinstance(hosted, SharedTally) else None,  # a client's share counted across the host's workers
        )

    def describe(self) -> dict:
        """What /readyz reports of how requests are served."""
        return {**self.models.describe(), "worker_threads": self.workers, "cores": available_cores(), "pid": os.getpid()}

    def start_warm_up(self, done: Callable[[str | None], None]) -> None:
        self.models.start_warm_up(self._with_decoder(done))

    def warm_up(self, done: Callable[[str | None], None]) -> None:
        self.models.warm_up(self._with_decoder(done))

    def _with_decoder(self, done: Callable[[str | None], None]) -> Callable[[str | None], None]:
        """`done`, once the decoder processes have started too: ready means an image can be decoded."""

        def finish(error: str | None) -> None:
            if error is None and self.pipeline.decoder is not None:
                try:
                    self.pipeline.decoder.start()
                except Exception as exc:  # reported by /readyz like a model's warm-up
                    error = f"{type(exc).__name__}: {exc}"
            done(error)

        return finish

    def close(self) -> None:
        self.models.close()
        self.pipeline.close()  # a decode in flight ends now, not at its deadline
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def embed_crops(self, crops: np.ndarray) -> np.ndarray:
        return await self._finished(await self._run(self.models.embed, crops))

    async def _finished(self, run: Future) -> Any:
        """A model run's result, waited for FACEGATE_MODEL_RUN_TIMEOUT seconds at most (then dropped)."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(run), self.run_timeout)
        except TimeoutError:
            raise ModelUnavailable(
                f"a model run did not finish within {self.run_timeout:g} s (FACEGATE_MODEL_RUN_TIMEOUT); retry shortly", retry_after=1
            ) from None

    def _start(
        self, data: bytes, sent: Probe, aligned: bool, policy: FacePolicy, chips: bool, cancel: threading.Event
    ) -> tuple[Steps, tuple[bool, Any]]:
        """Decode (a large JPEG reduced) and run the steps up to their first model run, handed over, on a worker thread."""
        steps = self.pipeline.steps(self.pipeline.decode(data, reduced=True, cancel=cancel), aligned, policy, chips, sent)
        return steps, self._step(steps)

    def _step(self, steps: Steps, result: np.ndarray | None = None) -> tuple[bool, Any]:
        """Resume the steps on a worker thread: (True, the faces), or (False, (its model's name, when
        it was handed over, the run's future))."""
        done, request = advance(steps, result)
        if done:
            return True, request
        detect = isinstance(request, Detect)
        started = time.perf_counter()
        return False, (
            "detect" if detect else "embed",
            started,
            self.models.detect(request.canvas) if detect else self.models.embed(request.crops),
        )

    async def faces(
        self,
        data: bytes,
        aligned: bool = False,
        policy: FacePolicy = "largest",
        chips: bool = False,
        timings: dict[str, float] | None = None,
    ) -> list[EmbeddedFace]:
        """The image's faces with their embeddings, largest first (and their chips, when asked). The
        decoded pixels are held against the pixel budget until the faces are embedded. `timings`, when
        given, gets the seconds the image waited on each model ("detect", "embed"), its batch included:
        what CompreFace's `execution_time` reports. A request cancelled meanwhile (its client gone)
        stops its probe or decode where it is. A costly image goes through its lane first
        (`CostLanes`: one thread always stays free for cheap ones), then the pixel budget."""
        cancel = threading.Event()
        try:
            sent = await self._run(self.pipeline.probe, data, cancel)
            async with self.lanes.enter(sent.budget_pixels), self.pixels.hold(sent.budget_pixels):
                return await self._faces(data, sent, aligned, policy, chips, {} if timings is None else timings, cancel)
        finally:
            cancel.set()  # after an answer nothing listens; after a cancellation the decoder process is stopped

    async def _faces(
        self,
        data: bytes,
        sent: Probe,
        aligned: bool,
        policy: FacePolicy,
        chips: bool,
        timings: dict[str, float],
        cancel: threading.Event,
    ) -> list[EmbeddedFace]:
        """The async driver of the pipeline's steps: model runs through the models' futures, the
        work between them on the thread pool."""
        steps, (done, step) = await self._run(self._start, data, sent, aligned, policy, chips, cancel)
        while not done:
            model, started, run = step
            result = await self._finished(run)
            timings[model] = timings.get(model, 0.0) + time.perf_counter() - started
            done, step = await self._run(self._step, steps, result)
        return step
