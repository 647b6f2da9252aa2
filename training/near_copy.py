"""Where an embedder's near copies start (the manifest's `near_copy`): the index's recall check
(service/gallery/recall.py) searches enrolled faces as new photos, each with its near copies left
out, since a new photo has none in the gallery. How near a mirror image or a re-crop sits is the
model's own (dlib-resnet-v1's copies: median 0.986; facegate-default's: 0.915), so the bound is
measured per model: the cosine REACH of the copies of some faces reach, with the share of genuine
pairs (two photos of one person) it would also leave out. `facegate calibrate` measures it on the
calibration identities; `benchmarks/near_copy.py` on the training photos and LFW's pairs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np

from service.core.models.manifest import NearCopy

FACES = 600  # faces copied at most
COPIES = 4  # near copies of each
REACH = 0.8  # the share of the copies at or above the bound
BATCH = 32


def near_copies(crop: np.ndarray, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`count` near copies of an aligned crop: its mirror image, then crops of 85–100 % of it at a
    random offset resized back, every other one mirrored."""
    size = crop.shape[0]
    out = [crop[:, ::-1]]
    while len(out) < count:
        side = int(size * rng.uniform(0.85, 1.0))
        x, y = rng.integers(0, size - side + 1, 2)
        copy = cv2.resize(crop[y : y + side, x : x + side], (size, size), interpolation=cv2.INTER_LINEAR)
        out.append(copy[:, ::-1] if len(out) % 2 else copy)
    return out[:count]


def copy_cosines(
    embed: Callable[[np.ndarray], np.ndarray], crops: Sequence[np.ndarray], rng: np.random.Generator, copies: int = COPIES
) -> np.ndarray:
    """Each crop's cosine to each of its `copies` near copies (`embed`: a batch of crops to unit embeddings)."""
    out = []
    for start in range(0, len(crops), BATCH):
        batch = list(crops[start : start + BATCH])
        rows = [image for crop in batch for image in (crop, *near_copies(crop, copies, rng))]
        vectors = embed(np.stack(rows)).reshape(len(batch), copies + 1, -1)
        out.append(np.einsum("fd,fcd->fc", vectors[:, 0], vectors[:, 1:]).ravel())
    return np.concatenate(out)


def bound(copies: np.ndarray, genuine: np.ndarray, source: str, reach: float = REACH) -> NearCopy | None:
    """The cosine `reach` of the copies reach (to the nearest 0.005), with what it leaves out; None
    where that is no cosine above 0 (a model that keeps nothing of a face through a mirror or a crop:
    the manifest then names no bound)."""
    cosine = round(float(np.quantile(copies, 1 - reach)) * 200) / 200
    if cosine <= 0:
        return None
    return NearCopy(
        cosine=cosine,
        copies_reaching=round(float((copies >= cosine).mean()), 3),
        copies_median=round(float(np.median(copies)), 4),
        genuine_pairs_reaching=round(float((genuine >= cosine).mean()), 4) if len(genuine) else 0.0,
        source=source,
    )


def drawn(faces: int, seed: int = 0) -> list[int]:
    """Which of `faces` faces are copied: FACES of them at most, seeded."""
    return sorted(int(i) for i in np.random.default_rng(seed).choice(faces, min(FACES, faces), replace=False))


def measure(
    embed: Callable[[np.ndarray], np.ndarray], crops: Sequence[np.ndarray], genuine: np.ndarray, origin: str, seed: int = 0
) -> NearCopy | None:
    """The bound from near copies of `crops` and the genuine pairs' cosines `genuine`."""
    cosines = copy_cosines(embed, crops, np.random.default_rng(seed))
    return bound(cosines, genuine, f"{len(crops)} faces x {COPIES} copies and {len(genuine)} genuine pairs of {origin}")
