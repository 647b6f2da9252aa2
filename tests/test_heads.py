"""Training heads (training/heads): each table row of README.md ("Training heads") against a direct computation,
the numerics the heads promise (float32 logits, finite gradients at the edges), their schedules and
running statistics, and the seed papers' claim on a toy problem."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from training.heads import (  # noqa: E402
    EPS,
    HEADS,
    build_head,
    chebyshev_cos,
    cosface_scale_lower_bound,
    head_params,
    lambda_schedule,
    psi,
)

D, C = 4, 5
MARGIN_HEADS = (
    "lsoftmax",
    "sphereface",
    "amsoftmax",
    "cosface",
    "arcface",
    "combined",
    "subcenter_arcface",
    "curricularface",
    "magface",
    "adaface",
)
STATEFUL = {"sphereface": "iteration", "lsoftmax": "iteration", "adacos": "s", "curricularface": "t", "adaface": "norm_mean"}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    for i, (xi, y) in enumerate(zip(x, labels)):
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


def make_head(name: str, seed: int = 0, **params):
    torch.manual_seed(seed)
    head = build_head(name, D, C, **params).double().eval()
    with torch.no_grad():
        head.weight.normal_()  # well-conditioned weights (the default init is std 0.01)
        if name == "softmax":
            head.bias.normal_()
        if name == "curricularface":
            head.t.fill_(0.4)
        if name == "adaface":  # with norms 0.5…150 (edge_batch), ẑ covers −1…1 and both clips
            head.norm_mean.fill_(50.0)
            head.norm_std.fill_(10.0)
        if name in ("lsoftmax", "sphereface"):
            head.iteration.fill_(1000)  # λ ≈ 8.3, both parts of the blend matter
    return head


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


def test_subcenter_weight_is_class_major():
    head = build_head("subcenter_arcface", D, C, k=3).eval()
    x = torch.randn(1, D)
    with torch.no_grad():
        head.weight.copy_(-x.expand(C * 3, D))  # every sub-centre opposite x…
        head.weight[2 * 3 + 1] = x[0]  # …except class 2's second one
    cos = head.cosine(x).detach()
    assert cos.shape == (1, C)
    torch.testing.assert_close(cos[0], torch.tensor([-1.0, -1.0, 1.0, -1.0, -1.0]))


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


def test_magface_loss_adds_the_norm_regularizer():
    head = make_head("magface").float()
    x, labels = torch.randn(4, D), torch.tensor([0, 1, 2, 3])
    x = x / x.norm(dim=1, keepdim=True) * torch.tensor([[5.0], [20.0], [60.0], [200.0]])
    a = torch.tensor([10.0, 20.0, 60.0, 110.0])
    g = (a / 110**2 + 1 / a).mean()
    ce = torch.nn.functional.cross_entropy(head(x, labels), labels)
    torch.testing.assert_close(head.loss(x, labels), ce + 35 * g)


# ---------------------------------------------------------------------------------------------
# ψ and the λ schedule


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


def _target_curve(head, theta: torch.Tensor, norm: float = 1.0) -> torch.Tensor:
    """The target logit of a sample at angle θ from its class weight (class 0)."""
    w = torch.nn.functional.normalize(head.weight.detach()[0], dim=0)
    other = torch.nn.functional.normalize(torch.randn(w.shape[0], dtype=w.dtype, generator=torch.Generator().manual_seed(0)), dim=0)
    other = torch.nn.functional.normalize(other - (other @ w) * w, dim=0)
    x = norm * (torch.cos(theta)[:, None] * w + torch.sin(theta)[:, None] * other)
    return head(x, torch.zeros(len(theta), dtype=torch.long))[:, 0].detach()


@pytest.mark.parametrize("name", HEADS)
def test_default_target_logits_never_rise_with_the_angle(name):
    """The point of ψ and of the edge rules: with the defaults, no head's target curve turns back up."""
    head = build_head(name, D, C).double().eval()
    if name == "subcenter_arcface":  # θ_y is measured from the best sub-centre: make them one
        with torch.no_grad():
            head.weight[: head.k] = head.weight[0]
    theta = torch.linspace(0, math.pi, 4001, dtype=torch.float64)
    for norm in (0.5, 5.0, 50.0, 150.0):  # MagFace's and AdaFace's margins depend on the norm
        assert (_target_curve(head, theta, norm).diff() <= 1e-9).all()


@pytest.mark.parametrize("params", [{"edge": "easy"}, {"edge": "threshold", "m": 0.0}])
def test_arcface_easy_margin_rises_at_90_degrees(params):
    """…which `edge="easy"` does (documented); m = 0 is plain cosθ, the control."""
    head = build_head("arcface", D, C, **params).double().eval()
    theta = torch.linspace(0, math.pi, 4001, dtype=torch.float64)
    rises = (_target_curve(head, theta).diff() > 1e-9).any()
    assert rises == (params["edge"] == "easy")


# ---------------------------------------------------------------------------------------------
# Scales: the CosFace bound and AdaCos


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


def test_learned_normface_scale_gets_a_gradient():
    head = build_head("normface", D, C, learn_scale=True)
    head.loss(torch.randn(4, D), torch.tensor([0, 1, 2, 3])).backward()
    assert head.s.grad is not None and torch.isfinite(head.s.grad)


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
        return torch.func.functional_call(head, dict(zip(names, values)), (x, labels))

    def loss(x, *values):
        return torch.func.functional_call(module, {f"head.{n}": v for n, v in zip(names, values)}, (x, labels))

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


# ---------------------------------------------------------------------------------------------
# The seeds' claim, checked for real: margins separate classes by angle better than softmax.


@pytest.fixture(scope="module")
def softmax_toy():
    pytest.importorskip("sklearn")
    from training.toy import train_toy

    return train_toy("softmax", seed=0)


SUBCENTER_XFAIL = pytest.mark.xfail(
    strict=False,
    reason="sub-center ArcFace relaxes intra-class compactness by design: on clean data a class spreads over "
    "2–3 sub-centres (seed 0: 58/5/115 samples), so its class-mean ratio is 3.89 (45.7°/11.8°) against "
    "softmax's 3.99 (47.7°/11.9°); over 16 seeds 3.62–10.38 (median ≈ 8), below softmax on seeds 0 and 12. "
    "Its dominant sub-centres alone reach 10.6.",
)


@pytest.mark.parametrize("name", [pytest.param(n, marks=SUBCENTER_XFAIL) if n == "subcenter_arcface" else n for n in MARGIN_HEADS])
def test_margin_heads_separate_classes_by_angle_better_than_softmax(name, softmax_toy):
    """min angle between class centres / mean angle to the own centre, on the toy's train embeddings
    after the same budget (training/toy.py). Over seeds 0–15 softmax reaches 3.3–4.1 and every other
    margin head at least 5.4 (lsoftmax's minimum)."""
    from training.toy import train_toy

    result = train_toy(name, seed=0)
    assert result.accuracy > 0.95
    assert result.ratio > softmax_toy.ratio, (
        f"{name}: {result.min_center_angle:.1f}°/{result.mean_intra_angle:.1f}° = {result.ratio:.2f}, "
        f"softmax {softmax_toy.min_center_angle:.1f}°/{softmax_toy.mean_intra_angle:.1f}° = {softmax_toy.ratio:.2f}"
    )


# ---------------------------------------------------------------------------------------------
# The `facegate heads` commands


def test_cli_module_imports_without_torch():
    import subprocess
    import sys

    code = "import sys; sys.modules['torch'] = None; sys.modules['matplotlib'] = None; import training.commands.heads"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plot_logits_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from training.commands.heads import heads_app

    result = CliRunner().invoke(heads_app, ["plot-logits", "--out", str(tmp_path / "logits.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "logits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_features_rejects_an_unknown_head(tmp_path):
    from typer.testing import CliRunner

    from training.commands.heads import heads_app

    result = CliRunner().invoke(heads_app, ["plot-features", "--head", "arcfce", "--out", str(tmp_path / "f.png")])
    assert result.exit_code != 0 and "arcfce" in result.output
