"""Aligned face crops → L2-normalized embeddings, preprocessed exactly as the manifest says."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.models.manifest import Manifest


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def preprocess(crops_rgb: np.ndarray, manifest: Manifest) -> np.ndarray:
    """N×H×W×3 uint8 RGB → N×3×H×W float32 in the model's colour order and normalization."""
    spec = manifest.input
    x = crops_rgb if spec.color == "RGB" else crops_rgb[..., ::-1]
    x = x.astype(np.float32)
    if spec.mean is not None:
        x = (x - np.asarray(spec.mean, np.float32)) / np.asarray(spec.std, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


class FaceEmbedder:
    def __init__(self, manifest: Manifest, session: ort.InferenceSession, max_batch: int = 32):
        self.manifest = manifest
        self.session = session
        self.input_name = manifest.input.name
        self.output_name = manifest.outputs[0].name
        self.dim = manifest.embedding_dim
        self.size = (manifest.input.height, manifest.input.width)
        # A model exported with a fixed batch axis is run one face at a time.
        batch_axis = manifest.input.shape[0]
        self.max_batch = max_batch if not isinstance(batch_axis, int) else batch_axis

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
        out = []
        for start in range(0, len(crops_rgb), self.max_batch):
            batch = preprocess(crops_rgb[start : start + self.max_batch], self.manifest)
            out.append(self.session.run([self.output_name], {self.input_name: batch})[0])
        return np.concatenate(out).astype(np.float32)
