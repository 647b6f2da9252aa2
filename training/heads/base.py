"""What every head shares: the class-weight parameter, float32 cosines, the target column, the loss.

A cosine head is two steps, kept apart so a sharded (model-parallel) FC can reuse the second one:
`cosine(x)` gives cosθ_j = ŵ_j·x̂ and `margin(cos, labels, norms)` turns those cosines into the final,
scaled logits. Label −1 marks a row without a class (ignored by the loss, no margin).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

IGNORE_INDEX = -1

# cosθ is clamped to [−1+EPS, 1−EPS] before acos: d acos(c)/dc = −1/sqrt(1−c²) is infinite at ±1.
# In float32, 1 − 1e-7 rounds to 1 − 2⁻²³: off ±1, yet θ moves by at most 5·10⁻⁴ rad.
EPS = 1e-7


def compute_dtype(tensor: Tensor) -> torch.dtype:
    """float32 for everything narrower (bf16/fp16 logits lose the margin), float64 kept for gradcheck."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def check_labels(labels: Tensor, batch: int) -> Tensor:
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
    if labels.shape != (batch,):
        raise ValueError(f"labels must have shape ({batch},), got {tuple(labels.shape)}")
    return labels.long()


def arccos(cos: Tensor) -> Tensor:
    """θ with a finite gradient everywhere, also at cosθ = ±1."""
    return torch.acos(cos.clamp(-1 + EPS, 1 - EPS))


def apply_to_target(cos: Tensor, labels: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """`cos` with each labelled row's column y replaced by `fn(cosθ_y)`; rows labelled −1 unchanged.

    Out of place (gather → where → scatter), so autograd sees every step. `fn` gets the target cosine
    of every row (rows labelled −1 read column 0) and must return one value per row; its results on
    unlabelled rows are discarded, so it only has to be finite there.
    """
    labelled = labels != IGNORE_INDEX
    index = labels.clamp(min=0).unsqueeze(1)
    target = cos.gather(1, index).squeeze(1)
    return cos.scatter(1, index, torch.where(labelled, fn(target), target).unsqueeze(1))


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labelled rows; 0 (with zero gradients) when no row is labelled,
    where `F.cross_entropy(..., ignore_index=-1)` would return nan."""
    total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1)


def mean_over_ranks(value: Tensor, present: bool) -> Tensor | None:
    """`value` averaged over the DDP ranks that have one, None if none has.

    Keeps a head's running statistics identical on every rank. Collective: every rank must call it,
    also a rank whose batch gave it no value (`present=False`).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return value if present else None
    value = value if present else torch.zeros_like(value)
    packed = torch.cat([value.reshape(-1), value.new_tensor([1.0 if present else 0.0])])
    dist.all_reduce(packed)
    count = float(packed[-1])
    return (packed[:-1] / count).reshape(value.shape) if count > 0 else None


class Head(nn.Module):
    """Base class: owns `weight` (num_classes × embedding_dim) and runs in float32 under autocast.

    Subclasses implement `margin` (cosine heads) or override `logits` (heads that are not cosine-based).
    """

    def __init__(self, embedding_dim: int, num_classes: int, rows: int | None = None) -> None:
        super().__init__()
        if embedding_dim < 1 or num_classes < 1:
            raise ValueError(f"embedding_dim and num_classes must be ≥ 1, got {embedding_dim}, {num_classes}")
        self.embedding_dim = embedding_dim
        self.num_classes = num_classes
        self.weight = nn.Parameter(torch.empty(rows or num_classes, embedding_dim))
        nn.init.normal_(self.weight, std=0.01)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """(batch, embedding_dim) un-normalized embeddings, (batch,) labels → (batch, num_classes) logits."""
        labels = check_labels(labels, embeddings.shape[0])
        with torch.autocast(embeddings.device.type, enabled=False):
            x = embeddings.to(compute_dtype(embeddings))
            return self.logits(x, labels)

    def logits(self, x: Tensor, labels: Tensor) -> Tensor:
        return self.margin(self.cosine(x), labels, x.norm(dim=1))

    def cosine(self, x: Tensor) -> Tensor:
        """cosθ_j = ŵ_j·x̂, shape (batch, num_classes)."""
        return F.linear(F.normalize(x, dim=1), F.normalize(self.weight.to(x.dtype), dim=1))

    def margin(self, cos: Tensor, labels: Tensor, norms: Tensor) -> Tensor:
        """Cosine logits (batch, num_classes), labels, ‖x‖ (batch,) → final scaled logits."""
        raise NotImplementedError(f"{type(self).__name__} logits are not computed from cosines")

    def loss(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """The training loss: cross-entropy over the labelled rows (+ the head's own terms)."""
        return cross_entropy(self(embeddings, labels), labels)

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, num_classes={self.num_classes}"


def head_scale(head: Head) -> float | None:
    """The head's logit scale s, where it has one (fixed, learned or adaptive)."""
    s = getattr(head, "s", None)
    return None if s is None else float(s)
