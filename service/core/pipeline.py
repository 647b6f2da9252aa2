"""decode → detect → align → embed over an already-loaded model set, orchestrated once (`steps`):
the CLI, training's evaluation and the service's engine all run faces through it. The steps hand
each model run to their driver, so the sync driver here runs the models in place and the engine's
async one runs them through its micro-batchers, with everything between on its thread pool."""

from __future__ import annotations

import threading
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from service.core.alignment import TEMPLATES, FaceChip, align_face, loose_chip, template_chip
from service.core.batch_shapes import default_sizes
from service.core.decode import Probe, decode_image, probe
from service.core.errors import InvalidCrop, ModelError, MultipleFaces, NoFace, TooManyFaces
from service.core.models.detector import Face, FaceDetector
from service.core.models.embedder import FaceEmbedder
from service.core.models.model_set import ModelSet, load_models
from service.core.settings import Settings

FacePolicy = Literal["largest", "reject_multiple", "all"]


class Decoder(Protocol):
    """Probes and decodes somewhere safer than this thread: the service injects its decoder
    processes (`service.runtime.decode_workers`); training and the CLI inject none."""

    def probe(
        self, data: bytes, max_bytes: int, max_pixels: int, min_side: int, reduce_to_side: int = 0, cancel: threading.Event | None = None
    ) -> Probe: ...
    def decode(
        self, data: bytes, max_bytes: int, max_pixels: int, min_side: int, reduce_to_side: int = 0, cancel: threading.Event | None = None
    ) -> np.ndarray: ...
    def start(self) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class FoundFace:
    """A face ready to embed: its detection (None for an aligned upload), its aligned RGB crop, and
    its chip for re-alignment when one was asked for (enrollment with FACEGATE_STORE_CROPS)."""

    face: Face | None
    crop: np.ndarray
    chip: FaceChip | None

    def embedded(self, embedding: np.ndarray) -> EmbeddedFace:
        return EmbeddedFace(self.face, self.crop, self.chip, embedding)


@dataclass(frozen=True)
class EmbeddedFace(FoundFace):
    embedding: np.ndarray


@dataclass(frozen=True)
class Detect:
    """A detector run the steps ask of their driver: one letterboxed canvas → its candidates."""

    canvas: np.ndarray


@dataclass(frozen=True)
class Embed:
    """An embedder run the steps ask of their driver: aligned crops → their embeddings."""

    crops: np.ndarray


Steps = Generator[Detect | Embed, np.ndarray, list[EmbeddedFace]]


def advance(steps: Steps, result: np.ndarray | None = None) -> tuple[bool, Any]:
    """Resume the steps with a model's result: (False, the next model run) or (True, the faces).
    StopIteration stays inside, since it cannot cross a thread pool's future."""
    try:
        return False, steps.send(result)  # type: ignore[arg-type]  # a fresh generator takes None
    except StopIteration as done:
        return True, done.value


def _sent_size(image: np.ndarray, sent: Probe) -> tuple[int, int]:
    """(height, width) of the image as sent, after EXIF orientation, from its reduced decode."""
    h, w = image.shape[:2]
    upright = (h, w) == (-(-sent.height // sent.reduction), -(-sent.width // sent.reduction))
    return (sent.height, sent.width) if upright else (sent.width, sent.height)


class FacePipeline:
    def __init__(self, settings: Settings, models: ModelSet, decoder: Decoder | None = None):
        """Needs the detector; the embedder may be missing (detect-only use). `decoder`: worker
        processes that probe and decode (the service's requests); None decodes in this thread."""
        if models.detector is None:
            raise ModelError("the face pipeline needs a detector, and none is loaded")
        self.settings = settings
        self.decoder = decoder
        self.detector_model = models.detector
        self.embedder_model = models.embedder
        self.detector = FaceDetector(
            models.detector.manifest,
            models.detector.session,
            score_threshold=settings.det_score_threshold,
            nms_threshold=settings.det_nms_threshold,
            min_face_size=settings.min_face_size,
            sizes=tuple(settings.detect_sizes),
            batch_sizes=settings.detect_batch_sizes or default_sizes("detector", models.detector.session.get_providers()),
            fork=models.detector.fork,
        )
        self.embedder = None
        if models.embedder:
            sizes = settings.batch_sizes or default_sizes("embedder", models.embedder.session.get_providers())
            self.embedder = FaceEmbedder(models.embedder.manifest, models.embedder.session, sizes, models.embedder.fork)

    @classmethod
    def from_settings(cls, settings: Settings, require_embedder: bool = True) -> FacePipeline:
        """Load the models settings name (ModelError when one needed is unusable) and wire them."""
        models = load_models(settings)
        models.require("detector", *(("embedder",) if require_embedder else ()))
        return cls(settings, models)

    @property
    def template(self) -> str:
        alignment = self.embedder_model.manifest.alignment if self.embedder_model else None
        return alignment or "arcface_112"  # an embedder's manifest always names one (Manifest checks it)

    def probe(self, data: bytes, cancel: threading.Event | None = None) -> Probe:
        """Format, size and the reduction `decode(data, reduced=True)` applies, with the limits
        checked (nothing decoded). `cancel`: as for `decode`."""
        s = self.settings
        limits = (s.max_image_bytes, s.max_image_pixels, s.min_image_side, s.jpeg_reduce_to_side)
        return self.decoder.probe(data, *limits, cancel=cancel) if self.decoder else probe(data, *limits)

    def decode(self, data: bytes, reduced: bool = False, cancel: threading.Event | None = None) -> np.ndarray:
        """Full size (training, evaluation, the CLI), or a large JPEG at the reduction FACEGATE_JPEG_REDUCE_TO_SIDE
        allows (requests: `service.engine`, which reports faces in the image's pixels as sent).
        `cancel`: set by a caller that gave up, it stops the decoder process (DecodeCancelled)."""
        s = self.settings
        limits = (s.max_image_bytes, s.max_image_pixels, s.min_image_side, s.jpeg_reduce_to_side if reduced else 0)
        return self.decoder.decode(data, *limits, cancel=cancel) if self.decoder else decode_image(data, *limits)

    def close(self) -> None:
        """Stop the decoder processes, if any."""
        if self.decoder is not None:
            self.decoder.close()

    def detect(self, image_bgr: np.ndarray) -> list[Face]:
        return self.detector.detect(image_bgr)

    def align(self, image_bgr: np.ndarray, faces: list[Face], template: str | None = None) -> np.ndarray:
        """Crops for the loaded embedder's template, or for `template` (training and evaluation)."""
        template = template or self.template
        if not faces:
            _, size = TEMPLATES[template]
            return np.zeros((0, size, size, 3), np.uint8)
        return np.stack([align_face(image_bgr, f.landmarks, template) for f in faces])

    def require_embedder(self) -> FaceEmbedder:
        if self.embedder is None:
            raise ModelError(f"no embedder loaded: FACEGATE_EMBEDDER={self.settings.embedder!r} names no usable model")
        return self.embedder

    def aligned_crop(self, image_bgr: np.ndarray) -> np.ndarray:
        """An image the caller says is already aligned: must be the template size, used as is."""
        _, size = TEMPLATES[self.template]
        if image_bgr.shape[:2] != (size, size):
            raise InvalidCrop(f"an aligned face must be {size}x{size} pixels, got {image_bgr.shape[1]}x{image_bgr.shape[0]}")
        return image_bgr[..., ::-1][None]

    def steps(
        self, image_bgr: np.ndarray, aligned: bool = False, policy: FacePolicy = "largest", chips: bool = False, sent: Probe | None = None
    ) -> Steps:
        """The one orchestration: letterbox → detect → select and align → embed, yielding each model
        run to the driver (`run` here, the engine's micro-batchers in the service). The faces come
        largest first, each with its aligned RGB crop and embedding.

        policy: `largest` (one face), `reject_multiple` (one face, else MultipleFaces) or `all`.
        chips: also cut each face's FaceChip (a loose chip; an aligned upload is its own chip).
        sent: the probe of a reduced decode (a large JPEG): faces are then reported, and
        FACEGATE_MIN_FACE_SIZE applied, in the pixels of the image as sent.
        """
        if aligned:
            crop = self.aligned_crop(image_bgr)[0]
            found = [FoundFace(None, crop, template_chip(crop, self.template) if chips else None)]
        else:
            canvas, scale = self.detector.letterbox(image_bgr)
            row = yield Detect(canvas)
            found = self._select(image_bgr, row, scale, sent, policy, chips)
        embeddings = yield Embed(np.stack([f.crop for f in found]))
        return [f.embedded(e) for f, e in zip(found, embeddings, strict=True)]

    def run(self, steps: Steps) -> list[EmbeddedFace]:
        """The sync driver: each model run in place, in this thread."""
        done, request = advance(steps)
        while not done:
            result = (
                self.detector.infer(request.canvas[None])[0]
                if isinstance(request, Detect)
                else self.require_embedder().embed(request.crops)
            )
            done, request = advance(steps, result)
        return request

    def _select(
        self, image_bgr: np.ndarray, candidates: np.ndarray, scale: float, sent: Probe | None, policy: FacePolicy, chips: bool
    ) -> list[FoundFace]:
        """A detector's candidates → the faces the policy keeps, aligned on the pixels decoded; their
        detections in the pixels of the image as sent."""
        r = sent.reduction if sent else 1
        faces = self.detector.faces(candidates, scale / r, _sent_size(image_bgr, sent) if sent else image_bgr.shape[:2])
        if not faces:
            raise NoFace("no face was found in the image")
        if policy == "reject_multiple" and len(faces) > 1:
            raise MultipleFaces(f"{len(faces)} faces were found and face_policy=reject_multiple; send an image of one face")
        if policy != "all":
            faces = faces[:1]
        elif len(faces) > self.settings.max_faces:
            raise TooManyFaces(
                f"{len(faces)} faces were found; at most {self.settings.max_faces} per image are embedded (FACEGATE_MAX_FACES)"
            )
        decoded = [f.scaled(1 / r) for f in faces] if r != 1 else faces
        return [
            FoundFace(face, crop, loose_chip(image_bgr, seen.landmarks) if chips else None)
            for face, seen, crop in zip(faces, decoded, self.align(image_bgr, decoded), strict=True)
        ]

    def embed_image(self, image_bgr: np.ndarray, aligned: bool = False, all_faces: bool = True) -> list[EmbeddedFace]:
        """Every face of an image (largest first), or only the largest when all_faces is False."""
        self.require_embedder()
        return self.run(self.steps(image_bgr, aligned, "all" if all_faces else "largest"))

    def embed_file(self, path: Path, aligned: bool = False) -> EmbeddedFace:
        """The largest face of an image file (CLI helper)."""
        return self.embed_image(self.decode(Path(path).read_bytes()), aligned=aligned, all_faces=False)[0]
