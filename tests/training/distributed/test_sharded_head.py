"""The model-parallel head: 2 gloo processes on CPU give the logits, loss and gradients of 1."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.distributed.sharded_head import ShardedHead, shard_range
from training.heads import build_head

B, D, C = 6, 16, 11  # C odd: shards of 6 and 5 classes


def _inputs(name: str):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * B, D, generator=g)
    labels = torch.randint(0, C, (2 * B,), generator=g)
    labels[3] = -1  # an unlabelled row: no margin, not in the loss
    full = build_head(name, D, C, s=16.0)
    with torch.no_grad():
        full.weight.copy_(torch.randn(C, D, generator=g))
    return x, labels, full


def _sharded(full, name: str, rank: int, world: int) -> ShardedHead:
    start, stop = shard_range(C, rank, world)
    head = build_head(name, D, stop - start, s=16.0)
    with torch.no_grad():
        head.weight.copy_(full.weight[start:stop])
    return ShardedHead(head, C, rank, world)


HEADS = ("arcface", "cosface")


def _worker(rank: int, world: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for name in HEADS:
            x, labels, full = _inputs(name)
            sharded = _sharded(full, name, rank, world)
            mine = x[rank * B : (rank + 1) * B].clone().requires_grad_(True)
            logits, _, _ = sharded.shard_logits(mine, labels[rank * B : (rank + 1) * B])
            loss = sharded(mine, labels[rank * B : (rank + 1) * B])
            loss.backward()
            stats = sharded.stats(mine.detach(), labels[rank * B : (rank + 1) * B])
            queue.put((name, rank, logits.detach(), float(loss), mine.grad, sharded.weight.grad, stats))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_results():
    """Both heads through 2 gloo ranks, in one spawn (process start-up dominates the cost)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {(r[0], r[1]): r[2:] for r in (queue.get(timeout=120) for _ in range(2 * len(HEADS)))}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize("name", HEADS)
def test_two_processes_match_one(name, two_process_results):
    x, labels, full = _inputs(name)
    x = x.clone().requires_grad_(True)
    reference_logits = full(x, labels)
    reference_loss = full.loss(x, labels)
    reference_loss.backward()

    one = _sharded(full, name, 0, 1)
    x1 = x.detach().clone().requires_grad_(True)
    loss1 = one(x1, labels)
    loss1.backward()
    torch.testing.assert_close(loss1, reference_loss.detach())
    torch.testing.assert_close(x1.grad, x.grad)

    results = {rank: two_process_results[(name, rank)] for rank in range(2)}
    logits = torch.cat([results[0][0], results[1][0]], dim=1)
    torch.testing.assert_close(logits, reference_logits.detach())
    for rank in range(2):
        assert results[rank][1] == pytest.approx(float(reference_loss.detach()), rel=1e-6)
        # the gather's backward multiplies by world size so DDP's averaging gives the global gradient
        torch.testing.assert_close(results[rank][2] / 2, x.grad[rank * B : (rank + 1) * B])
        start, stop = shard_range(C, rank, 2)
        torch.testing.assert_close(results[rank][3], full.weight.grad[start:stop])
    assert results[0][4] == results[1][4]  # the statistics are global: the same on both ranks


def test_partial_fc_keeps_positives_and_only_touches_sampled_rows():
    x, labels, full = _inputs("arcface")
    head = _sharded(full, "arcface", 0, 1)
    head.sample_rate = 0.4
    head.train()
    loss = head(x, labels)
    loss.backward()
    touched = (head.weight.grad.abs().sum(dim=1) > 0).nonzero().squeeze(1)
    positives = labels[labels >= 0].unique()
    assert set(positives.tolist()) <= set(touched.tolist())
    assert len(touched) == max(int(0.4 * C), len(positives))
    assert int(head.sample_step) == 1


def test_unsupported_head_is_refused():
    with pytest.raises(ValueError, match="cannot be sharded"):
        ShardedHead(build_head("adaface", D, C), C, 0, 1)
