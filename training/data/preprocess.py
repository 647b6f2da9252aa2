"""The network input, defined once per backbone: the manifest's input spec that export writes is the
one the training data is normalized with (through the service's own `normalize`), so they cannot
drift. Backbones trained here take 112×112 `arcface_112` crops; a backbone that starts from an
imported model takes that model's input and alignment, read from its manifest."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from service.core.alignment import TEMPLATES
from service.core.models.embedder import normalize
from service.core.models.files import manifest_path
from service.core.models.manifest import InputSpec, Manifest

ALIGNMENT = "arcface_112"
SIZE = TEMPLATES[ALIGNMENT][1]
INPUT_SPEC = InputSpec(name="input", shape=["batch", 3, SIZE, SIZE], color="RGB", mean=[127.5] * 3, std=[127.5] * 3)
OUTPUT_NAME = "embedding"

# backbone → the shipped manifest (models/NAME.json) whose input and alignment it keeps
IMPORTED_INPUT = {"dlib_resnet_v1": "dlib-resnet-v1"}


@dataclass(frozen=True)
class Preprocessing:
    alignment: str
    spec: InputSpec

    @property
    def size(self) -> int:
        return TEMPLATES[self.alignment][1]

    def to_input(self, crops_rgb: np.ndarray) -> np.ndarray:
        """N×S×S×3 uint8 RGB aligned crops → N×3×S×S float32, exactly as the service feeds the ONNX model."""
        return normalize(np.asarray(crops_rgb), self.spec)


DEFAULT = Preprocessing(ALIGNMENT, INPUT_SPEC)


@cache
def for_backbone(name: str, models_dir: Path) -> Preprocessing:
    """The backbone's input; an imported backbone's comes from its manifest in `models_dir` (the
    settings' `models_dir`, which the command passes down)."""
    if name not in IMPORTED_INPUT:
        return DEFAULT
    manifest = Manifest.load(manifest_path(IMPORTED_INPUT[name], models_dir))
    if manifest.alignment is None:
        raise ValueError(f"{manifest.name} names no alignment, which {name} would be trained on")
    return Preprocessing(manifest.alignment, manifest.input.model_copy(update={"name": INPUT_SPEC.name}))


def to_input(crops_rgb: np.ndarray) -> np.ndarray:
    """N×112×112×3 uint8 RGB aligned crops → N×3×112×112 float32 (the default preprocessing)."""
    return DEFAULT.to_input(crops_rgb)
