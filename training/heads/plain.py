"""Heads without a margin: the softmax baseline and the two normalizations the margins build on."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.heads.base import Head


class Softmax(Head):
    """Plain softmax, w_j·x + b_j: the baseline the margin papers compare against. Not cosine-based
    (features can separate by norm as well as by angle), so it has no `margin` step."""

    def __init__(self, embedding_dim: int, num_classes: int) -> None:
        super().__init__(embedding_dim, num_classes)
        self.bias = nn.Parameter(torch.zeros(num_classes))

    def logits(self, x: Tensor, labels: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))


class ModifiedSoftmax(Head):
    """‖W‖ = 1, no bias: ‖x‖cosθ_j (SphereFace's "modified softmax"). The decision depends on the
    angle only, but ‖x‖ still acts as a per-sample scale."""

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        return norms.unsqueeze(1) * cos


class NormFace(Head):
    """s·cosθ_j (NormFace / normalized softmax). Normalizing both sides caps the logits to [−s, s],
    so s must be large enough for the softmax to get confident; `learn_scale` makes s a parameter."""

    def __init__(self, embedding_dim: int, num_classes: int, s: float = 30.0, learn_scale: bool = False) -> None:
        super().__init__(embedding_dim, num_classes)
        if s <= 0:
            raise ValueError(f"s must be > 0, got {s}")
        self.learn_scale = learn_scale
        self.s: Tensor | float
        if learn_scale:
            self.s = nn.Parameter(torch.tensor(float(s)))
        else:
            self.s = float(s)

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        scale = self.s.to(cos.dtype) if isinstance(self.s, Tensor) else self.s  # a Parameter iff learn_scale
        return scale * cos

    def extra_repr(self) -> str:
        s = float(self.s.detach() if isinstance(self.s, Tensor) else self.s)
        return f"{super().extra_repr()}, s={s:g}, learn_scale={self.learn_scale}"
