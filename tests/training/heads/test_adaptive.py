"""Adaptive heads (training/heads/adaptive.py): AdaCos's scale, CurricularFace's t, MagFace's norm
regularizer, AdaFace's norm statistics — their updates, and their averaging across ranks."""

from __future__ import annotations

import math

import pytest

from tests.requirements import importorskip

torch = importorskip("torch")

from tests.training.heads.common import D, make_head  # noqa: E402
from training.heads import build_head  # noqa: E402


def test_magface_loss_adds_the_norm_regularizer():
    head = make_head("magface").float()
    x, labels = torch.randn(4, D), torch.tensor([0, 1, 2, 3])
    x = x / x.norm(dim=1, keepdim=True) * torch.tensor([[5.0], [20.0], [60.0], [200.0]])
    a = torch.tensor([10.0, 20.0, 60.0, 110.0])
    g = (a / 110**2 + 1 / a).mean()
    ce = torch.nn.functional.cross_entropy(head(x, labels), labels)
    torch.testing.assert_close(head.loss(x, labels), ce + 35 * g)


def test_adacos_fixed_scale():
    # √2·ln(C−1): 1.414214·ln(10,574) = 1.414214·9.266153 and 1.414214·ln(85,741) = 1.414214·11.359086
    assert float(build_head("adacos", D, 10575).s) == pytest.approx(13.104320, abs=1e-5)
    assert float(build_head("adacos", D, 85742).s) == pytest.approx(16.064174, abs=1e-5)


def _three_rows():
    """Classes e1, e2, e3; all rows labelled 0 at target angles 0°, 30°, 60°."""
    x = torch.tensor([[1.0, 0.0, 0.0], [math.sqrt(3) / 2, 0.5, 0.0], [0.5, 0.0, math.sqrt(3) / 2]])
    return x, torch.tensor([0, 0, 0])


def test_adacos_dynamic_update_on_a_hand_computed_batch():
    head = build_head("adacos", 3, 3, dynamic=True)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    x, labels = _three_rows()
    s_old = math.sqrt(2) * math.log(2)
    # Non-target cosines: row 1 (0, 0), row 2 (1/2, 0), row 3 (0, √3/2); target angles 0, π/6, π/3.
    b_avg = ((1 + 1) + (math.exp(s_old / 2) + 1) + (1 + math.exp(s_old * math.sqrt(3) / 2))) / 3
    s_new = math.log(b_avg) / math.cos(math.pi / 6)  # θ_med = π/6 < π/4
    logits = head(x, labels)
    assert float(head.s) == pytest.approx(s_new, rel=1e-6)
    torch.testing.assert_close(logits, s_new * x)  # this batch already uses the new s
    head.eval()(x * torch.tensor([1.0, -1.0, 1.0]), labels)
    assert float(head.s) == pytest.approx(s_new, rel=1e-6)  # eval: no update
    restored = build_head("adacos", 3, 3, dynamic=True)
    restored.load_state_dict(head.state_dict())
    assert float(restored.s) == pytest.approx(s_new, rel=1e-6)


def test_adacos_dynamic_caps_the_median_angle_at_45_degrees():
    head = build_head("adacos", 3, 3, dynamic=True)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    x = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # every target at 90°
    head(x, torch.tensor([0, 0, 0]))
    s_old = math.sqrt(2) * math.log(2)
    b_avg = ((math.exp(s_old) + 1) + (1 + math.exp(s_old)) + 2 * math.exp(s_old / math.sqrt(2))) / 3
    assert float(head.s) == pytest.approx(math.log(b_avg) / math.cos(math.pi / 4), rel=1e-6)


def test_fixed_adacos_never_updates():
    head = build_head("adacos", 3, 3)
    head(*_three_rows())
    assert float(head.s) == pytest.approx(math.sqrt(2) * math.log(2))


class _FakeOtherRank:
    """dist stand-in for a 2-rank job: all_reduce adds what the other rank contributes."""

    def __init__(self, other: list[float]):
        self.other = torch.tensor(other)

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def all_reduce(self, tensor):
        tensor += self.other.to(tensor.dtype)


def test_adacos_scale_is_averaged_across_ranks(monkeypatch):
    import training.heads.base as base

    head = build_head("adacos", 3, 3, dynamic=True)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    monkeypatch.setattr(base, "dist", _FakeOtherRank([7.0, 1.0]))  # the other rank computed s = 7
    local = build_head("adacos", 3, 3, dynamic=True)
    with torch.no_grad():
        local.weight.copy_(torch.eye(3))
    monkeypatch.setattr(base, "dist", _FakeOtherRank([0.0, 0.0]))
    local(*_three_rows())  # a "world" where the other rank had no labelled row: the local value
    monkeypatch.setattr(base, "dist", _FakeOtherRank([7.0, 1.0]))
    head(*_three_rows())
    assert float(head.s) == pytest.approx((float(local.s) + 7.0) / 2, rel=1e-6)
    x, _ = _three_rows()
    head(x, torch.tensor([-1, -1, -1]))  # no labelled row here: the other rank's value alone
    assert float(head.s) == pytest.approx(7.0)


def test_curricularface_t_is_an_ema_of_the_target_cosine():
    head = build_head("curricularface", 3, 3, s=10.0)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    x, labels = _three_rows()
    mean_cos = (1 + math.sqrt(3) / 2 + 0.5) / 3
    head(x, labels)
    head(x, labels)
    assert float(head.t) == pytest.approx(0.01 * mean_cos + 0.99 * 0.01 * mean_cos, rel=1e-6)
    head.eval()(x, labels)
    restored = build_head("curricularface", 3, 3)
    restored.load_state_dict(head.state_dict())
    assert float(restored.t) == pytest.approx(0.01 * mean_cos * 1.99, rel=1e-6)


def test_adaface_statistics_are_an_ema_of_the_batch_norms():
    head = build_head("adaface", 3, 3, alpha=0.5)
    x = torch.tensor([[3.0, 0, 0], [0, 5.0, 0], [0, 0, 10.0]])
    head(x, torch.tensor([0, 1, 2]))
    norms = torch.tensor([3.0, 5.0, 10.0])
    assert float(head.norm_mean) == pytest.approx(0.5 * 6.0 + 0.5 * 20.0)
    assert float(head.norm_std) == pytest.approx(0.5 * float(norms.std()) + 0.5 * 100.0)
    state = head.state_dict()
    head(x[:1], torch.tensor([0]))  # one row has no std: statistics unchanged
    assert float(head.norm_mean) == pytest.approx(13.0)
    head.eval()(x * 2, torch.tensor([0, 1, 2]))
    assert float(head.norm_mean) == pytest.approx(13.0)
    restored = build_head("adaface", 3, 3)
    restored.load_state_dict(state)
    assert float(restored.norm_mean) == pytest.approx(13.0) and float(restored.norm_std) == float(head.norm_std)
