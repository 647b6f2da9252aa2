"""Checkpoints: written atomically (temp file in the same folder, fsync, rename), so a crash never
leaves a truncated `last.pt`; read with `torch.load(weights_only=True)`, so a checkpoint cannot run
code. The config travels inside as plain JSON-able data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from service.core.fileio import replacing
from service.core.settings import Settings
from training.backbones import build_backbone
from training.config import TrainConfig


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    with replacing(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(Path(path), map_location=map_location, weights_only=True)


def shard_path(path: Path, rank: int) -> Path:
    """Where rank's part of a sharded head lives beside the main checkpoint."""
    path = Path(path)
    return path.with_name(f"{path.stem}.head{rank}{path.suffix}")


def checkpoint_config(state: dict[str, Any]) -> TrainConfig:
    """The run's config a checkpoint carries (saved as `TrainConfig.model_dump(mode="json")`), validated
    again, so readers use its attributes and an unreadable config fails here, by name."""
    return TrainConfig.model_validate(state["config"])


def load_backbone(
    path: Path, settings: Settings, map_location: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, TrainConfig, dict[str, Any]]:
    """Checkpoint → (backbone in eval mode, its run's config, checkpoint dict); `settings` find an
    imported backbone's starting weights (its architecture is read from them)."""
    state = load_checkpoint(path, map_location)
    config = checkpoint_config(state)
    backbone = build_backbone(config.backbone, config.embedding_dim, settings, **config.backbone_params)
    backbone.load_state_dict(state["backbone"])
    return backbone.eval(), config, state
