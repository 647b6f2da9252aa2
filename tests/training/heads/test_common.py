"""What every head promises (training/heads): each table row of README.md ("Training heads") against
a direct computation, the registry's contract, and the numerics (float32 logits, finite gradients at
the edges, autocast, state updates under autograd), checked for every registered head."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.requirements import importorskip

torch = importorskip("torch")

from tests.training.heads.common import C, D, make_head, target_curve  # noqa: E402
from training.heads import EPS, HEADS, build_head, head_params  # noqa: E402

STATEFUL = {"sphereface": "iteration", "lsoftmax": "iteration", "adacos": "s", "curricularface": "t", "adaface": "norm_mean"}


# ---------------------------------------------------------------------------------------------
# Direct reference: each head's table row, element by element in float64 Python math.


def _clamped_acos(c: float) -> float:
    return math.acos(min(max(c, -1 + EPS), 1 - EPS))


def _psi(c: float, m: int) -> float:
    theta = _clamped_acos(c)
    k = min(max(math.floor(theta * m / math.pi), 0), m - 1)
    return (-1) ** k * math.cos(m * math.acos(min(max(c, -1.0), 1.0))) - 2 * k


def _arc(c: float, m1: float, m2: float, m3: float, edge: str) -> float:
    angle = m1 * _clamped_acos(c) + m2
    if edge == "clamp":
        return math.cos(min(angle, math.pi)) - m3
    if edge == "easy":
        return math.cos(angle) - m3 if c > 0 else c
    return math.cos(angle) - m3 if c > math.cos(math.pi - m2) else c - m2 * math.sin(m2) - m3


def reference_logits(name: str, head, x: np.ndarray, labels: list[int]) -> np.ndarray:
    p = {k: v if isinstance(v, str) else float(torch.as_tensor(v).detach()) for k, v in ((k, getattr(head, k)) for k in head_params(name))}
    w = head.weight.detach().double().numpy()
    out = np.zeros((len(x), head.num_classes))
    for i, (xi, y) in enumerate(zip(x, labels, strict=True)):
        a = float(np.linalg.norm(xi))
        cos = [float(xi @ wj) / (a * float(np.linalg.norm(wj))) for wj in w]
        if name == "subcenter_arcface":
            cos = [max(cos[j * head.k : (j + 1) * head.k]) for j in range(head.num_classes)]
        for j in range(head.num_classes):
            c, target = cos[j], j == y
            if name == "softmax":
                v = float(xi @ w[j]) + float(head.bias[j].detach())
            elif name == "msoftmax":
                v = a * c
            elif name == "normface":
                v = p["s"] * c
            elif name in ("lsoftmax", "sphereface"):
                lam = head.lam
                wn = float(np.linalg.norm(w[j])) if name == "lsoftmax" else 1.0
                v = wn * a * ((lam * c + _psi(c, head.m)) / (1 + lam) if target else c)
            elif name in ("amsoftmax", "cosface"):
                v = p["s"] * (c - p["m"] if target else c)
            elif name in ("arcface", "subcenter_arcface"):
                v = p["s"] * (_arc(c, 1, p["m"], 0, p["edge"]) if target else c)
            elif name == "combined":
                v = p["s"] * (_arc(c, p["m1"], p["m2"], p["m3"], p["edge"]) if target else c)
            elif name == "adacos":
                v = math.sqrt(2) * math.log(head.num_classes - 1) * c
            elif name == "curricularface":
                t = float(head.t)
                if y == -1:
                    v = c
                elif target:
                    v = _arc(c, 1, p["m"], 0, p["edge"])
                else:
                    v = c * (t + c) if c > math.cos(_clamped_acos(cos[y]) + p["m"]) else c
                v *= p["s"]
            elif name == "magface":
                m = p["l_m"] + (p["u_m"] - p["l_m"]) * (min(max(a, p["l_a"]), p["u_a"]) - p["l_a"]) / (p["u_a"] - p["l_a"])
                v = p["s"] * (_arc(c, 1, m, 0, p["edge"]) if target else c)
            elif name == "adaface":
                z = min(max(p["h"] * (min(max(a, 1e-3), 100) - float(head.norm_mean)) / (float(head.norm_std) + 1e-3), -1), 1)
                angle = min(max(_clamped_acos(c) - p["m"] * z, EPS), math.pi - EPS)
                v = p["s"] * (math.cos(angle) - (p["m"] + p["m"] * z) if target else c)
            else:
                raise AssertionError(name)
            out[i, j] = v
    return out


# Target angles that cover the edges: θ = 0 and π exactly, the ψ piece boundaries kπ/m, and both sides
# of the discontinuities: the threshold at θ = π − m (ArcFace m = 0.5, combined m2 = 0.3), the easy
# margin's at π/2.
EDGE_ANGLES = [0.0, 1e-4, math.pi / 8, math.pi / 4, math.pi / 3, math.pi / 2 - 1e-3, math.pi / 2 + 1e-3,
               2 * math.pi / 3, 3 * math.pi / 4, math.pi - 0.5 - 1e-3, math.pi - 0.5 + 1e-3,
               math.pi - 0.3 - 1e-3, math.pi - 0.3 + 1e-3, math.pi - 1e-4, math.pi]  # fmt: skip


def edge_batch(head, seed: int = 0) -> tuple[torch.Tensor, list[int]]:
    """Embeddings at chosen angles to their target's weight row, norms from 0.5 to 150 (MagFace's and
    AdaFace's clamps on both sides), random rows, and one unlabelled row."""
    rng = np.random.default_rng(seed)
    w = head.weight.detach().double().numpy()
    rows_per_class = w.shape[0] // head.num_classes
    angles = EDGE_ANGLES + list(rng.uniform(0, math.pi, 6))
    norms = np.geomspace(0.5, 150, len(angles) + 1)
    x, labels = [], []
    for i, theta in enumerate(angles):
        y = i % head.num_classes
        wy = w[y * rows_per_class]
        wy = wy / np.linalg.norm(wy)
        u = rng.standard_normal(w.shape[1])
        u -= (u @ wy) * wy
        u /= np.linalg.norm(u)
        x.append(norms[i] * (math.cos(theta) * wy + math.sin(theta) * u))
        labels.append(y)
    x.append(norms[-1] * rng.standard_normal(w.shape[1]))
    labels.append(-1)
    return torch.tensor(np.array(x)), labels


HEAD_CASES = [(name, {}) for name in HEADS] + [
    ("arcface", {"edge": "easy"}),
    ("arcface", {"edge": "clamp"}),
    ("combined", {"m1": 1.35, "m2": 0.25, "m3": 0.1, "edge": "clamp"}),
    ("combined", {"edge": "easy"}),
    ("lsoftmax", {"m": 3}),
    ("sphereface", {"m": 2, "base": 0.0, "lambda_min": 0.0}),
    ("normface", {"learn_scale": True}),
]


def _id(case) -> str:
    name, params = case
    return name + "".join(f"-{k}={v}" for k, v in params.items())


@pytest.mark.parametrize("case", HEAD_CASES, ids=map(_id, HEAD_CASES))
def test_logits_match_the_table_row(case):
    name, params = case
    head = make_head(name, **params)
    x, labels = edge_batch(head)
    logits = head(x, torch.tensor(labels))
    np.testing.assert_allclose(logits.detach().numpy(), reference_logits(name, head, x.numpy(), labels), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", HEADS)
def test_float32_logits_agree_with_float64(name):
    head = make_head(name)
    x, labels = edge_batch(head, seed=1)
    x = x[len(EDGE_ANGLES) :]  # random angles: float32 rounding near θ = 0 is amplified by acos
    labels = torch.tensor(labels[len(EDGE_ANGLES) :])
    expected = head(x, labels).detach()
    logits = head.float()(x.float(), labels)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), expected, atol=2e-4, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Contract


@pytest.mark.parametrize("name", HEADS)
def test_contract(name):
    head = build_head(name, 8, 7)
    rows = 7 * head_params(name).get("k", 1)
    assert tuple(head.weight.shape) == (rows, 8)
    x, labels = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 6, -1])
    logits = head(x, labels)
    assert logits.shape == (6, 7) and logits.dtype == torch.float32
    loss = head.loss(x, labels)
    assert loss.shape == () and torch.isfinite(loss)
    assert torch.isfinite(head(x, labels.int())).all()  # any integer dtype


def test_build_head_rejects_unknown_names_and_params():
    with pytest.raises(ValueError, match="arcface") as info:
        build_head("arcfce", D, C)
    assert all(name in str(info.value) for name in HEADS)
    with pytest.raises(ValueError, match="margin.*accepts: s, m, edge"):
        build_head("arcface", D, C, margin=0.5)
    with pytest.raises(ValueError, match="edge"):
        build_head("arcface", D, C, edge="wrap")
    with pytest.raises(ValueError, match="m1 = 1"):
        build_head("combined", D, C, m1=2.0)
    with pytest.raises(ValueError, match="integer"):
        build_head("sphereface", D, C, m=1.5)


def test_defaults():
    assert head_params("cosface") == {"s": 64.0, "m": 0.35}
    assert head_params("amsoftmax") == {"s": 30.0, "m": 0.35}
    assert head_params("arcface") == {"s": 64.0, "m": 0.5, "edge": "threshold"}
    assert head_params("combined") == {"s": 64.0, "m1": 1.0, "m2": 0.3, "m3": 0.2, "edge": "threshold"}
    assert head_params("normface") == {"s": 30.0, "learn_scale": False}
    assert head_params("sphereface") == {"m": 4, "base": 1000.0, "gamma": 0.12, "power": 1.0, "lambda_min": 5.0}
    assert head_params("subcenter_arcface")["k"] == 3
    assert head_params("magface") == {
        "s": 64.0, "l_a": 10.0, "u_a": 110.0, "l_m": 0.45, "u_m": 0.8, "lambda_g": 35.0, "edge": "threshold",
    }  # fmt: skip
    assert head_params("adaface") == {"s": 64.0, "m": 0.4, "h": 0.333, "alpha": 0.01}


def test_labels_must_be_integers():
    head = build_head("arcface", D, C)
    with pytest.raises(TypeError, match="integer"):
        head(torch.randn(2, D), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        head(torch.randn(2, D), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("name", HEADS)
def test_ignored_rows_are_left_out_of_the_loss(name):
    head = make_head(name).float()
    x, labels = torch.randn(5, D) * 20, torch.tensor([0, 1, -1, 3, -1])
    keep = labels != -1
    loss = head.loss(x, labels)
    if name == "magface":  # its norm regularizer needs no label and covers every row
        loss = loss - head.lambda_g * (head.regularizer(x) - head.regularizer(x[keep]))
    torch.testing.assert_close(loss, head.loss(x[keep], labels[keep]))
    none = head.loss(x, torch.full((5,), -1))
    none.backward()
    assert torch.isfinite(none) and all(torch.isfinite(p.grad).all() for p in head.parameters())


@pytest.mark.parametrize("name", HEADS)
def test_default_target_logits_never_rise_with_the_angle(name):
    """The point of ψ and of the edge rules: with the defaults, no head's target curve turns back up."""
    head = build_head(name, D, C).double().eval()
    if name == "subcenter_arcface":  # θ_y is measured from the best sub-centre: make them one
        with torch.no_grad():
            head.weight[: head.k] = head.weight[0]
    theta = torch.linspace(0, math.pi, 4001, dtype=torch.float64)
    for norm in (0.5, 5.0, 50.0, 150.0):  # MagFace's and AdaFace's margins depend on the norm
        assert (target_curve(head, theta, norm).diff() <= 1e-9).all()


# ---------------------------------------------------------------------------------------------
# Gradients


class _Loss(torch.nn.Module):
    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, x, labels):
        return self.head.loss(x, labels)


@pytest.mark.parametrize("case", HEAD_CASES, ids=map(_id, HEAD_CASES))
def test_gradcheck(case):
    """Logits and loss against finite differences in float64, w.r.t. embeddings and all parameters."""
    name, params = case
    head = make_head(name, seed=3, **params)
    x = torch.randn(4, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if name == "magface":
        x = x * 30  # norms inside [l_a, u_a], where the margin depends on them
    if name == "adaface":
        # ẑ is a stop-gradient (AdaFace detaches the norms) that finite differences would see move:
        # hold it at its clip, ±1, with norms well above and below the mean.
        x = x * torch.tensor([[1.0], [3.0], [10.0], [30.0]], dtype=torch.float64)
        with torch.no_grad():
            head.norm_mean.fill_(float(x[:2].norm(dim=1).max() + x[2:].norm(dim=1).min()) / 2)
            head.norm_std.fill_(0.0)
    labels = torch.tensor([0, 2, 4, -1])
    module = _Loss(head)
    names = [n for n, _ in head.named_parameters()]
    inputs = (x.requires_grad_(), *(p.detach().clone().requires_grad_() for p in head.parameters()))

    def logits(x, *values):
        return torch.func.functional_call(head, dict(zip(names, values, strict=True)), (x, labels))

    def loss(x, *values):
        return torch.func.functional_call(module, {f"head.{n}": v for n, v in zip(names, values, strict=True)}, (x, labels))

    assert torch.autograd.gradcheck(logits, inputs)
    assert torch.autograd.gradcheck(loss, inputs)


def _edge_inputs(head, dtype=torch.float32):
    """cosθ = +1 and −1 exactly for target and non-target columns, and θ_y + 0.5 = π (ArcFace's m)."""
    w = torch.nn.functional.normalize(head.weight.detach().float(), dim=1)[:: head.weight.shape[0] // head.num_classes]
    theta = math.pi - 0.5
    other = torch.nn.functional.normalize(w[1] - (w[1] @ w[0]) * w[0], dim=0)
    x = torch.stack([w[0], -w[0], math.cos(theta) * w[0] + math.sin(theta) * other, w[1], -w[2], w[3]]) * 20
    return x.to(dtype).requires_grad_(), torch.tensor([0, 0, 0, 0, 0, -1])


AUTOCAST = [None, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("autocast", AUTOCAST, ids=["float32", "autocast-bf16", "autocast-fp16"])
@pytest.mark.parametrize("name", HEADS)
def test_gradients_are_finite_at_the_edges(name, autocast):
    torch.manual_seed(0)
    head = build_head(name, D, C)
    x, labels = _edge_inputs(head)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits = head(x, labels)
        loss = head.loss(x, labels)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    (loss + logits.sum()).backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in head.parameters())


@pytest.mark.parametrize("name", HEADS)
def test_autocast_does_not_change_the_logits(name):
    head = make_head(name).float()
    x, labels = torch.randn(4, D) * 5, torch.tensor([0, 1, 2, -1])
    expected = head(x, labels)
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            torch.testing.assert_close(head(x, labels), expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_embeddings_give_float32_logits(dtype):
    head = build_head("arcface", D, C)
    x = torch.randn(3, D)
    logits = head(x.to(dtype), torch.tensor([0, 1, 2]))
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, head(x.to(dtype).float(), torch.tensor([0, 1, 2])))


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_state_updates_do_not_break_autograd(name):
    """Two training forwards (gradient accumulation) before one backward: the in-place buffer
    updates of the second must not invalidate what autograd saved in the first."""
    params = {"dynamic": True} if name == "adacos" else {}
    head = build_head(name, D, C, **params)
    x = torch.randn(6, D, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    before = head.state_dict()[STATEFUL[name]].clone()
    first = head.loss(x, labels)
    second = head.loss(x * 1.5, labels)
    (first + second).backward()
    assert torch.isfinite(x.grad).all()
    assert not torch.equal(head.state_dict()[STATEFUL[name]], before)
