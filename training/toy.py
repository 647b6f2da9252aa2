"""A toy face-recognition problem that runs on a laptop CPU in about a second per head.

scikit-learn's bundled `load_digits` (1,797 8×8 images, 10 classes) plays the identities; a small MLP
maps each image to a 3-D embedding that a head classifies. After training, the L2-normalized train
embeddings show what the head's loss does to the geometry (docs/img/heads-features.png), and two
angles measure the margin papers' claim, angular separability:

- min_center_angle: the smallest angle between two class centres (inter-class separation);
- mean_intra_angle: the mean angle of a sample to its own class centre (intra-class spread).

Their ratio grows when classes get both compact and far apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.heads import build_head

# The heads' defaults target 512-D embeddings and 10k+ identities. Ten classes in 3-D need far less
# scale (cosface_scale_lower_bound(10, 0.9, 0.35) ≈ 5.8, against ≈ 21 for 85k identities) and s = 64 only
# makes the loss stiff, so the toy divides every default s by 4; margins stay the papers' own.
# AdaCos picks its own s (√2·ln 9 ≈ 3.1) and is left fixed: dynamic AdaCos assumes the non-target
# cosines are ≈ 0, true in high dimensions only; in 3-D its update makes s run away (past 90 by step
# 100, 10¹¹ by the end) and classes merge.
TOY_PARAMS: dict[str, dict[str, object]] = {
    "normface": {"s": 7.5},
    "lsoftmax": {"gamma": 1.0},  # λ reaches λ_min after ~200 of the toy's 900 steps, not 1,660
    "sphereface": {"gamma": 1.0},
    "amsoftmax": {"s": 7.5},
    "cosface": {"s": 16.0},
    "arcface": {"s": 16.0},
    "combined": {"s": 16.0},
    "subcenter_arcface": {"s": 16.0},
    "curricularface": {"s": 16.0},
    # MagFace's norm range [10, 110] is scaled to the toy MLP's norms, λ_g with it.
    "magface": {"s": 16.0, "l_a": 1.0, "u_a": 11.0, "lambda_g": 3.5},
    "adaface": {"s": 16.0, "alpha": 0.1},  # the norm statistics settle within the short run
}


@dataclass(frozen=True)
class ToyResult:
    head: str
    embeddings: np.ndarray  # (N, dim) L2-normalized train embeddings
    labels: np.ndarray  # (N,)
    weights: np.ndarray  # the head's L2-normalized weight rows (sub-center: num_classes·k, class-major)
    min_center_angle: float  # degrees
    mean_intra_angle: float  # degrees
    accuracy: float  # nearest class centre, on the train set

    @property
    def ratio(self) -> float:
        return self.min_center_angle / self.mean_intra_angle


def load_data() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    return (x - x.mean(0)) / (x.std(0) + 1e-3), torch.tensor(digits.target, dtype=torch.long)


def angles(embeddings: np.ndarray, labels: np.ndarray) -> tuple[float, float, float]:
    """(min angle between class centres, mean angle to the own centre, nearest-centre accuracy).

    Angles in degrees; a class centre is the normalized mean of the class's normalized embeddings.
    """
    e = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    classes, index = np.unique(labels, return_inverse=True)
    centers = np.stack([e[index == i].mean(0) for i in range(len(classes))])
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    between = np.degrees(np.arccos(np.clip(centers @ centers.T, -1, 1)))
    min_center = between[np.triu_indices(len(classes), 1)].min()
    intra = np.degrees(np.arccos(np.clip((e * centers[index]).sum(1), -1, 1))).mean()
    accuracy = (classes[(e @ centers.T).argmax(1)] == labels).mean()
    return float(min_center), float(intra), float(accuracy)


def train_toy(
    head: str,
    *,
    seed: int = 0,
    dim: int = 3,
    epochs: int = 60,
    batch_size: int = 128,
    lr: float = 0.01,
    params: dict[str, object] | None = None,
) -> ToyResult:
    """Train MLP + head from `seed` and measure the train embeddings. `params` default to TOY_PARAMS.

    Runs on one thread: the model is too small to gain from more, and on a busy machine OpenMP's
    waiting threads made it 50× slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(head, seed, dim, epochs, batch_size, lr, TOY_PARAMS.get(head, {}) if params is None else params)
    finally:
        torch.set_num_threads(threads)


def _train(head: str, seed: int, dim: int, epochs: int, batch_size: int, lr: float, params: dict[str, object]) -> ToyResult:
    torch.manual_seed(seed)
    x, y = load_data()
    backbone = nn.Sequential(nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, dim))
    classifier = build_head(head, dim, int(y.max()) + 1, **params)
    optimizer = torch.optim.Adam([*backbone.parameters(), *classifier.parameters()], lr=lr)
    steps = epochs * math.ceil(len(x) / batch_size)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    backbone.train()
    classifier.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            loss = classifier.loss(backbone(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    with torch.no_grad():
        embeddings = F.normalize(backbone.eval()(x), dim=1).numpy()
        weights = F.normalize(classifier.weight, dim=1).numpy()
    labels = y.numpy()
    return ToyResult(head, embeddings, labels, weights, *angles(embeddings, labels))
