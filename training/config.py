"""The training configuration: one YAML file, validated by pydantic, overridable with
`--set key.sub=value` (values parsed as YAML, so `--set optim.lr=0.05` is a float)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from service.core.strict import StrictModel
from training.data.augment import AugmentConfig


class DataConfig(StrictModel):
    train: Path = Field(description="Aligned identity folders (`facegate align` output), a train.rec, or a folder holding train.rec.")
    num_classes: int | None = Field(None, gt=0, description="Identity count; read from the data when unset.")
    val_fraction: float = Field(0.0, ge=0, lt=1, description="Identities held out of training for validation pairs (identity-disjoint).")
    val_pairs: int = Field(2000, gt=0, description="Pairs drawn from the held-out identities.")
    val_bin: Path | None = Field(None, description="An InsightFace verification .bin used for validation instead.")
    workers: int = Field(2, ge=0, description="Data-loader worker processes per rank.")
    augment: AugmentConfig = AugmentConfig()
    license: dict[str, str] = Field(
        default_factory=lambda: {"name": "unspecified", "terms": "set data.license to the training data's terms"},
        description="Terms of the training data, copied into the exported model's manifest.",
    )


class HeadConfig(StrictModel):
    name: str = "arcface"
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of build_head, e.g. {s: 64, m: 0.5}.")
    sharded: bool = Field(False, description="Model-parallel FC: each rank holds num_classes / world_size rows.")
    sample_rate: float = Field(
        1.0, gt=0, le=1, description="Partial FC: fraction of each shard's classes used per step (positives always)."
    )


class OptimConfig(StrictModel):
    name: Literal["sgd", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "poly", "step", "constant"] = "cosine"
    poly_power: float = 2.0
    milestones: list[float] = Field(default_factory=lambda: [0.5, 0.75, 0.9], description="step schedule: fractions of training.")
    gamma: float = 0.1
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    grad_clip: float | None = Field(5.0, gt=0, description="Max global gradient norm; null = off.")
    accumulate: int = Field(1, ge=1, description="Micro-batches per optimizer step.")


class FinetuneConfig(StrictModel):
    """Recipe options for starting from trained weights (e.g. `backbone: dlib_resnet_v1`) on little data."""

    freeze_stages: int = Field(
        0, ge=0, description="The first N backbone stages (the stem counts as one) keep their weights and BN statistics."
    )
    backbone_lr_scale: float = Field(1.0, gt=0, description="The backbone's LR is optim.lr × this; the head keeps optim.lr.")
    bn_eval: bool = Field(
        False, description="Every BatchNorm in eval mode: running statistics frozen (scale and shift still learn unless frozen)."
    )
    l2_sp: float = Field(
        0.0,
        ge=0,
        description=(
            "L2-SP: α/2·‖w − w₀‖² towards the backbone's initial weights, in place of its plain weight decay; 0 = plain weight decay."
        ),
    )
    head_only_steps: int = Field(0, ge=0, description="Warm-up: the first N steps train the head only (backbone frozen, in eval mode).")


class TrainConfig(StrictModel):
    backbone: str = "iresnet50"
    backbone_params: dict[str, Any] = Field(default_factory=dict, description="e.g. {dropout: 0.0} for iresnets.")
    embedding_dim: int = Field(512, gt=0)
    head: HeadConfig = HeadConfig()
    data: DataConfig
    batch_size: int = Field(128, gt=0, description="Per rank, per micro-batch.")
    epochs: int | None = Field(None, gt=0)
    steps: int | None = Field(None, gt=0, description="Optimizer steps; overrides epochs.")
    optim: OptimConfig = OptimConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    amp: Literal["off", "bf16", "fp16"] = "off"
    channels_last: bool = False
    seed: int = 0
    output: Path = Path("runs/facegate")
    log_every: int = Field(10, gt=0)
    checkpoint_every: int = Field(1000, gt=0)
    val_every: int = Field(1000, gt=0)
    keep_checkpoints: int = Field(2, ge=1, description="Periodic checkpoints kept besides last.pt and best.pt.")

    @model_validator(mode="after")
    def _length(self) -> TrainConfig:
        if self.epochs is None and self.steps is None:
            raise ValueError("set epochs or steps")
        return self


def set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {key}: {part} is not a section")
    node[leaf] = value


def load_config(path: Path | None, overrides: Sequence[str] = (), base: dict | None = None) -> TrainConfig:
    """YAML file (or `base`) + `key=value` overrides → a validated config."""
    tree = dict(base or {})
    if path is not None:
        tree = yaml.safe_load(Path(path).read_text()) or {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        set_dotted(tree, key.strip(), yaml.safe_load(text))
    return TrainConfig.model_validate(tree)
