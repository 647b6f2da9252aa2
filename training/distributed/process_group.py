"""The process group torchrun sets up, and the collectives the training code uses, each a no-op
(or the identity) in a single-process run."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    """torchrun's environment → an initialized process group (nccl on GPUs, gloo on CPU); a plain
    `python -m training` run is rank 0 of 1 without a process group."""
    cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:
        return Dist(0, 1, 0, torch.device("cuda" if cuda else "cpu"))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, device)


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sums every rank's gradient for this rank's rows and multiplies by
    world_size, so that DDP's gradient *averaging* of the backbone yields the global-batch gradient."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        rank, size = world()
        ctx.rank, ctx.size, ctx.rows = rank, size, x.shape[0]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows] * ctx.size


def gather(x: Tensor, grad: bool = True) -> Tensor:
    rank, size = world()
    if size == 1:
        return x
    if grad:
        return _GatherWithGrad.apply(x)
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def all_reduce(x: Tensor, op=None) -> Tensor:
    """`x` reduced in place over the ranks (sum unless `op`), when there is more than one."""
    if world()[1] > 1:
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM)
    return x
