"""A head as the training loop uses it: a loss module (what DDP wraps) and its batch statistics."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from training.heads.base import IGNORE_INDEX, Head


def batch_stats(x: Tensor, predicted: Tensor, labels: Tensor, target: Tensor) -> dict[str, float]:
    """Accuracy of the predicted classes, mean target angle θ_y in degrees (from the target cosines)
    and mean feature norm, over the labelled rows (the norm over all rows)."""
    labelled = labels != IGNORE_INDEX
    return {
        "accuracy": float((predicted == labels)[labelled].float().mean()),
        "theta_y": float(torch.rad2deg(torch.acos(target[labelled].clamp(-1, 1))).mean()),
        "feature_norm": float(x.norm(dim=1).mean()),
    }


class HeadLoss(nn.Module):
    """A whole (unsharded) head as a loss module, so DDP can wrap it when ranks > 1."""

    def __init__(self, head: Head) -> None:
        super().__init__()
        self.head = head

    @property
    def weight(self) -> nn.Parameter:
        return self.head.weight

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return self.head.loss(embeddings, labels)

    @torch.no_grad()
    def stats(self, embeddings: Tensor, labels: Tensor) -> dict[str, float]:
        """Training accuracy (nearest class centre by cosine), mean θ_y and mean ‖x‖ of this rank's batch."""
        x = embeddings.float()
        cos = self.head.cosine(x)
        target = cos.gather(1, labels.clamp(min=0).long().unsqueeze(1)).squeeze(1)
        return batch_stats(x, cos.argmax(dim=1), labels, target)
