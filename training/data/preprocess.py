"""The network input, defined once: the manifest's input spec that export writes is the one the
training data is normalized with (through the service's own `normalize`), so they cannot drift."""

from __future__ import annotations

import numpy as np

from service.align import TEMPLATES
from service.models.embedder import normalize
from service.models.manifest import InputSpec

ALIGNMENT = "arcface_112"
SIZE = TEMPLATES[ALIGNMENT][1]
INPUT_SPEC = InputSpec(name="input", shape=["batch", 3, SIZE, SIZE], color="RGB", mean=[127.5] * 3, std=[127.5] * 3)
OUTPUT_NAME = "embedding"


def to_input(crops_rgb: np.ndarray) -> np.ndarray:
    """N×112×112×3 uint8 RGB aligned crops → N×3×112×112 float32, exactly as the service normalizes
    them (in numpy, or in the graph of a uint8 NHWC export)."""
    return normalize(np.asarray(crops_rgb), INPUT_SPEC)
