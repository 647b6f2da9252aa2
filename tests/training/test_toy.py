"""The seeds' claim, checked for real on the toy problem (training/toy.py): margins separate classes
by angle better than softmax."""

from __future__ import annotations

import pytest

from tests.requirements import importorskip

importorskip("torch")

# Sub-center ArcFace makes no such claim: on clean data it spreads a class over 2–3 sub-centres by design
# (seed 0: 58/5/115 samples), so its class-mean ratio is 3.89 (45.7°/11.8°) against softmax's 3.99; over
# 16 seeds 3.62–10.38, below softmax on seeds 0 and 12. It is left out (an xfail(strict=False), as it
# was, passes whichever way it comes out); its dominant sub-centres alone reach 10.6.
MARGIN_HEADS = (
    "lsoftmax",
    "sphereface",
    "amsoftmax",
    "cosface",
    "arcface",
    "combined",
    "curricularface",
    "magface",
    "adaface",
)


@pytest.fixture(scope="module")
def softmax_toy():
    importorskip("sklearn")
    from training.toy import train_toy

    return train_toy("softmax", seed=0)


@pytest.mark.parametrize("name", MARGIN_HEADS)
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
