"""training/near_copy.py: the bound the recall check leaves a face's near copies out from (the
manifest's `near_copy`) is the cosine REACH of the copies reach, and the copies are a mirror image
then re-crops, embedded by the model given."""

from __future__ import annotations

import numpy as np
import pytest

from training.near_copy import COPIES, bound, copy_cosines, drawn, near_copies


def _pixels(batch: np.ndarray) -> np.ndarray:
    """A stand-in embedder: the crop's pixels, centred and normalized."""
    flat = batch.reshape(len(batch), -1).astype(np.float32)
    flat -= flat.mean(1, keepdims=True)
    return flat / np.linalg.norm(flat, axis=1, keepdims=True)


def test_the_bound_is_the_cosine_that_reach_of_the_copies_reach():
    copies = np.linspace(0.9, 1.0, 101)
    block = bound(copies, np.array([0.5, 0.93, 0.95, 0.99]), "made up")
    assert block is not None and block.cosine == pytest.approx(0.92) and block.copies_reaching == pytest.approx(81 / 101, abs=1e-3)
    assert block is not None and block.copies_median == pytest.approx(0.95) and block.genuine_pairs_reaching == 0.75
    assert bound(np.linspace(-0.5, 0.1, 50), np.array([0.2]), "no invariance") is None  # no bound above 0: none written


def test_copies_are_a_mirror_then_re_crops_and_their_cosines_come_from_the_embedder():
    rng = np.random.default_rng(0)
    half = rng.integers(0, 256, (112, 56, 3)).astype(np.uint8)
    symmetric = np.concatenate([half, half[:, ::-1]], axis=1)  # its mirror image is itself
    made = near_copies(symmetric, COPIES, rng)
    assert len(made) == COPIES and all(c.shape == symmetric.shape for c in made) and np.array_equal(made[0], symmetric)
    cosines = copy_cosines(_pixels, [symmetric] * 3, np.random.default_rng(1))
    assert cosines.shape == (3 * COPIES,) and np.allclose(cosines[::COPIES], 1.0, atol=1e-5)
    assert np.all(cosines[1:COPIES] < 1.0)  # the re-crops move the pixels
    assert drawn(10) == list(range(10)) and len(drawn(10_000)) == 600 and drawn(10_000) == drawn(10_000)
