"""Plain heads (training/heads/plain.py): softmax, modified softmax, NormFace."""

from __future__ import annotations

from tests.requirements import importorskip

torch = importorskip("torch")

from tests.training.heads.common import C, D  # noqa: E402
from training.heads import build_head  # noqa: E402


def test_learned_normface_scale_gets_a_gradient():
    head = build_head("normface", D, C, learn_scale=True)
    head.loss(torch.randn(4, D), torch.tensor([0, 1, 2, 3])).backward()
    assert head.s.grad is not None and torch.isfinite(head.s.grad)
