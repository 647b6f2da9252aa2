"""Backbones: 112×112 aligned RGB faces → D-dim embeddings. `build_backbone(name, embedding_dim)`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import nn

from training.backbones.iresnet import STAGES, IResNet
from training.backbones.mobilefacenet import MobileFaceNet

INPUT_SIZE = 112

# name → constructor taking (embedding_dim, **params)
_REGISTRY: dict[str, Callable[..., nn.Module]] = {name: partial(IResNet, layers) for name, layers in STAGES.items()}
_REGISTRY["mobilefacenet"] = MobileFaceNet
BACKBONES: tuple[str, ...] = tuple(_REGISTRY)


def build_backbone(name: str, embedding_dim: int = 512, **params: object) -> nn.Module:
    """The backbone `name` (one of BACKBONES); params go to its constructor (e.g. iresnet dropout)."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)}") from None
    return factory(embedding_dim, **params)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    embedding_dim: int
    params: int
    flops: int  # multiply and add counted apart (2 per MAC), as torch's FlopCounterMode counts

    @property
    def gmacs(self) -> float:
        """What arcface_torch's README calls GFLOPs (ptflops counts multiply-accumulates)."""
        return self.flops / 2e9


def model_info(name: str, embedding_dim: int = 512, **params: object) -> ModelInfo:
    """Parameter count and the FLOPs of one 112×112 forward pass in eval mode."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_backbone(name, embedding_dim, **params).eval()
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, INPUT_SIZE, INPUT_SIZE))
    return ModelInfo(name, embedding_dim, params, counter.get_total_flops())
