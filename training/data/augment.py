"""Cheap augmentations on uint8 RGB crops, run in the data-loader workers. Each sample gets its own
seeded generator, so a resumed run sees the same augmented pixels as an uninterrupted one."""

from __future__ import annotations

import cv2
import numpy as np
from pydantic import Field

from service.core.strict import StrictModel


class AugmentConfig(StrictModel):
    flip: float = Field(0.5, ge=0, le=1, description="Probability of a horizontal flip.")
    random_resized_crop: float = Field(0.0, ge=0, le=1, description="Probability of a random crop (scale 0.8–1) resized back.")
    color_jitter: float = Field(0.0, ge=0, le=1, description="Probability of brightness/contrast/saturation jitter (±20%).")
    blur: float = Field(0.0, ge=0, le=1, description="Probability of a Gaussian blur (σ 0.5–1.5).")
    grayscale: float = Field(0.0, ge=0, le=1, description="Probability of converting to grayscale (3 equal channels).")


def augment(crop: np.ndarray, cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """One H×W×3 uint8 RGB crop → an augmented crop of the same size and dtype."""
    h, w = crop.shape[:2]
    if rng.random() < cfg.flip:
        crop = crop[:, ::-1]
    if rng.random() < cfg.random_resized_crop:
        scale = rng.uniform(0.8, 1.0)
        ch, cw = int(round(h * scale)), int(round(w * scale))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = cv2.resize(np.ascontiguousarray(crop[y : y + ch, x : x + cw]), (w, h), interpolation=cv2.INTER_LINEAR)
    if rng.random() < cfg.color_jitter:
        x = crop.astype(np.float32)
        x *= rng.uniform(0.8, 1.2)  # brightness
        mean = x.mean()
        x = (x - mean) * rng.uniform(0.8, 1.2) + mean  # contrast
        gray = x.mean(axis=2, keepdims=True)
        x = (x - gray) * rng.uniform(0.8, 1.2) + gray  # saturation
        crop = np.clip(x, 0, 255).astype(np.uint8)
    if rng.random() < cfg.blur:
        crop = cv2.GaussianBlur(np.ascontiguousarray(crop), (0, 0), sigmaX=rng.uniform(0.5, 1.5))
    if rng.random() < cfg.grayscale:
        gray = cv2.cvtColor(np.ascontiguousarray(crop), cv2.COLOR_RGB2GRAY)
        crop = np.repeat(gray[..., None], 3, axis=2)
    return np.ascontiguousarray(crop)
