"""Runs the pipeline for requests without ever blocking the event loop: decode, detect and align on
a thread pool sized by settings, embedding through the micro-batcher (or the pool when batching is
off)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from service.batching import MicroBatcher
from service.metrics import Metrics
from service.pipeline import EmbeddedFace, FacePipeline, FacePolicy, FoundFace
from service.settings import Settings


class Engine:
    def __init__(self, settings: Settings, pipeline: FacePipeline, metrics: Metrics):
        """`pipeline` has both models (the app builds an engine only when it is ready)."""
        self.pipeline = pipeline
        self.metrics = metrics
        self.executor = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="facegate-infer")
        self.batcher = None
        if settings.batching:
            self.batcher = MicroBatcher(pipeline.embedder.embed, settings.embed_max_batch, settings.batch_wait_ms, metrics)

    def close(self) -> None:
        if self.batcher:
            self.batcher.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _find(self, data: bytes, aligned: bool, policy: FacePolicy, chips: bool) -> list[FoundFace]:
        return self.pipeline.find_faces(self.pipeline.decode(data), aligned, policy, chips)

    def _embed_now(self, crops: np.ndarray) -> np.ndarray:
        embeddings = self.pipeline.embedder.embed(crops)
        self.metrics.embedder_ran(len(embeddings))
        return embeddings

    async def embed_crops(self, crops: np.ndarray) -> np.ndarray:
        if self.batcher:
            return await asyncio.wrap_future(self.batcher.submit(crops))
        return await self._run(self._embed_now, crops)

    async def faces(self, data: bytes, aligned: bool = False, policy: FacePolicy = "largest", chips: bool = False) -> list[EmbeddedFace]:
        """The image's faces with their embeddings, largest first (and their chips, when asked)."""
        found = await self._run(self._find, data, aligned, policy, chips)
        embeddings = await self.embed_crops(np.stack([f.crop for f in found]))
        return [f.embedded(e) for f, e in zip(found, embeddings)]
