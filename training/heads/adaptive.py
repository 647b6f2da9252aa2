"""Heads whose scale or margin adapts during training: AdaCos (scale), CurricularFace (hard negatives),
MagFace and AdaFace (margin from the feature norm). Running statistics are buffers: saved with the
state dict, updated only by training-mode calls, averaged across DDP ranks."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from training.heads.additive import ArcFace, angular_margin, check_edge
from training.heads.base import EPS, IGNORE_INDEX, Head, apply_to_target, arccos, compute_dtype, cross_entropy, mean_over_ranks


class AdaCos(Head):
    """s·cosθ_j with no margin and no scale to tune: s = √2·ln(C−1) keeps the target's softmax
    probability responsive over the useful range of θ (AdaCos, fixed).

    `dynamic=True` (dynamic AdaCos) re-estimates s on every training-mode batch, before computing
    that batch's logits: s ← ln(B_avg) / cos(min(π/4, θ_med)), B_avg the batch mean of
    Σ_{j≠y} exp(s_old·cosθ_j), θ_med the median (torch.median: the lower one) of the target angles.
    """

    s: Tensor  # the buffer registered in __init__ (nn.Module's attribute lookup is untyped)

    def __init__(self, embedding_dim: int, num_classes: int, dynamic: bool = False) -> None:
        if num_classes < 3:
            raise ValueError(f"AdaCos needs num_classes ≥ 3 (s = √2·ln(C−1) > 0), got {num_classes}")
        super().__init__(embedding_dim, num_classes)
        self.dynamic = dynamic
        self.register_buffer("s", torch.tensor(math.sqrt(2) * math.log(num_classes - 1)))

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        if self.dynamic and self.training:
            self._update_scale(cos, labels)
        # A copy: the buffer changes in place on the next batch, autograd must not have saved it.
        return cos * self.s.to(cos.dtype, copy=True)

    @torch.no_grad()
    def _update_scale(self, cos: Tensor, labels: Tensor) -> None:
        labelled = labels != IGNORE_INDEX
        count = int(labelled.sum())
        scale = self.s.to(torch.float32)
        if count:
            cos, target = cos[labelled].float(), labels[labelled].unsqueeze(1)
            theta_med = arccos(cos.gather(1, target)).median()
            others = (scale * cos).scatter(1, target, -math.inf)
            log_b_avg = torch.logsumexp(others.flatten(), 0) - math.log(count)
            scale = log_b_avg / torch.cos(theta_med.clamp(max=math.pi / 4))
        averaged = mean_over_ranks(scale, present=count > 0)
        if averaged is not None:
            self.s.copy_(averaged)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, s={float(self.s):.4g}, dynamic={self.dynamic}"


class CurricularFace(ArcFace):
    """ArcFace target, and hard negatives (cosθ_j > cos(θ_y + m)) re-weighted to cosθ_j·(t + cosθ_j).

    t is an EMA of the mean target cosine (t ← 0.01·mean + 0.99·t, updated before use, as the paper's
    code does): early on t ≈ 0 and hard negatives are damped (easy samples first); as the targets
    converge t grows and hard negatives weigh more than plain ones (the curriculum).
    """

    t: Tensor  # the buffer registered in __init__ (nn.Module's attribute lookup is untyped)

    def __init__(
        self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.5, alpha: float = 0.01, edge: str = "threshold"
    ) -> None:
        super().__init__(embedding_dim, num_classes, s=s, m=m, edge=edge)
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.register_buffer("t", torch.zeros(()))

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        labelled = labels != IGNORE_INDEX
        index = labels.clamp(min=0).unsqueeze(1)
        target = cos.gather(1, index)
        if self.training:
            self._update_t(target.squeeze(1), labelled)
        with torch.no_grad():
            hard = (cos > torch.cos(arccos(target) + self.m)) & labelled.unsqueeze(1)
            hard = hard.scatter(1, index, False)  # the target column gets the margin, not the re-weighting
        t = self.t.to(cos.dtype, copy=True)
        reweighted = torch.where(hard, cos * (t + cos), cos)
        return self.s * apply_to_target(reweighted, labels, self.target)

    @torch.no_grad()
    def _update_t(self, target: Tensor, labelled: Tensor) -> None:
        count = int(labelled.sum())
        mean = target[labelled].float().mean() if count else self.t.float()
        averaged = mean_over_ranks(mean, present=count > 0)
        if averaged is not None:
            self.t.copy_(self.alpha * averaged + (1 - self.alpha) * self.t)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha:g}"


class MagFace(Head):
    """ArcFace with a margin that grows linearly with the feature norm a = clamp(‖x‖, l_a, u_a), from
    l_m at l_a to u_m at u_a, plus the loss term λ_g·mean(a/u_a² + 1/a) that rewards large norms.
    Together they make ‖x‖ a quality score: only samples that can afford the larger margin (clean,
    close to their centre) are pushed to large norms."""

    def __init__(
        self,
        embedding_dim: int,
        num_classes: int,
        s: float = 64.0,
        l_a: float = 10.0,
        u_a: float = 110.0,
        l_m: float = 0.45,
        u_m: float = 0.8,
        lambda_g: float = 35.0,
        edge: str = "threshold",
    ) -> None:
        super().__init__(embedding_dim, num_classes)
        if s <= 0 or not 0 < l_a < u_a:
            raise ValueError(f"need s > 0 and 0 < l_a < u_a, got s={s}, l_a={l_a}, u_a={u_a}")
        self.s, self.l_a, self.u_a, self.l_m, self.u_m, self.lambda_g = float(s), l_a, u_a, l_m, u_m, lambda_g
        self.edge = check_edge(edge)

    def margin_for(self, norms: Tensor) -> Tensor:
        """m(a), linear in the clamped norm a."""
        a = norms.clamp(self.l_a, self.u_a)
        return self.l_m + (self.u_m - self.l_m) * (a - self.l_a) / (self.u_a - self.l_a)

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        m = self.margin_for(norms)
        return self.s * apply_to_target(cos, labels, lambda c: angular_margin(c, m2=m, edge=self.edge))

    def regularizer(self, embeddings: Tensor) -> Tensor:
        """mean(a/u_a² + 1/a) over all rows (it needs no label); minimal at a = u_a."""
        with torch.autocast(embeddings.device.type, enabled=False):
            a = embeddings.to(compute_dtype(embeddings)).norm(dim=1).clamp(self.l_a, self.u_a)
            return (a / self.u_a**2 + 1 / a).mean()

    def loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return cross_entropy(self(embeddings, labels), labels) + self.lambda_g * self.regularizer(embeddings)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, s={self.s:g}, l_a={self.l_a:g}, u_a={self.u_a:g}, l_m={self.l_m:g}, "
            f"u_m={self.u_m:g}, lambda_g={self.lambda_g:g}, edge={self.edge}"
        )


class AdaFace(Head):
    """Norm-adaptive margin: ẑ = clip(h·(‖x‖ − μ)/(σ + 10⁻³), −1, 1) from EMA batch statistics of the
    (detached) norms, target s·(cos(clip(θ − m·ẑ, ε, π−ε)) − (m + m·ẑ)).

    The norm is the image-quality proxy. Low-norm (poor) samples get ẑ → −1, ArcFace's cos(θ + m),
    whose gradient shrinks for hard samples (large θ): hopeless images stop dominating. ẑ = 0 is
    CosFace's cosθ − m. High-norm (good) samples get ẑ → +1, cos(θ − m) − 2m, a negative angular
    margin whose gradient grows with θ: hard but recognizable samples get the emphasis. μ, σ start at
    the paper code's 20 and 100 and move by alpha per training-mode batch (updated before use, over
    every row: a norm needs no label).
    """

    norm_mean: Tensor  # the buffers registered in __init__ (nn.Module's attribute lookup is untyped)
    norm_std: Tensor

    def __init__(
        self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.4, h: float = 0.333, alpha: float = 0.01
    ) -> None:
        super().__init__(embedding_dim, num_classes)
        if s <= 0 or h <= 0 or not 0 < alpha <= 1:
            raise ValueError(f"need s > 0, h > 0 and alpha in (0, 1], got s={s}, h={h}, alpha={alpha}")
        self.s, self.m, self.h, self.alpha = float(s), float(m), float(h), float(alpha)
        self.register_buffer("norm_mean", torch.tensor(20.0))
        self.register_buffer("norm_std", torch.tensor(100.0))

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        with torch.no_grad():
            norms = norms.clamp(1e-3, 100)
            if self.training:
                self._update_statistics(norms)
            z_hat = (self.h * (norms - self.norm_mean) / (self.norm_std + 1e-3)).clamp(-1, 1).to(cos.dtype)

        def target(c: Tensor) -> Tensor:
            angle = (arccos(c) - self.m * z_hat).clamp(EPS, math.pi - EPS)
            return torch.cos(angle) - (self.m + self.m * z_hat)

        return self.s * apply_to_target(cos, labels, target)

    def _update_statistics(self, norms: Tensor) -> None:
        present = norms.numel() >= 2  # an unbiased std needs two rows
        stats = torch.stack([norms.mean(), norms.std()]).float() if present else torch.zeros(2, device=norms.device)
        averaged = mean_over_ranks(stats, present)
        if averaged is not None:
            self.norm_mean.copy_(self.alpha * averaged[0] + (1 - self.alpha) * self.norm_mean)
            self.norm_std.copy_(self.alpha * averaged[1] + (1 - self.alpha) * self.norm_std)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, s={self.s:g}, m={self.m:g}, h={self.h:g}, alpha={self.alpha:g}"
