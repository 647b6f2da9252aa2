"""Multiplicative-margin heads (training/heads/multiplicative.py): L-Softmax and SphereFace — ψ and
the λ schedule."""

from __future__ import annotations

import math

import pytest

from tests.requirements import importorskip

torch = importorskip("torch")

from tests.training.heads.common import C, D  # noqa: E402
from training.heads import build_head, chebyshev_cos, lambda_schedule, psi  # noqa: E402


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_psi_is_continuous_and_strictly_decreasing(m):
    theta = torch.linspace(0, math.pi, 20001, dtype=torch.float64)
    values = psi(torch.cos(theta), m)
    steps = values.diff()
    assert (steps < 0).all()
    assert steps.abs().max() <= m * (math.pi / 20000) * 1.001  # |dψ/dθ| ≤ m: no jump anywhere
    assert values[0] == pytest.approx(1.0) and values[-1] == pytest.approx(1 - 2 * m)
    boundaries = torch.tensor([k * math.pi / m for k in range(1, m)], dtype=torch.float64)
    torch.testing.assert_close(psi(torch.cos(boundaries), m), torch.tensor([1.0 - 2 * k for k in range(1, m)], dtype=torch.float64))


def test_psi_is_cos_for_m_1_and_chebyshev_is_cos_m_theta():
    theta = torch.linspace(0, math.pi, 1001, dtype=torch.float64)
    torch.testing.assert_close(psi(torch.cos(theta), 1), torch.cos(theta))
    for m in range(6):
        torch.testing.assert_close(chebyshev_cos(torch.cos(theta), m), torch.cos(m * theta))


def test_lambda_schedule():
    assert lambda_schedule(0) == 1000.0
    assert lambda_schedule(1000) == pytest.approx(1000 / 121)  # 8.2645
    assert lambda_schedule(10000) == 5.0  # 1000/1201 ≈ 0.83, floored at λ_min
    assert lambda_schedule(10000, lambda_min=0.0) == pytest.approx(1000 / 1201)


@pytest.mark.parametrize("name", ["sphereface", "lsoftmax"])
def test_iteration_advances_in_training_only_and_survives_the_state_dict(name):
    head = build_head(name, D, C)
    x, labels = torch.randn(3, D), torch.tensor([0, 1, 2])
    for _ in range(3):
        head(x, labels)
    head.eval()(x, labels)
    assert int(head.iteration) == 3 and head.lam == pytest.approx(1000 / 1.36)
    restored = build_head(name, D, C)
    restored.load_state_dict(head.state_dict())
    assert int(restored.iteration) == 3


def test_sphereface_without_annealing_is_norm_times_psi():
    head = build_head("sphereface", D, C, base=0.0, lambda_min=0.0).double()
    x, labels = torch.randn(6, D, dtype=torch.float64) * 3, torch.tensor([0, 1, 2, 3, 4, 0])
    cos = head.cosine(x)
    target = cos.gather(1, labels[:, None]).squeeze(1)
    expected = x.norm(dim=1) * psi(target, 4)
    torch.testing.assert_close(head(x, labels).gather(1, labels[:, None]).squeeze(1), expected)
