"""`facegate eval`: verification accuracy of a checkpoint or an exported ONNX model on LFW-layout
pairs, an InsightFace verification `.bin`, or a CSV of image pairs.

Both model kinds go through the same crops and the same preprocessing (`to_input` / the manifest's
`preprocess`), so a checkpoint and its export give the same figures. Raw photos are detected and
aligned by the service's own pipeline; an image without a detected face is aligned with the median
landmarks of the detected ones (a centre crop at the typical face scale) and counted.
"""

from __future__ import annotations

import csv
import hashlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import cv2
import numpy as np

from service.core.alignment import TEMPLATES, align_face
from service.core.console import progress_bar
from service.core.errors import ModelError
from service.core.fileio import replacing
from service.core.models.embedder import FaceEmbedder, l2_normalize
from service.core.models.files import load_model
from service.core.settings import Settings
from training.data.preprocess import ALIGNMENT, DEFAULT, SIZE, Preprocessing, for_backbone
from training.verification import at_thresholds, plot_roc, verification_metrics


@dataclass
class VerificationSet:
    name: str
    crops: np.ndarray  # N×S×S×3 uint8 RGB, aligned onto the evaluated model's template
    pairs: np.ndarray  # P×2 indices into crops
    issame: np.ndarray  # P bool
    folds: np.ndarray  # P fold ids
    fallbacks: int = 0  # images aligned without a detected face


class Embedder(Protocol):
    def raw(self, crops: np.ndarray, /) -> np.ndarray:
        """N aligned crops (uint8 RGB, the embedder's template) → N×D un-normalized embeddings."""

    alignment: str

    @property
    def device(self) -> str:
        """Where it runs: "cpu", "cuda:0", … (read-only: a checkpoint's is where its backbone lives)."""


class TorchEmbedder:
    def __init__(self, backbone, batch_size: int = 64, preprocessing: Preprocessing = DEFAULT) -> None:
        self.backbone, self.batch_size, self.preprocessing = backbone, batch_size, preprocessing
        self.alignment = preprocessing.alignment  # the crops the backbone was trained on

    @property
    def device(self) -> str:
        return str(next(self.backbone.parameters()).device)

    def raw(self, crops: np.ndarray) -> np.ndarray:
        import torch

        device = next(self.backbone.parameters()).device
        was_training = self.backbone.training
        self.backbone.eval()
        out = []
        with torch.no_grad():
            for i in range(0, len(crops), self.batch_size):
                x = torch.from_numpy(self.preprocessing.to_input(crops[i : i + self.batch_size])).to(device)
                out.append(self.backbone(x).float().cpu().numpy())
        self.backbone.train(was_training)
        return np.concatenate(out)


class OnnxEmbedder:
    """An exported model loaded and run exactly as the service runs it (manifest, sha256, I/O check,
    preprocessing and batching of `FaceEmbedder`)."""

    def __init__(self, manifest_path: Path, settings: Settings, batch_size: int = 64) -> None:
        # the file beside its manifest (an export), else in the settings' model cache (a pulled or imported
        # model); the service's provider choice (settings.device): CUDA when onnxruntime offers it and a GPU is usable
        self.model = load_model(str(manifest_path), Path(manifest_path).parent, settings.model_cache, device=settings.device)
        manifest = self.model.manifest
        if manifest.alignment is None:  # only an embedder's manifest names one (checked when it is loaded)
            raise ModelError(f"{manifest.name} is a {manifest.task}, not an embedder")
        self.alignment = manifest.alignment
        self.device = "cuda" if self.model.session.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
        self.raw = FaceEmbedder(self.model.manifest, self.model.session, [batch_size]).raw


def torch_device(device: str = "auto") -> str:
    """The torch device a checkpoint is evaluated on: CUDA when present, unless told otherwise."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_embedder(path: Path, settings: Settings, device: str = "auto") -> tuple[Embedder, str]:
    """A manifest (.json), an .onnx with its manifest beside it, or a training checkpoint (whose
    backbone is moved to `device`: CUDA when present under "auto")."""
    path = Path(path)
    if path.suffix == ".onnx":
        path = path.with_suffix(".json")
    if path.suffix == ".json":
        return OnnxEmbedder(path, settings), "onnx"
    from training.checkpoint import load_backbone  # torch: only a checkpoint needs it, not the ONNX commands

    backbone, config, _ = load_backbone(path, settings)
    return TorchEmbedder(backbone.to(torch_device(device)), preprocessing=for_backbone(config.backbone, settings.models_dir)), "checkpoint"


CHUNK = 512  # crops per progress step


def embed(embedder: Embedder, crops: np.ndarray, flip: bool, advance=None) -> np.ndarray:
    """Unit embeddings; with flip-TTA the raw embeddings of the crop and its mirror are summed first.
    `advance(n)` is called after each chunk of n crops (a progress bar)."""
    out = []
    for i in range(0, len(crops), CHUNK):
        chunk = crops[i : i + CHUNK]
        e = embedder.raw(chunk)
        if flip:
            e = e + embedder.raw(np.ascontiguousarray(chunk[:, :, ::-1]))
        out.append(e)
        if advance is not None:
            advance(len(chunk) * (2 if flip else 1))
    return l2_normalize(np.concatenate(out))


def evaluate(
    embedder: Embedder,
    vset: VerificationSet,
    roc_png: Path | None = None,
    thresholds: dict[str, float] | None = None,
    progress: bool = False,
) -> dict:
    """10-fold metrics with and without flip-TTA; with `thresholds` (a manifest's FAR → cosine), also
    the FAR and TAR those thresholds realize here. `progress` shows a bar over the forward passes."""
    results = {"set": vset.name, "images": int(len(vset.crops)), "fallback_alignments": vset.fallbacks, "device": embedder.device}
    curves = {}
    with progress_bar(f"embed on {embedder.device}", 3 * len(vset.crops), enabled=progress) as advance:
        for flip in (False, True):
            e = embed(embedder, vset.crops, flip, advance)
            scores = np.sum(e[vset.pairs[:, 0]] * e[vset.pairs[:, 1]], axis=1)
            key = "flip" if flip else "no_flip"
            metrics = verification_metrics(scores, vset.issame, vset.folds)
            if thresholds:
                metrics["at_thresholds"] = at_thresholds(scores, vset.issame, thresholds)
            results[key] = metrics
            curves[key] = (scores, vset.issame)
    if roc_png is not None:
        plot_roc(curves, roc_png)
    return results


# ---- verification sets ----


def align_images(paths: list[Path], pipeline, template: str = ALIGNMENT, advance=lambda n: None) -> tuple[np.ndarray, int]:
    """Images → crops aligned onto `template` through the service pipeline (largest face). An image of
    the template's size is taken as already aligned. Undetected faces fall back to the median
    landmarks of the detected ones. `advance(1)` after each image (a progress bar)."""
    points, size = TEMPLATES[template]
    crops: dict[int, np.ndarray] = {}  # by position in `paths`; the undetected ones filled last
    found, missing = [], []
    images: dict[int, np.ndarray] = {}  # the undetected ones, kept for their fallback alignment
    for i, path in enumerate(paths):
        advance(1)
        image = pipeline.decode(Path(path).read_bytes())
        if image.shape[:2] == (size, size):
            crops[i] = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
            continue
        faces = pipeline.detect(image)
        if faces:
            crops[i] = pipeline.align(image, faces[:1], template)[0]
            found.append(faces[0].landmarks / np.array(image.shape[1::-1], np.float32))
        else:
            missing.append(i)
            images[i] = image
    if missing:
        median = np.median(found, axis=0) if found else None
        for i in missing:
            h, w = images[i].shape[:2]
            if median is None:  # nothing detected anywhere: the template at half the image's short side
                side = min(h, w) / 2
                landmarks = points * side / size + np.array([(w - side) / 2, (h - side) / 2])
            else:
                landmarks = median * np.array([w, h], np.float32)
            crops[i] = align_face(images[i], landmarks, template)
    return np.stack([crops[i] for i in range(len(paths))]), len(missing)


def cached_crops(paths: list[Path], pipeline, cache_dir: Path | None, key: str, template: str, progress: bool) -> tuple[np.ndarray, int]:
    """Aligned crops of `paths`, from the cache when this list was aligned before (a progress bar
    over the photos otherwise: aligning LFW takes minutes on a CPU)."""
    if cache_dir is None:
        with progress_bar("align", len(paths), enabled=progress) as advance:
            return align_images(paths, pipeline, template, advance)
    digest = hashlib.sha256((key + template + "\n".join(map(str, paths))).encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"aligned-{digest}.npz"
    if cache.is_file():
        data = np.load(cache)
        return data["crops"], int(data["fallbacks"])
    with progress_bar("align (cached for next time)", len(paths), enabled=progress) as advance:
        crops, fallbacks = align_images(paths, pipeline, template, advance)
    with replacing(cache, suffix=".npz", durable=False) as tmp:
        np.savez(tmp, crops=crops, fallbacks=fallbacks)
    return crops, fallbacks


def read_lfw_pairs(pairs_txt: Path) -> tuple[list[tuple[str, int, str, int]], np.ndarray, np.ndarray]:
    """LFW View 2 `pairs.txt`: header `folds n`, then per fold n matched and n mismatched lines."""
    lines = Path(pairs_txt).read_text().split("\n")
    n_folds, per_fold = map(int, lines[0].split())
    pairs, issame = [], []
    for line in lines[1:]:
        parts = line.split()
        if len(parts) == 3:
            pairs.append((parts[0], int(parts[1]), parts[0], int(parts[2])))
            issame.append(True)
        elif len(parts) == 4:
            pairs.append((parts[0], int(parts[1]), parts[2], int(parts[3])))
            issame.append(False)
    if len(pairs) != n_folds * 2 * per_fold:
        raise ValueError(f"{pairs_txt}: {len(pairs)} pairs, the header promises {n_folds}×2×{per_fold}")
    folds = np.repeat(np.arange(n_folds), 2 * per_fold)
    return pairs, np.array(issame), folds


def load_lfw(
    pairs_txt: Path, images: Path, pipeline, cache_dir: Path | None = None, template: str = ALIGNMENT, progress: bool = False
) -> VerificationSet:
    pairs, issame, folds = read_lfw_pairs(pairs_txt)
    names = sorted({(n, i) for a, ia, b, ib in pairs for n, i in ((a, ia), (b, ib))})
    position = {k: j for j, k in enumerate(names)}
    paths = [Path(images) / n / f"{n}_{i:04d}.jpg" for n, i in names]
    crops, fallbacks = cached_crops(paths, pipeline, cache_dir, "lfw", template, progress)
    index = np.array([(position[(a, ia)], position[(b, ib)]) for a, ia, b, ib in pairs])
    return VerificationSet(Path(pairs_txt).parent.name or "lfw", crops, index, issame, folds, fallbacks)


def load_bin(path: Path, n_folds: int = 10) -> VerificationSet:
    """InsightFace verification `.bin`: pickle of (list of encoded images, list of issame); images
    2k and 2k+1 form pair k. The images are already aligned 112×112."""
    with open(path, "rb") as fh:
        bins, issame = pickle.load(fh, encoding="bytes")
    crops = []
    for data in bins:
        bgr = cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"{path}: an image does not decode")
        if bgr.shape[:2] != (SIZE, SIZE):
            bgr = cv2.resize(bgr, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
        crops.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    n = len(issame)
    pairs = np.stack([np.arange(0, 2 * n, 2), np.arange(1, 2 * n, 2)], axis=1)
    folds = np.arange(n) * n_folds // n
    return VerificationSet(Path(path).stem, np.stack(crops), pairs, np.array(issame, bool), folds)


def load_csv(
    path: Path, pipeline, cache_dir: Path | None = None, n_folds: int = 10, template: str = ALIGNMENT, progress: bool = False
) -> VerificationSet:
    """A CSV with columns path1,path2,issame (paths relative to the CSV; issame 1/0/true/false)."""
    root = Path(path).parent
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    files = sorted({r[k] for r in rows for k in ("path1", "path2")})
    position = {f: i for i, f in enumerate(files)}
    crops, fallbacks = cached_crops([root / f for f in files], pipeline, cache_dir, "csv", template, progress)
    pairs = np.array([(position[r["path1"]], position[r["path2"]]) for r in rows])
    issame = np.array([r["issame"].strip().lower() in ("1", "true", "yes") for r in rows])
    folds = np.arange(len(rows)) * n_folds // len(rows)
    return VerificationSet(Path(path).stem, crops, pairs, issame, folds, fallbacks)


def holdout_set(source, n_pairs: int, seed: int) -> VerificationSet:
    """Validation pairs from held-out identities of an aligned training source (a Subset)."""
    from training.data.datasets import make_pairs  # torch, which the ONNX commands do without

    pairs, issame = make_pairs(source.labels, n_pairs, seed)
    used = np.unique(pairs)
    position = np.full(len(source), -1)
    position[used] = np.arange(len(used))
    crops = np.stack([source.load(int(i))[0] for i in used])
    folds = np.arange(n_pairs) * 10 // n_pairs
    return VerificationSet("holdout", crops, position[pairs], issame, folds)
