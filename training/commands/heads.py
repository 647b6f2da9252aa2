"""`facegate heads …`: the two pictures of docs/heads.md ("The target logits", "What the margins do to the
features"). torch and matplotlib are imported inside the commands, so `facegate` starts without them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    import numpy as np

heads_app = typer.Typer(help="Margin heads: draw their target-logit curves and what they do to a toy problem.", no_args_is_help=True)

FEATURE_HEADS = ["softmax", "normface", "sphereface", "cosface", "arcface", "adaface"]


def target_curves(theta_deg) -> list[tuple[str, np.ndarray, dict]]:
    """(label, target logit / s as a function of θ, line style) for the heads, from their own `margin`.

    Every curve is the value the head puts in the target column for a sample at angle θ from its
    class weight, divided by the scale (and with ‖x‖ = ‖w‖ = 1), so all heads share one axis.
    """
    import numpy as np
    import torch

    from training.heads import build_head

    cos = torch.cos(torch.deg2rad(torch.as_tensor(theta_deg, dtype=torch.float64)))
    n = cos.shape[0]
    matrix = torch.stack([cos, torch.zeros_like(cos), torch.zeros_like(cos)], dim=1)
    labels = torch.zeros(n, dtype=torch.long)

    def target(name: str, norm: float = 1.0, setup=None, **params) -> np.ndarray:
        head = build_head(name, 2, 3, **params).double().eval()
        if setup is not None:
            setup(head)
        with torch.no_grad():
            logits = head.margin(matrix, labels, torch.full((n,), norm, dtype=torch.float64))
        return (logits[:, 0] / float(getattr(head, "s", 1.0))).numpy()

    def adaface_stats(head) -> None:  # μ = 50, σ = 10: ‖x‖ = 100 gives ẑ = +1, ‖x‖ = 1 gives ẑ = −1
        head.norm_mean.fill_(50.0)
        head.norm_std.fill_(10.0)

    raw = np.cos(np.radians(theta_deg) + 0.5)
    return [
        ("no margin: softmax (‖w‖‖x‖ = 1), normface, adacos", target("normface"), {"color": "black", "lw": 2.5}),
        ("sphereface / lsoftmax m=4, λ=0: ψ(θ)", target("sphereface", base=0.0, lambda_min=0.0), {"color": "tab:purple"}),
        ("sphereface m=4, λ=5 (as trained)", target("sphereface", base=0.0), {"color": "tab:purple", "ls": "--"}),
        ("cosface / amsoftmax m=0.35", target("cosface"), {"color": "tab:blue"}),
        ("arcface m=0.5 (curricularface, sub-center)", target("arcface"), {"color": "tab:red", "lw": 2}),
        ("arcface m=0.5, edge=easy", target("arcface", edge="easy"), {"color": "tab:red", "ls": ":"}),
        ("cos(θ+0.5) with no edge rule", raw, {"color": "grey", "ls": "--", "lw": 1}),
        ("combined (1, 0.3, 0.2)", target("combined"), {"color": "tab:green"}),
        ("magface ‖x‖≤10: m=0.45", target("magface", norm=10.0), {"color": "tab:orange", "ls": "--"}),
        ("magface ‖x‖≥110: m=0.8", target("magface", norm=110.0), {"color": "tab:orange"}),
        ("adaface ẑ=−1 (low norm)", target("adaface", norm=1.0, setup=adaface_stats), {"color": "tab:cyan", "ls": "--"}),
        ("adaface ẑ=+1 (high norm)", target("adaface", norm=100.0, setup=adaface_stats), {"color": "tab:cyan"}),
    ]


@heads_app.command("plot-logits")
def plot_logits(out: Annotated[Path, typer.Option("--out", help="PNG to write.")]) -> None:
    """Target-logit curves of all heads over θ = 0…180° on one chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    theta = np.linspace(0, 180, 1801)
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=100)
    for label, values, style in target_curves(theta):
        ax.plot(theta, values, label=label, **({"lw": 1.6} | style))
    ax.set(xlim=(0, 180), ylim=(-2.1, 1.1), xlabel="θ: angle between the sample and its class weight (degrees)")
    ax.set_ylabel("target logit / s")
    ax.set_xticks(range(0, 181, 30))
    ax.grid(alpha=0.3)
    ax.annotate("ψ (m=4) goes on down to 1 − 2m = −7 at 180°", xy=(72, -2.0), fontsize=8, color="tab:purple")
    ax.set_title("Target logit of each head (non-target logits stay s·cos θ)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    _save(fig, out)


@heads_app.command("plot-features")
def plot_features(
    out: Annotated[Path, typer.Option("--out", help="PNG to write.")],
    head: Annotated[
        list[str] | None, typer.Option("--head", help=f"Head to train (repeatable). Default: {', '.join(FEATURE_HEADS)}.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the toy run (training/toy.py).")] = 0,
) -> None:
    """Train the toy problem (digits → 3-D embedding) with each head; draw the embeddings on the sphere."""
    from training.heads import HEADS

    names = head or FEATURE_HEADS
    unknown = [name for name in names if name not in HEADS]
    if unknown:
        raise typer.BadParameter(f"unknown head(s) {', '.join(unknown)}; choose from: {', '.join(HEADS)}", param_hint="--head")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from training.toy import train_toy

    columns = min(len(names), 3)
    rows = math.ceil(len(names) / columns)
    fig = plt.figure(figsize=(3.0 * columns, 3.2 * rows + 0.3), dpi=75)
    u, v = np.meshgrid(np.linspace(0, 2 * np.pi, 19), np.linspace(0, np.pi, 10))
    for i, name in enumerate(names):
        result = train_toy(name, seed=seed)
        typer.echo(
            f"{name:18s} min centre angle {result.min_center_angle:5.1f}°  mean intra {result.mean_intra_angle:5.1f}°  "
            f"ratio {result.ratio:5.2f}  accuracy {result.accuracy:.3f}"
        )
        ax = fig.add_subplot(rows, columns, i + 1, projection="3d")
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.88", lw=0.4)
        e = result.embeddings
        ax.scatter(e[:, 0], e[:, 1], e[:, 2], c=result.labels, cmap="tab10", s=2, depthshade=False, vmin=0, vmax=9)
        w = result.weights * 1.08  # class weights (sub-centres) just outside the sphere
        ax.scatter(w[:, 0], w[:, 1], w[:, 2], c="black", marker="+", s=25, depthshade=False)
        ax.set_title(f"{name}\n{result.min_center_angle:.0f}° / {result.mean_intra_angle:.1f}° = {result.ratio:.1f}", fontsize=9)
        ax.set_box_aspect((1, 1, 1), zoom=1.45)
        ax.set_axis_off()
    fig.suptitle("Digits toy, train embeddings: min centre angle / mean intra-class angle (+: class weights)", fontsize=10, y=0.995)
    fig.subplots_adjust(left=0, right=1, bottom=0, top=1 - 0.75 / fig.get_figheight(), wspace=0, hspace=0.15)
    _save(fig, out)


def _save(fig, out: Path) -> None:
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, pil_kwargs={"optimize": True})
    plt.close(fig)
    typer.echo(f"wrote {out}")
