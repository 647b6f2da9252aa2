"""Aligned face crops → L2-normalized embeddings, preprocessed exactly as the manifest says."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from service.core.batch_shapes import BatchShapes
from service.core.models.manifest import EmbedderKey, InputSpec, Manifest

if TYPE_CHECKING:  # a session is given: the process that runs none (an HTTP worker under a model host) never imports it
    import onnxruntime as ort


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def normalize(crops_rgb: np.ndarray, spec: InputSpec) -> np.ndarray:
    """N×H×W×3 uint8 RGB → N×3×H×W float32 in the model's colour order and normalization: the numpy
    path of a float32 NCHW input, and the reference a uint8 NHWC model's graph is checked against."""
    src = crops_rgb if spec.color == "RGB" else crops_rgb[..., ::-1]
    x = np.empty((src.shape[0], src.shape[3], src.shape[1], src.shape[2]), np.float32)
    x[...] = src.transpose(0, 3, 1, 2)  # cast and transpose in one pass; then in place, no temporaries
    if spec.mean is not None:
        x -= np.asarray(spec.mean, np.float32)[:, None, None]
        x /= np.asarray(spec.std, np.float32)[:, None, None]
    return x


def preprocess(crops_rgb: np.ndarray, spec: InputSpec, in_graph: bool | None = None) -> np.ndarray:
    """N×H×W×3 uint8 RGB → what the model's input takes: the crops themselves when its graph
    preprocesses them (uint8 NHWC: the manifest says so, or `in_graph` where the session was
    wrapped at load), else `normalize`d in numpy."""
    if spec.in_graph if in_graph is None else in_graph:
        return np.ascontiguousarray(crops_rgb, dtype=np.uint8)
    return normalize(crops_rgb, spec)


def uses_io_binding(providers: list[str]) -> bool:
    """IO binding on a GPU provider: the input is copied to the device once, and the output back,
    without the per-run feed/fetch conversions. On the CPU provider a plain run is as fast."""
    return bool(providers) and providers[0] != "CPUExecutionProvider"


class FaceEmbedder:
    def __init__(
        self,
        manifest: Manifest,
        session: ort.InferenceSession,
        batch_sizes: Iterable[int] = (32,),
        fork: Callable[[], ort.InferenceSession] | None = None,
    ):
        """`batch_sizes`: the only batch sizes the session runs at (`BatchShapes`). `fork` (on a GPU):
        more sessions of the model, one per batch size, so no session ever changes input shape."""
        self.manifest = manifest
        self.session = session
        self.input_name = manifest.input.name
        self.output_name = manifest.outputs[0].name
        self.dim = EmbedderKey.of(manifest).dim  # ModelError for a manifest that is not an embedder's
        self.size = (manifest.input.height, manifest.input.width)
        self.shapes = BatchShapes.for_model(manifest.input.shape[0], batch_sizes)
        self.io_binding = uses_io_binding(session.get_providers())
        # uint8 NHWC in: the file's own (`facegate export`), or a float32 one wrapped on a GPU at load
        self.in_graph = session.get_inputs()[0].type == "tensor(uint8)"
        self.sessions = {n: fork() for n in self.shapes.sizes} if fork else {}

    def embed(self, crops_rgb: np.ndarray) -> np.ndarray:
        """N aligned crops (uint8 RGB) → N×D float32 unit vectors."""
        return l2_normalize(self.raw(crops_rgb))

    def raw(self, crops_rgb: np.ndarray) -> np.ndarray:
        """N aligned crops (uint8 RGB) → the model's N×D float32 output, not normalized."""
        crops_rgb = np.asarray(crops_rgb)
        if crops_rgb.ndim == 3:
            crops_rgb = crops_rgb[None]
        if crops_rgb.shape[1:3] != self.size:
            raise ValueError(f"crops are {crops_rgb.shape[1:3]}, the embedder takes {self.size}")
        if len(crops_rgb) == 0:
            return np.zeros((0, self.dim), np.float32)
        run = self.run_bound if self.io_binding else self.run
        return self.shapes.run(lambda chunk: run(preprocess(chunk, self.manifest.input, self.in_graph)), crops_rgb).astype(np.float32)

    def session_for(self, batch: np.ndarray) -> ort.InferenceSession:
        return self.sessions.get(len(batch), self.session)

    def run(self, batch: np.ndarray) -> np.ndarray:
        """One session run on an already preprocessed batch."""
        return self.session_for(batch).run([self.output_name], {self.input_name: batch})[0]

    def run_bound(self, batch: np.ndarray) -> np.ndarray:
        """`run` through IO binding: input from host memory, output copied back to host memory."""
        session = self.session_for(batch)
        binding = session.io_binding()
        binding.bind_cpu_input(self.input_name, batch)
        binding.bind_output(self.output_name)
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]
