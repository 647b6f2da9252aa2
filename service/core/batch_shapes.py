"""The batch sizes a model runs at.

A model runs only at a few batch sizes: a batch is padded up to the next size and one above the
largest is split. Every shape a session will ever see is then known at start-up and warmed there,
so no request pays for a provider's per-shape work (cuDNN's algorithm search, memory allocation, a
TensorRT engine build). Each model wrapper (FaceEmbedder, FaceDetector) owns its shapes; the
engine's micro-batchers and warm-up read them there.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

import numpy as np


class BatchShapes:
    """The batch sizes a model is run at, smallest first."""

    def __init__(self, sizes: Iterable[int]):
        self.sizes = tuple(sorted(set(sizes)))
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive integers, got {sizes!r}")

    @classmethod
    def for_model(cls, batch_dim: int | str | None, sizes: Iterable[int]) -> BatchShapes:
        """The one rule: a graph exported with a fixed batch runs at that size only, a free one at
        the sizes configured (FACEGATE_BATCH_SIZES, FACEGATE_DETECT_BATCH_SIZES)."""
        return cls([batch_dim] if isinstance(batch_dim, int) else sizes)

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
