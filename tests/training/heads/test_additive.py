"""Additive-margin heads (training/heads/additive.py): CosFace/AM-Softmax and its scale bound,
ArcFace's edge rules, sub-center ArcFace's weight layout."""

from __future__ import annotations

import math

import pytest

from tests.requirements import importorskip

torch = importorskip("torch")

from tests.training.heads.common import C, D, target_curve  # noqa: E402
from training.heads import build_head, cosface_scale_lower_bound  # noqa: E402


def test_subcenter_weight_is_class_major():
    head = build_head("subcenter_arcface", D, C, k=3).eval()
    x = torch.randn(1, D)
    with torch.no_grad():
        head.weight.copy_(-x.expand(C * 3, D))  # every sub-centre opposite x…
        head.weight[2 * 3 + 1] = x[0]  # …except class 2's second one
    cos = head.cosine(x).detach()
    assert cos.shape == (1, C)
    torch.testing.assert_close(cos[0], torch.tensor([-1.0, -1.0, 1.0, -1.0, -1.0]))


@pytest.mark.parametrize("params", [{"edge": "easy"}, {"edge": "threshold", "m": 0.0}])
def test_arcface_easy_margin_rises_at_90_degrees(params):
    """…which `edge="easy"` does (documented); m = 0 is plain cosθ, the control."""
    head = build_head("arcface", D, C, **params).double().eval()
    theta = torch.linspace(0, math.pi, 4001, dtype=torch.float64)
    rises = (target_curve(head, theta).diff() > 1e-9).any()
    assert rises == (params["edge"] == "easy")


def test_cosface_scale_lower_bound_is_the_paper_bound():
    assert cosface_scale_lower_bound(10, 0.9) == pytest.approx(9 / 10 * math.log(9 * 9))
    assert cosface_scale_lower_bound(85742, 0.9) == pytest.approx(85741 / 85742 * math.log(85741 * 9))


@pytest.mark.parametrize("margin", [0.0, 0.35])
def test_cosface_scale_lower_bound_is_tight_on_a_regular_simplex(margin):
    """At s = bound, a sample on its centre among C maximally spread centres has posterior exactly P_W."""
    classes, p_w = 6, 0.9
    centres = torch.eye(classes, dtype=torch.float64) - 1 / classes  # a regular simplex, cos = −1/(C−1)
    s = cosface_scale_lower_bound(classes, p_w, margin)
    head = build_head("cosface", classes, classes, s=s, m=margin).double()
    with torch.no_grad():
        head.weight.copy_(centres)
    posterior = head(centres, torch.arange(classes)).softmax(dim=1).diagonal()
    torch.testing.assert_close(posterior, torch.full((classes,), p_w, dtype=torch.float64))
