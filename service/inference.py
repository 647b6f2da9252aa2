"""The object that owns the models: it loads them (the service starts without an embedder and
says why), runs decode/detect/align on a thread pool sized by settings, and sends crops through the
micro-batcher, so no model work ever runs on the event loop."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from service.api_errors import InvalidParameters, ModelUnavailable, UnknownFar
from service.batcher import MicroBatcher
from service.detect import Face
from service.errors import ModelError
from service.gallery import EmbedderKey
from service.manifest import far_key
from service.metrics import Metrics
from service.model_store import LoadedModel, load_model
from service.pipeline import FacePipeline
from service.settings import Settings

log = logging.getLogger("facegate.inference")

FacePolicy = Literal["largest", "reject_multiple", "all"]

FIXES = {
    "detector": "run `facegate models pull` (downloads it into FACEGATE_MODEL_CACHE) or point FACEGATE_MODEL_CACHE at a folder holding it",
    "embedder": "set FACEGATE_EMBEDDER to an embedder manifest (a name in FACEGATE_MODELS_DIR or a path to its .json) whose model file sits beside it or in FACEGATE_MODEL_CACHE",
}


@dataclass(frozen=True)
class FoundFace:
    """A face ready to embed: its detection (None for an aligned upload) and its aligned RGB crop."""

    face: Face | None
    crop: np.ndarray


@dataclass(frozen=True)
class EmbeddedFace:
    face: Face | None
    crop: np.ndarray
    embedding: np.ndarray


@dataclass(frozen=True)
class Decision:
    threshold: float
    far: str | None  # None when the caller gave an explicit threshold


class Inference:
    def __init__(self, settings: Settings, metrics: Metrics):
        self.settings = settings
        self.metrics = metrics
        self.problems: list[dict[str, str]] = []
        detector = self._load("detector", settings.detector)
        embedder = self._load("embedder", settings.embedder)
        self.pipeline = FacePipeline(settings, detector, embedder) if detector else None
        self.executor = ThreadPoolExecutor(settings.worker_threads, thread_name_prefix="facegate-infer")
        self.batcher = None
        if self.ready and settings.batching:
            self.batcher = MicroBatcher(self.pipeline.embedder.embed, settings.embed_max_batch, settings.batch_wait_ms, metrics)

    def _load(self, role: str, name: str) -> LoadedModel | None:
        s = self.settings
        try:
            return load_model(name, s.models_dir, s.model_cache, s.device, s.intra_op_threads)
        except ModelError as exc:
            log.error("%s %r is unavailable: %s", role, name, exc)
            self.problems.append({"model": role, "name": name, "error": str(exc), "fix": FIXES[role]})
            return None

    def close(self) -> None:
        if self.batcher:
            self.batcher.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    @property
    def ready(self) -> bool:
        return self.pipeline is not None and self.pipeline.embedder is not None

    def require(self) -> FacePipeline:
        if not self.ready:
            missing = ", ".join(f"{p['model']} {p['name']!r}" for p in self.problems)
            raise ModelUnavailable(f"the service has no usable {missing}; see GET /readyz for the fix")
        return self.pipeline

    @property
    def embedder_key(self) -> EmbedderKey | None:
        if not self.ready:
            return None
        m = self.pipeline.embedder_model.manifest
        return EmbedderKey(m.name, m.file.sha256, m.embedding_dim)

    def model_info(self) -> dict[str, str]:
        m = self.require().embedder_model.manifest
        return {"name": m.name, "version": m.version, "sha256": m.file.sha256}

    def decision(self, far: float | str | None, threshold: float | None) -> Decision:
        """The threshold a request's decision uses, and the FAR it stands for (from the manifest)."""
        if far is not None and threshold is not None:
            raise InvalidParameters("give far or threshold, not both")
        if threshold is not None:
            return Decision(threshold, None)
        thresholds = self.require().embedder_model.manifest.thresholds
        available = ", ".join(sorted(thresholds, key=float)) or "none (pass an explicit threshold)"
        try:
            key = far_key(far if far is not None else self.settings.default_far)
        except ValueError as exc:
            raise InvalidParameters(f"far: {exc}") from None
        if key not in thresholds:
            origin = "requested" if far is not None else "default (FACEGATE_DEFAULT_FAR)"
            raise UnknownFar(f"the model has no threshold for the {origin} FAR {key}; available FARs: {available}")
        return Decision(thresholds[key], key)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _find(self, data: bytes, aligned: bool, policy: FacePolicy) -> list[FoundFace]:
        pipeline = self.pipeline
        return [FoundFace(face, crop) for face, crop in pipeline.find_faces(pipeline.decode(data), aligned, policy)]

    def _embed_now(self, crops: np.ndarray) -> np.ndarray:
        embeddings = self.pipeline.embedder.embed(crops)
        self.metrics.batch_size.observe(len(embeddings))
        self.metrics.faces_embedded.inc(len(embeddings))
        return embeddings

    async def embed_crops(self, crops: np.ndarray) -> np.ndarray:
        if self.batcher:
            return await asyncio.wrap_future(self.batcher.submit(crops))
        return await self._run(self._embed_now, crops)

    async def faces(self, data: bytes, aligned: bool = False, policy: FacePolicy = "largest") -> list[EmbeddedFace]:
        """Decode, detect and align on the thread pool, then embed through the batcher; largest face first."""
        self.require()
        found = await self._run(self._find, data, aligned, policy)
        embeddings = await self.embed_crops(np.stack([f.crop for f in found]))
        return [EmbeddedFace(f.face, f.crop, e) for f, e in zip(found, embeddings)]

    def readiness(self) -> dict:
        models = {}
        if self.pipeline:
            for role, loaded in (("detector", self.pipeline.detector_model), ("embedder", self.pipeline.embedder_model)):
                if loaded:
                    models[role] = {
                        "name": loaded.manifest.name,
                        "version": loaded.manifest.version,
                        "sha256": loaded.manifest.file.sha256,
                        "providers": loaded.session.get_providers(),
                    }
        return {"ready": self.ready, "models": models, "problems": self.problems}
