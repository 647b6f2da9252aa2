"""Additive margins on the normalized hypersphere: CosFace/AM-Softmax (cosine margin), ArcFace (angular
margin), the combined margin, and sub-center ArcFace. All are s·f(cosθ_y) on the target, s·cosθ_j else."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from training.heads.base import Head, apply_to_target, arccos

EDGES = ("threshold", "easy", "clamp")


def cosface_scale_lower_bound(num_classes: int, p_w: float, margin: float = 0.0) -> float:
    """The smallest s with which a sample sitting exactly on its class centre can still reach the
    posterior `p_w`, even with the C class centres spread as far apart as possible (a regular simplex,
    mean inter-class cosine −1/(C−1)).

    With margin = 0 this is the CosFace paper's bound s ≥ (C−1)/C · ln((C−1)·P_W/(1−P_W)); with a cosine
    margin m the target logit is s·(1−m), which gives s ≥ ln((C−1)·P_W/(1−P_W)) / (C/(C−1) − m).
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be ≥ 2, got {num_classes}")
    if not 0 < p_w < 1:
        raise ValueError(f"p_w must be in (0, 1), got {p_w}")
    gap = num_classes / (num_classes - 1) - margin
    if gap <= 0:
        raise ValueError(f"margin {margin} leaves no scale that reaches p_w (needs margin < C/(C−1))")
    return math.log((num_classes - 1) * p_w / (1 - p_w)) / gap


def angular_margin(cos: Tensor, m1: float = 1.0, m2: float | Tensor = 0.0, m3: float = 0.0, edge: str = "threshold") -> Tensor:
    """cos(m1·θ + m2) − m3 from cosθ, with `edge` deciding what happens past m1·θ + m2 = π, where
    cos(m1·θ + m2) would turn back up (docs/heads.md, "Why ψ, and every target curve, must stay monotonically decreasing"):

    - threshold: where cosθ ≤ cos(π − m2), use cosθ − m2·sin(m2) − m3 (InsightFace; needs m1 = 1);
    - easy: margin only where cosθ > 0, plain cosθ elsewhere (not monotonic: jumps up at 90°);
    - clamp: m1·θ + m2 capped at π (flat at −1 − m3, no gradient there).

    `m2` may be a tensor of per-row margins (MagFace).
    """
    m2 = torch.as_tensor(m2, dtype=cos.dtype, device=cos.device)
    angle = m1 * arccos(cos) + m2
    if edge == "clamp":
        return torch.cos(angle.clamp(max=math.pi)) - m3
    target = torch.cos(angle) - m3
    if edge == "easy":
        return torch.where(cos > 0, target, cos)
    return torch.where(cos > -torch.cos(m2), target, cos - m2 * torch.sin(m2) - m3)


def check_edge(edge: str, m1: float = 1.0) -> str:
    if edge not in EDGES:
        raise ValueError(f"edge must be one of {', '.join(EDGES)}; got {edge!r}")
    if edge == "threshold" and m1 != 1:
        raise ValueError(f"edge='threshold' is defined for m1 = 1 only (got m1={m1}); use edge='clamp'")
    return edge


class CosFace(Head):
    """CosFace (LMCL) / AM-Softmax: s·(cosθ_y − m). The margin is a constant in cosine space, so the
    target curve is cos shifted down: monotonic by construction, no edge case at θ = π."""

    def __init__(self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.35) -> None:
        super().__init__(embedding_dim, num_classes)
        if s <= 0:
            raise ValueError(f"s must be > 0, got {s}")
        self.s, self.m = float(s), float(m)

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        return self.s * apply_to_target(cos, labels, lambda c: c - self.m)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, s={self.s:g}, m={self.m:g}"


class CombinedMargin(Head):
    """InsightFace's combined margin s·(cos(m1·θ_y + m2) − m3): SphereFace's m1, ArcFace's m2 and
    CosFace's m3 in one head."""

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        s: float = 64.0,
        m1: float = 1.0,
        m2: float = 0.3,
        m3: float = 0.2,
        edge: str = "threshold",
        rows: int | None = None,
    ) -> None:
        super().__init__(embedding_dim, num_classes, rows)
        if s <= 0:
            raise ValueError(f"s must be > 0, got {s}")
        self.s, self.m1, self.m2, self.m3 = float(s), float(m1), float(m2), float(m3)
        self.edge = check_edge(edge, m1)

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        return self.s * apply_to_target(cos, labels, self.target)

    def target(self, cos: Tensor) -> Tensor:
        """The target column's value before scaling."""
        return angular_margin(cos, self.m1, self.m2, self.m3, self.edge)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, s={self.s:g}, m1={self.m1:g}, m2={self.m2:g}, m3={self.m3:g}, edge={self.edge}"


class ArcFace(CombinedMargin):
    """ArcFace: s·cos(θ_y + m), an additive angular margin (geodesic distance on the sphere)."""

    def __init__(
        self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.5, edge: str = "threshold", rows: int | None = None
    ) -> None:
        super().__init__(embedding_dim, num_classes, s=s, m1=1.0, m2=m, m3=0.0, edge=edge, rows=rows)
        self.m = float(m)

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}, s={self.s:g}, m={self.m:g}, edge={self.edge}"


class SubCenterArcFace(ArcFace):
    """Sub-center ArcFace: k weight rows per class (class-major: rows c·k … c·k+k−1), cosθ_j is the
    best of the class's k sub-centres. Noisy samples gather at non-dominant sub-centres instead of
    pulling the dominant one away from the clean ones."""

    def __init__(self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.5, k: int = 3, edge: str = "threshold") -> None:
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be an integer ≥ 1, got {k}")
        super().__init__(embedding_dim, num_classes, s=s, m=m, edge=edge, rows=num_classes * int(k))
        self.k = int(k)

    def cosine(self, x: Tensor) -> Tensor:
        return super().cosine(x).view(x.shape[0], self.num_classes, self.k).amax(dim=2)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}"
