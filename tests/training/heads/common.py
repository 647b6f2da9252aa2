"""Helpers the head tests share (no tests here): a small problem size, well-conditioned heads, and
the target-logit curve of a head over θ."""

from __future__ import annotations

import torch

from training.heads import build_head

D, C = 4, 5


def make_head(name: str, seed: int = 0, **params):
    torch.manual_seed(seed)
    head = build_head(name, D, C, **params).double().eval()
    with torch.no_grad():
        head.weight.normal_()  # well-conditioned weights (the default init is std 0.01)
        if name == "softmax":
            head.bias.normal_()
        if name == "curricularface":
            head.t.fill_(0.4)
        if name == "adaface":  # with norms 0.5…150 (edge_batch), ẑ covers −1…1 and both clips
            head.norm_mean.fill_(50.0)
            head.norm_std.fill_(10.0)
        if name in ("lsoftmax", "sphereface"):
            head.iteration.fill_(1000)  # λ ≈ 8.3, both parts of the blend matter
    return head


def target_curve(head, theta: torch.Tensor, norm: float = 1.0) -> torch.Tensor:
    """The target logit of a sample at angle θ from its class weight (class 0)."""
    w = torch.nn.functional.normalize(head.weight.detach()[0], dim=0)
    other = torch.nn.functional.normalize(torch.randn(w.shape[0], dtype=w.dtype, generator=torch.Generator().manual_seed(0)), dim=0)
    other = torch.nn.functional.normalize(other - (other @ w) * w, dim=0)
    x = norm * (torch.cos(theta)[:, None] * w + torch.sin(theta)[:, None] * other)
    return head(x, torch.zeros(len(theta), dtype=torch.long))[:, 0].detach()
