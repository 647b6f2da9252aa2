"""Backbones: aligned RGB faces (112×112, or the imported model's input for `dlib_resnet_v1`) → D-dim
embeddings. `build_backbone(name, embedding_dim)`; `stages(model)` for fine-tuning recipes. An imported
backbone starts from the imported model's weights: `weights=`, or the model cache's copy that the
settings the command read name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from service.core.settings import Settings
from training.backbones.dlib_resnet_v1 import DlibResNetV1, default_weights
from training.backbones.iresnet import STAGES, IResNet
from training.backbones.mobilefacenet import MobileFaceNet
from training.data.preprocess import for_backbone

# name → constructor taking (embedding_dim, **params)
_REGISTRY: dict[str, Callable[..., nn.Module]] = {name: partial(IResNet, layers) for name, layers in STAGES.items()}
_REGISTRY["mobilefacenet"] = MobileFaceNet
_REGISTRY["dlib_resnet_v1"] = DlibResNetV1
BACKBONES: tuple[str, ...] = tuple(_REGISTRY)


def build_backbone(name: str, embedding_dim: int = 512, settings: Settings | None = None, **params: object) -> nn.Module:
    """The backbone `name` (one of BACKBONES); params go to its constructor (e.g. iresnet dropout).
    `dlib_resnet_v1` without `weights` starts from the `.dat` in `settings`' model cache."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; choose one of: {', '.join(BACKBONES)}") from None
    if factory is DlibResNetV1 and "weights" not in params:
        if settings is None:
            raise ValueError("dlib_resnet_v1 starts from dlib's weights: give weights= or the settings naming the model cache")
        params["weights"] = default_weights(settings.models_dir, settings.model_cache)
    return factory(embedding_dim, **params)


def stages(model: nn.Module) -> list[list[nn.Module]]:
    """The backbone's stages, input to output (the stem first), as `finetune.freeze_stages` counts
    them; the embedding layers after the last stage are never among them."""
    if isinstance(model, DlibResNetV1):
        return [[stage] for stage in model.stages]
    if isinstance(model, IResNet):
        return [[model.conv1, model.bn1, model.prelu], [model.layer1], [model.layer2], [model.layer3], [model.layer4]]
    if isinstance(model, MobileFaceNet):
        return [[layer] for layer in model.layers]
    raise ValueError(f"{type(model).__name__} declares no stages")


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


def model_info(name: str, settings: Settings, embedding_dim: int = 512, **params: object) -> ModelInfo:
    """Parameter count and the FLOPs of one forward pass (the backbone's input size) in eval mode."""
    size = for_backbone(name, settings.models_dir).size
    model = build_backbone(name, embedding_dim, settings, **params).eval()
    count = sum(p.numel() for p in model.parameters())
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, size, size))
    return ModelInfo(name, embedding_dim, count, counter.get_total_flops())
