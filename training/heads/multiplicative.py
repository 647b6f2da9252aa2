"""Multiplicative angular margin: L-Softmax and SphereFace (A-Softmax), target cos(θ) → ψ(θ) ≈ cos(mθ).

cos(mθ) alone is not monotonic in θ, so the papers use ψ(θ) = (−1)^k·cos(mθ) − 2k on [kπ/m, (k+1)π/m],
which decreases from 1 to 1 − 2m over [0, π]. ψ is so hard to fit that training starts from the plain
logit and anneals towards ψ: the target is (λ·cosθ + ψ(θ))/(1 + λ) with λ shrinking with the iteration.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from training.heads.base import Head, apply_to_target, arccos


def chebyshev_cos(cos: Tensor, m: int) -> Tensor:
    """cos(mθ) as the Chebyshev polynomial T_m(cosθ): exact, and a polynomial has a finite gradient at
    cosθ = ±1 where a route through acos would not."""
    previous, current = torch.ones_like(cos), cos
    if m == 0:
        return previous
    for _ in range(m - 1):
        previous, current = current, 2 * cos * current - previous
    return current


def psi(cos: Tensor, m: int) -> Tensor:
    """ψ(θ) = (−1)^k·cos(mθ) − 2k for θ ∈ [kπ/m, (k+1)π/m], from cosθ. Continuous and strictly
    decreasing on [0, π]; equals cosθ for m = 1. k is read off θ without gradient (piecewise constant)."""
    with torch.no_grad():
        k = torch.floor(arccos(cos) * (m / math.pi)).clamp(0, m - 1)
        sign = 1 - 2 * torch.remainder(k, 2)
    return sign * chebyshev_cos(cos, m) - 2 * k


def lambda_schedule(iteration: int, base: float = 1000.0, gamma: float = 0.12, power: float = 1.0, lambda_min: float = 5.0) -> float:
    """λ = max(λ_min, base·(1 + γ·iteration)^(−power)): SphereFace's annealing, 1000 at the start,
    5 from iteration ≈ 1,660 on."""
    return max(lambda_min, base * (1 + gamma * iteration) ** (-power))


class SphereFace(Head):
    """A-Softmax: ‖W‖ = 1, target ‖x‖·(λcosθ_y + ψ(θ_y))/(1+λ), others ‖x‖cosθ_j.

    `iteration` is a buffer (saved with the state dict, so a resumed run continues the schedule),
    advanced by every training-mode call of `margin`; λ uses its value before the advance.
    With base = 0 and lambda_min = 0 the target is exactly ‖x‖ψ(θ_y).
    """

    iteration: Tensor  # the buffer registered in __init__ (nn.Module's attribute lookup is untyped)

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        m: int = 4,
        base: float = 1000.0,
        gamma: float = 0.12,
        power: float = 1.0,
        lambda_min: float = 5.0,
    ) -> None:
        super().__init__(embedding_dim, num_classes)
        if isinstance(m, bool) or int(m) != m or m < 1:
            raise ValueError(f"m must be an integer ≥ 1, got {m}")
        if base < 0 or lambda_min < 0 or gamma < 0:
            raise ValueError("base, gamma and lambda_min must be ≥ 0")
        self.m, self.base, self.gamma, self.power, self.lambda_min = int(m), base, gamma, power, lambda_min
        self.register_buffer("iteration", torch.zeros((), dtype=torch.long))

    @property
    def lam(self) -> float:
        """λ for the next call."""
        return lambda_schedule(int(self.iteration), self.base, self.gamma, self.power, self.lambda_min)

    def _lam(self, dtype: torch.dtype) -> Tensor:
        # Same formula as lambda_schedule, on the buffer's device: no host sync per step.
        iteration = self.iteration.to(dtype)
        return (self.base * (1 + self.gamma * iteration) ** (-self.power)).clamp(min=self.lambda_min)

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        lam = self._lam(cos.dtype)
        if self.training:
            with torch.no_grad():
                self.iteration += 1
        blended = apply_to_target(cos, labels, lambda c: (lam * c + psi(c, self.m)) / (1 + lam))
        return norms.unsqueeze(1) * blended

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, m={self.m}, base={self.base:g}, gamma={self.gamma:g}, "
            f"power={self.power:g}, lambda_min={self.lambda_min:g}"
        )


class LSoftmax(SphereFace):
    """L-Softmax: SphereFace's target with the class weight's norm kept, ‖w_y‖‖x‖·(λcosθ_y + ψ)/(1+λ);
    others w_j·x (no bias). The weight norm lets easy classes grow their logits, which A-Softmax removed."""

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        return super().margin(cos, labels, norms) * self.weight.to(cos.dtype).norm(dim=1)
