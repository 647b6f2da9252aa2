"""Helpers shared by the training tests (no tests here): tiny aligned data sets and configs, so
every training test stays at a few seconds on two CPU cores."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

TINY = {
    "backbone": "mobilefacenet",
    "backbone_params": {"blocks": [1, 1, 1, 1], "width": 0.25},
    "embedding_dim": 32,
    "channels_last": True,  # on CPU, depthwise-conv backward is ~10× faster channels-last
    "batch_size": 8,
    "steps": 6,
    "head": {"name": "arcface", "params": {"s": 16.0, "m": 0.2}},
    "optim": {"lr": 0.1, "warmup_steps": 0, "schedule": "constant"},
    "data": {"workers": 0, "augment": {"flip": 0.5}},
    "log_every": 1,
    "checkpoint_every": 1000,
    "val_every": 1000,
}


def write_aligned_folders(root: Path, identities: int = 4, per_identity: int = 4, seed: int = 0, size: int = 112) -> Path:
    """Identity folders of size×size JPEGs (training's 112, or 150 for dlib_resnet_v1): each identity
    a smooth random pattern plus per-image noise, so a classifier can learn them in a few steps."""
    rng = np.random.default_rng(seed)
    for c in range(identities):
        folder = root / f"id{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (7, 7, 3)).astype(np.float32)
        for k in range(per_identity):
            image = cv2.resize(base + rng.normal(0, 12, (7, 7, 3)), (size, size), interpolation=cv2.INTER_CUBIC)
            cv2.imwrite(str(folder / f"{k:03d}.jpg"), np.clip(image, 0, 255).astype(np.uint8))
    return root


def tiny_config(data_dir: Path, output: Path, **overrides):
    from training.config import TrainConfig

    tree = {**TINY, "output": str(output)}
    tree["data"] = {**TINY["data"], "train": str(data_dir)}
    for key, value in overrides.items():
        tree[key] = {**tree[key], **value} if isinstance(value, dict) and isinstance(tree.get(key), dict) else value
    return TrainConfig.model_validate(tree)
