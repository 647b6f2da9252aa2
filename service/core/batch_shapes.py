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
from typing import TypeVar, cast

import numpy as np

Rows = TypeVar("Rows", np.ndarray, list[np.ndarray])


# The batch sizes a model runs at unless FACEGATE_BATCH_SIZES / FACEGATE_DETECT_BATCH_SIZES say: on a
# CPU a padded row costs its full compute, so the largest stays small (the embedder's batches of 16
# and 32, the detector's of 4 and 8 ran no more images a second there, and held about 45 and 150 MiB
# more of onnxruntime's arena: docs/sizing.md); a GPU runs 32 or 128 rows in little more time than
# one, and a model host batching for many workers fills them.
DEFAULT_SIZES = {
    ("embedder", False): (1, 2, 4, 8),
    ("embedder", True): (1, 2, 4, 8, 16, 32, 64, 128),
    ("detector", False): (1, 2),
    ("detector", True): (1, 2, 4, 8, 16, 32),
}


def default_sizes(role: str, providers: list[str]) -> tuple[int, ...]:
    """The batch sizes of `role` (embedder or detector) when none are configured, by where its session runs."""
    return DEFAULT_SIZES[role, bool(providers) and providers[0] != "CPUExecutionProvider"]


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

    def run(self, fn: Callable[[np.ndarray], Rows], x: np.ndarray) -> Rows:
        """fn over x's rows, fn only ever called with a bucket's number of rows: zero rows pad a
        chunk up to its bucket and their outputs are dropped (models here treat rows independently).
        fn gives an array of rows, or a list of per-row arrays (the detector's candidates).
        No rows: fn decides (the embedder answers without running its session)."""
        if not len(x):
            return fn(x)
        out: list[Rows] = []
        for start in range(0, len(x), self.largest):
            rows: np.ndarray = x[start : start + self.largest]
            size = self.bucket(len(rows))
            padded = np.concatenate([rows, np.zeros((size - len(rows), *rows.shape[1:]), rows.dtype)]) if size > len(rows) else rows
            out.append(fn(padded)[: len(rows)])
        if isinstance(out[0], list):
            return cast(Rows, [row for part in out for row in part])
        return cast(Rows, np.concatenate(out))
