"""The model-parallel (sharded) classification head, with Partial FC.

With C identities and N ranks each rank holds ~C/N rows of the head's weight. The embeddings of the
whole global batch are all-gathered, each rank computes the cosines and margin logits of its own
classes only (the margin lands on the target column on the rank that owns it), and the softmax
cross-entropy is computed across ranks from three small all-reduces (row max, sum of exps, target
probability) — the full B×C logit matrix never exists on one device. Partial FC (An et al. 2022)
further samples a fraction r of each shard's classes per step, always keeping the batch's positives.

Supported heads: those whose margin needs only the target column and no running statistics —
cosface/amsoftmax, arcface, combined, msoftmax, normface (fixed s). Others are refused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from training.distributed.process_group import all_reduce, gather
from training.heads.additive import ArcFace, CombinedMargin, CosFace
from training.heads.base import IGNORE_INDEX, Head
from training.heads.loss import batch_stats
from training.heads.plain import ModifiedSoftmax, NormFace

SHARDABLE = (CosFace, CombinedMargin, ArcFace, ModifiedSoftmax, NormFace)


def shard_range(num_classes: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of the classes rank owns; the first C mod N ranks get one extra."""
    base, extra = divmod(num_classes, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class _ShardedCrossEntropy(torch.autograd.Function):
    """Mean softmax cross-entropy over the labelled rows of logits split by columns across ranks.
    The gradient w.r.t. the local logits is local: (softmax − one-hot) / n_labelled."""

    @staticmethod
    def forward(ctx, logits: Tensor, local_labels: Tensor, labelled: Tensor) -> Tensor:
        row_max = all_reduce(logits.max(dim=1).values, dist.ReduceOp.MAX)
        exp = torch.exp(logits - row_max.unsqueeze(1))
        prob = exp / all_reduce(exp.sum(dim=1)).unsqueeze(1)
        here = local_labels != IGNORE_INDEX
        target = torch.zeros_like(row_max)
        target[here] = prob[here, local_labels[here]]
        target = all_reduce(target)
        count = labelled.sum().clamp(min=1)
        loss = -(torch.log(target.clamp(min=1e-30)) * labelled).sum() / count
        ctx.save_for_backward(prob, local_labels, labelled, count)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        prob, local_labels, labelled, count = ctx.saved_tensors
        grad = prob.clone()
        here = (local_labels != IGNORE_INDEX).nonzero().squeeze(1)
        grad[here, local_labels[here]] -= 1
        grad *= (labelled.to(grad.dtype) / count).unsqueeze(1) * grad_loss
        return grad, None, None


class ShardedHead(nn.Module):
    """A head from build_head over this rank's classes, run model-parallel; forward → the loss."""

    sample_step: Tensor  # the buffer registered in __init__ (nn.Module's attribute lookup is untyped)

    def __init__(self, head: Head, num_classes: int, rank: int, world_size: int, sample_rate: float = 1.0, seed: int = 0) -> None:
        super().__init__()
        if type(head) not in SHARDABLE or getattr(head, "learn_scale", False):
            raise ValueError(
                f"{type(head).__name__} cannot be sharded; use one of cosface, amsoftmax, arcface, combined, msoftmax, normface"
            )
        self.start, self.stop = shard_range(num_classes, rank, world_size)
        if head.num_classes != self.stop - self.start:
            raise ValueError(f"head has {head.num_classes} classes, rank {rank} owns {self.stop - self.start}")
        self.head, self.num_classes, self.sample_rate, self.seed, self.rank = head, num_classes, sample_rate, seed, rank
        self.register_buffer("sample_step", torch.zeros((), dtype=torch.long))

    @property
    def weight(self) -> nn.Parameter:
        return self.head.weight

    def _local_labels(self, labels: Tensor) -> Tensor:
        local = labels - self.start
        mine = (labels != IGNORE_INDEX) & (local >= 0) & (local < self.stop - self.start)
        return torch.where(mine, local, torch.full_like(local, IGNORE_INDEX))

    def _sample(self, local: Tensor) -> tuple[Tensor, Tensor]:
        """Partial FC: the rows used this step (every positive, random negatives up to r·C_local)
        and the labels renumbered into them. Seeded by (seed, rank, step): resumable."""
        n = self.head.weight.shape[0]
        keep = max(int(self.sample_rate * n), 1)
        if not self.training or keep >= n:
            return self.head.weight, local
        generator = torch.Generator().manual_seed(hash((self.seed, self.rank, int(self.sample_step))) & 0x7FFFFFFF)
        self.sample_step += 1
        score = torch.rand(n, generator=generator).to(local.device)
        positives = local[local != IGNORE_INDEX]
        score[positives] = 2.0
        index = torch.topk(score, max(keep, int(positives.unique().numel())), sorted=False).indices.sort().values
        remap = torch.full((n,), IGNORE_INDEX, dtype=torch.long, device=local.device)
        remap[index] = torch.arange(len(index), device=local.device)
        return self.head.weight[index], torch.where(local != IGNORE_INDEX, remap[local.clamp(min=0)], local)

    def shard_logits(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """This rank's columns of the global batch's logits (the sampled ones under Partial FC), the
        labels numbered within them (−1: another rank's class), and the global labelled-row mask."""
        x_all = gather(embeddings)
        labels_all = gather(labels.long(), grad=False)
        weight, local = self._sample(self._local_labels(labels_all))
        with torch.autocast(x_all.device.type, enabled=False):
            x = x_all.float()
            cos = F.linear(F.normalize(x, dim=1), F.normalize(weight.float(), dim=1))
            return self.head.margin(cos, local, x.norm(dim=1)), local, labels_all != IGNORE_INDEX

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return _ShardedCrossEntropy.apply(*self.shard_logits(embeddings, labels))

    @torch.no_grad()
    def stats(self, embeddings: Tensor, labels: Tensor) -> dict[str, float]:
        """Training accuracy (nearest class centre by cosine over all ranks' classes), mean target
        angle θ_y in degrees and mean feature norm, for the global batch."""
        x = gather(embeddings.float(), grad=False)
        labels_all = gather(labels.long(), grad=False)
        cos = F.linear(F.normalize(x, dim=1), F.normalize(self.head.weight.float(), dim=1))
        best, where = cos.max(dim=1)
        bests, wheres = gather(best.unsqueeze(0), grad=False), gather((where + self.start).unsqueeze(0), grad=False)
        predicted = wheres.gather(0, bests.argmax(dim=0, keepdim=True)).squeeze(0)
        local = self._local_labels(labels_all)
        here = local != IGNORE_INDEX
        target = torch.zeros(len(x), device=x.device)
        target[here] = cos[here, local[here]]
        return batch_stats(x, predicted, labels_all, all_reduce(target))
