"""Face-recognition training sets: aligned identity folders or InsightFace RecordIO, wrapped as a
torch Dataset whose items are addressed by (index, seed) so augmentation is reproducible."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np
import torch

from training.data.augment import AugmentConfig, augment
from training.data.folders import list_identity_folders
from training.data.preprocess import DEFAULT, SIZE, Preprocessing
from training.data.recordio import RecordIODataset


class Source(Protocol):
    @property
    def labels(self) -> np.ndarray: ...  # read-only: RecordIODataset reads its labels lazily

    def __len__(self) -> int: ...

    def load(self, i: int) -> tuple[np.ndarray, int]: ...


class ImageFolder:
    """Aligned crops (size × size, training's 112 unless an evaluated model takes another) in identity
    folders; label = the identity's rank in sorted order."""

    def __init__(self, root: Path, size: int = SIZE) -> None:
        self.size = size
        self.identities: list[str] = []
        self.paths: list[Path] = []
        labels = []
        for label, (identity, images) in enumerate(list_identity_folders(root)):
            self.identities.append(identity)
            self.paths += images
            labels += [label] * len(images)
        if not self.paths:
            raise ValueError(f"{root} holds no images in identity folders")
        self.labels = np.array(labels, np.int64)

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, i: int) -> tuple[np.ndarray, int]:
        bgr = cv2.imread(str(self.paths[i]), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"{self.paths[i]} is not a readable image")
        if bgr.shape[:2] != (self.size, self.size):
            raise ValueError(
                f"{self.paths[i]} is {bgr.shape[1]}x{bgr.shape[0]}, not an aligned {self.size}x{self.size} crop: "
                "run `facegate align` first (with the model's --template)"
            )
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), int(self.labels[i])


def open_source(path: Path, size: int = SIZE) -> Source:
    """A `.rec` file (or a folder holding train.rec) → RecordIO; any other folder → aligned folders."""
    path = Path(path)
    if path.suffix == ".rec":
        return RecordIODataset(path)
    if (path / "train.rec").is_file():
        return RecordIODataset(path / "train.rec")
    return ImageFolder(path, size)


class Subset:
    """Some samples of a source, keeping the source's labels."""

    def __init__(self, source: Source, indices: np.ndarray) -> None:
        self.source, self.indices = source, np.asarray(indices)
        self.labels = source.labels[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def load(self, i: int) -> tuple[np.ndarray, int]:
        return self.source.load(int(self.indices[i]))


class DataSplitError(ValueError):
    """A training folder too small for the validation split its config asks for: the message names
    the setting to change, since the user's only fix is in the config."""


def split_identities(labels: np.ndarray, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sample indices of (train, validation) with no identity in both; ~val_fraction of identities
    go to validation (only those with ≥ 2 images, which can form a positive pair; at least two
    identities, which can form a negative one)."""
    labels = np.asarray(labels)
    identities, counts = np.unique(labels, return_counts=True)
    eligible = identities[counts >= 2]
    n_val = int(round(len(identities) * val_fraction))
    if n_val > len(eligible) or n_val < 2:
        need = 2 / len(identities) if len(identities) else 1
        raise DataSplitError(
            f"data.val_fraction {val_fraction} of {len(identities)} identities holds out {n_val} for validation "
            f"({len(eligible)} have two or more images); validation pairs need at least 2 held-out identities with "
            f"two images each: set data.val_fraction to {min(need, 0.99):.2f} or more (e.g. --set "
            f"data.val_fraction={min(max(need, 0.2), 0.5):.2f}), "
            "or to 0 to train without validation"
        )
    val_ids = np.random.default_rng(seed).choice(eligible, size=n_val, replace=False)
    in_val = np.isin(labels, val_ids)
    return np.flatnonzero(~in_val), np.flatnonzero(in_val)


def make_pairs(labels: np.ndarray, n_pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n_pairs index pairs (half same identity, half different) and their issame flags."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    by_id = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}
    multi = [c for c, idx in by_id.items() if len(idx) >= 2]
    if not multi or len(by_id) < 2:
        raise ValueError("pairs need an identity with two images and at least two identities")
    pairs, same = [], []
    for k in range(n_pairs):
        if k % 2 == 0:
            a, b = rng.choice(by_id[multi[rng.integers(len(multi))]], size=2, replace=False)
        else:
            while True:
                a, b = rng.integers(len(labels), size=2)
                if labels[a] != labels[b]:
                    break
        pairs.append((a, b))
        same.append(k % 2 == 0)
    return np.array(pairs, np.int64), np.array(same, bool)


class FaceDataset(torch.utils.data.Dataset):
    """Items addressed by (index, seed): the seed drives that sample's augmentation."""

    def __init__(self, source: Source, augment_config: AugmentConfig | None = None, preprocessing: Preprocessing = DEFAULT) -> None:
        self.source = source
        self.augment_config = augment_config
        self.preprocessing = preprocessing

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, seed = item
        crop, label = self.source.load(index)
        if self.augment_config is not None:
            crop = augment(crop, self.augment_config, np.random.default_rng(seed))
        return torch.from_numpy(self.preprocessing.to_input(crop[None])[0]), label


class EpochBatches:
    """The batches of one epoch for one rank: a permutation seeded by (seed, epoch), cut into global
    batches of world_size × batch_size, each rank taking its slice; incomplete batches dropped.
    Starting at batch `start` is how a resumed run picks up mid-epoch."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1, start: int = 0) -> None:
        self.n, self.batch_size, self.seed, self.epoch = n, batch_size, seed, epoch
        self.rank, self.world_size, self.start = rank, world_size, start

    def __len__(self) -> int:
        return max(self.n // (self.batch_size * self.world_size) - self.start, 0)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(self.n)
        seeds = rng.integers(0, 2**63 - 1, size=self.n)
        global_batch = self.batch_size * self.world_size
        for b in range(self.start, self.n // global_batch):
            lo = b * global_batch + self.rank * self.batch_size
            idx = order[lo : lo + self.batch_size]
            yield [(int(i), int(seeds[i])) for i in idx]
