"""dlib's face recognition ResNet (`dlib-resnet-v1`, the default embedder) as a torch module, built
from the one description `service.core.models.dlib_resnet.read_dat` makes of the `.dat` (the same the
ONNX importer builds from), so fine-tuning starts exactly where the imported model is.

dlib saved its batch norms folded into per-channel affines: here they are `Affine` layers whose
scale and shift may learn but which have no batch statistics, so the network behaves the same in
train and eval mode (a frozen prefix's activations can be cached exactly). Input: 150×150 RGB
normalized as the imported model's manifest says ((pixel − mean) / 256); output: the raw 128-d
descriptor.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from service.core.errors import ModelError
from service.core.models import dlib_resnet as dat
from service.core.models.files import manifest_path, place_weights
from service.core.models.manifest import Manifest

MODEL_NAME = "dlib-resnet-v1"  # the imported model this backbone starts from (models/MODEL_NAME.json)


def _conv(c: dat.Conv) -> nn.Conv2d:
    out_ch, in_ch, k, _ = c.weight.shape
    conv = nn.Conv2d(in_ch, out_ch, k, stride=c.stride, padding=c.pad)
    conv.load_state_dict({"weight": torch.from_numpy(c.weight), "bias": torch.from_numpy(c.bias)})
    return conv


def _pool(p: dat.Pool) -> nn.Module:
    cls = nn.MaxPool2d if p.kind == "max" else nn.AvgPool2d
    return cls(p.kernel, p.stride, p.pad)


class Affine(nn.Module):
    """dlib's affine_ layer (batch norm folded at save time): y = scale[c]·x + shift[c]."""

    def __init__(self, a: dat.Affine) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.from_numpy(a.scale.copy()).view(1, -1, 1, 1))
        self.shift = nn.Parameter(torch.from_numpy(a.shift.copy()).view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale + self.shift


def _add_prev(y: Tensor, s: Tensor) -> Tensor:
    """dlib's add_prev: both operands zero-padded at the end of each axis to the larger shape."""
    target = dat.add_prev_shape(tuple(y.shape[1:]), tuple(s.shape[1:]))

    def pad(t: Tensor) -> Tensor:
        c, h, w = dat.add_prev_pads(tuple(t.shape[1:]), target)
        return F.pad(t, (0, w, 0, h, 0, c)) if c or h or w else t

    return pad(y) + pad(s)


class Block(nn.Module):
    def __init__(self, b: dat.Block) -> None:
        super().__init__()
        self.conv1, self.bn1 = _conv(b.conv1), Affine(b.bn1)
        self.conv2, self.bn2 = _conv(b.conv2), Affine(b.bn2)
        self.down = _pool(b.down) if b.down is not None else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(_add_prev(y, x if self.down is None else self.down(x)))


class DlibResNetV1(nn.Module):
    """`stages`: the stem, then the five resolution stages; `fc`: the 256 → 128 projection (no bias)."""

    def __init__(self, embedding_dim: int = 128, *, weights: str | Path) -> None:
        super().__init__()
        net = dat.read_dat(Path(weights))
        if embedding_dim != net.fc_weight.shape[0]:
            raise ValueError(f"dlib_resnet_v1 gives {net.fc_weight.shape[0]}-d embeddings, not {embedding_dim} (set embedding_dim: 128)")
        stem = nn.Sequential(_conv(net.stem_conv), Affine(net.stem_bn), nn.ReLU(), _pool(net.stem_pool))
        self.stages = nn.ModuleList([stem] + [nn.Sequential(*map(Block, group)) for group in net.stages()])
        self.fc = nn.Linear(net.fc_weight.shape[1], net.fc_weight.shape[0], bias=False)
        self.fc.weight.data.copy_(torch.from_numpy(net.fc_weight))

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """The descriptor; with `start`, x is the output of stages[:start] (a cached frozen prefix)."""
        for stage in self.stages[start:]:
            x = stage(x)
        return self.fc(x.mean(dim=(2, 3)))

    def prefix(self, x: Tensor, stop: int, start: int = 0) -> Tensor:
        """The output of stages[:stop] (x: that of stages[:start]), which `forward(·, start=stop)` continues from."""
        for stage in self.stages[start:stop]:
            x = stage(x)
        return x


def default_weights(models_dir: Path, model_cache: Path) -> Path:
    """dlib's published `.dat` in `model_cache` (placed there, sha256-checked, by
    `facegate models pull dlib-resnet-v1`; fetched now if absent), as its manifest in `models_dir` names it."""
    manifest = Manifest.load(manifest_path(MODEL_NAME, models_dir))
    if manifest.file.source is None:
        raise ModelError(f"{MODEL_NAME}'s manifest names no published weights (file.source) to start from")
    return place_weights(manifest.file.source, model_cache)
