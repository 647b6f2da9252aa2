"""`facegate calibrate`: the cosine threshold for each target false-accept rate, from impostor pairs
of identities the model never trained on (by default the held-out split of its own training run),
never from the benchmark it is reported on — so LFW's realized FAR is an honest check of it.

A FAR is calibrated only when the impostor pairs are numerous enough that at least
MIN_FALSE_ACCEPTS of them lie above its threshold; a rarer FAR would be fitted to a handful of
pairs, so it is left out of the manifest and the report says how many pairs it would need.

The manifest also gets the whole impostor tail (`far_curve`): thresholds at POINTS_PER_DECADE
log-spaced FARs from 1e-1 down to the last with MIN_FALSE_ACCEPTS (about 4e-8 for 248M pairs), and
an exponential tail fitted to its last decade for the rarer rates a large gallery at a small FPIR
asks for (/identify), with its fit error.

Impostor pairs are pairs of two different people. Identity folders gathered from several sources
hold some people twice under two names (a celebrity in CelebA and in CFP): their cross pairs are
genuine, and a few thousand of them among 10^8 set the whole tail below FAR 1e-5. An identity pair
at least SAME_PERSON_SHARE of whose cross pairs reach the FAR-SAME_PERSON_FAR threshold of all
impostor pairs (for two different people, about one pair in 10,000 does) is taken as one person and
left out, and the manifest's report counts them. The rule can also take out a pair of true
look-alikes: among the default model's 3,441 training identities it left out 120 identity pairs,
2,506 of 250.2 M pairs.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from service.core.fileio import replacing
from service.core.models.cohort import as_norm
from service.core.models.embedder import l2_normalize
from service.core.models.manifest import FarCurve, Manifest, NearCopy, far_key
from service.core.settings import Settings
from training import near_copy
from training.config import TrainConfig
from training.pair_evaluation import OnnxEmbedder
from training.verification import FARS

MIN_FALSE_ACCEPTS = 10
DIGITS = 6  # thresholds are rounded up to this many decimals, which can only lower the FAR
POINTS_PER_DECADE = 4
CURVE_TOP_FAR = 0.1
TAIL_SCORES = 1000  # the highest impostor scores the exponential tail is fitted to
SAME_PERSON_FAR = 1e-4
SAME_PERSON_SHARE = 0.5
# Fewer people than this and the thresholds rest on the look of a handful of faces: `calibrate` says so
# (docs/training.md: calibration wants a few dozen people the model never trained on).
FEW_IDENTITIES = 30
SAME_PERSON_MIN_PAIRS = 3  # cross pairs above the threshold the genuine-share rule (`of_genuine`) needs at least


@dataclass
class Calibration:
    identities: int
    images: int
    genuine_pairs: int
    impostor_pairs: int
    thresholds: dict[str, float] = field(default_factory=dict)
    curve: dict | None = None  # far_curve(): the manifest's fine FAR ↔ threshold table
    realized: dict[str, dict[str, float | None]] = field(default_factory=dict)  # FAR → {far, tar} on these pairs
    omitted: dict[str, str] = field(default_factory=dict)  # FAR → why
    same_person: dict[str, int] = field(default_factory=dict)  # same_person_pairs()'s report
    near_copy: NearCopy | None = None  # where the model's near copies start (training/near_copy.py)

    def as_dict(self) -> dict:
        return {
            "identities": self.identities,
            "images": self.images,
            "genuine_pairs": self.genuine_pairs,
            "impostor_pairs": self.impostor_pairs,
            "left_out_as_one_person": self.same_person,
            "min_false_accepts": MIN_FALSE_ACCEPTS,
            "thresholds": self.thresholds,
            "realized": self.realized,
            "omitted": self.omitted,
        }


def pair_scores(
    embeddings: np.ndarray,
    labels: np.ndarray,
    chunk: int = 1024,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
    one_person: Sequence[tuple[int, int]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """Every unordered pair of unit embeddings → (genuine scores, impostor scores), a block of rows
    at a time so that 20,000 images (200M pairs) need the scores' memory, not an N×N matrix's.
    Scores are cosines, or with `stats` (each image's cohort mean and spread) AS-norm scores.
    `one_person`: identity pairs (a, b) left out of both."""
    e = np.asarray(embeddings, np.float32)
    labels = np.asarray(labels)
    genuine, impostor = [], []
    for start, rows, scores, later in _blocks(e, chunk):
        if stats is not None:
            (mean, spread), end = stats, start + len(rows)
            scores = as_norm(scores, (mean[start:end, None], spread[start:end, None]), (mean[None, start + 1 :], spread[None, start + 1 :]))
        mine, theirs = labels[start : start + len(rows), None], labels[None, start + 1 :]
        same = mine == theirs
        present = set(np.unique(mine).tolist())
        for a, b in (p for p in one_person if p[0] in present or p[1] in present):
            later = later & ~(((mine == a) & (theirs == b)) | ((mine == b) & (theirs == a)))
        genuine.append(scores[later & same])
        impostor.append(scores[later & ~same])
    return np.concatenate(genuine), np.concatenate(impostor)


def _blocks(e: np.ndarray, chunk: int):
    """(first row, rows, their cosines with every later image, mask of the later columns) per block."""
    for start in range(0, len(e), chunk):
        rows = e[start : start + chunk]
        later = np.arange(start + 1, len(e))[None, :] > np.arange(start, start + len(rows))[:, None]
        yield start, rows, rows @ e[start + 1 :].T, later  # row r pairs with every later image: columns start+1 …


def same_person_pairs(
    embeddings: np.ndarray, labels: np.ndarray, impostor: np.ndarray, chunk: int = 1024, of_genuine: float | None = None
) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """(label pairs, report): identity pairs at least SAME_PERSON_SHARE of whose cross pairs reach
    the FAR-SAME_PERSON_FAR threshold of the `impostor` cosines. `of_genuine`: also pairs with at
    least SAME_PERSON_MIN_PAIRS cross pairs there, whose share reaches `of_genuine` times the share of
    genuine pairs (two photos of one identity) that do: two names whose photos match each other
    nearly as often as one person's photos match themselves."""
    labels = np.asarray(labels)
    allowed = math.floor(SAME_PERSON_FAR * len(impostor))
    if not allowed:
        return [], {"identity_pairs": 0, "impostor_pairs": 0}
    threshold = float(np.partition(impostor, len(impostor) - allowed - 1)[len(impostor) - allowed - 1])
    above: dict[tuple[int, int], int] = {}
    genuine = [0, 0]  # genuine pairs above the threshold, genuine pairs
    for start, rows, scores, later in _blocks(np.asarray(embeddings, np.float32), chunk):
        if of_genuine is not None:
            same = later & (labels[start : start + len(rows), None] == labels[None, start + 1 :])
            genuine[0] += int((same & (scores > threshold)).sum())
            genuine[1] += int(same.sum())
        r, c = np.nonzero(later & (scores > threshold))
        a, b = labels[start + r], labels[start + 1 + c]
        keys, counts = np.unique(np.stack([np.minimum(a, b), np.maximum(a, b)])[:, a != b], axis=1, return_counts=True)
        for (x, y), n in zip(keys.T.tolist(), counts.tolist(), strict=True):
            above[(x, y)] = above.get((x, y), 0) + n
    sizes = dict(zip(*np.unique(labels, return_counts=True), strict=True))
    share = SAME_PERSON_SHARE
    if of_genuine is not None and genuine[1]:
        share = min(share, of_genuine * genuine[0] / genuine[1])
    pairs = sorted(
        k
        for k, n in above.items()
        if n >= SAME_PERSON_SHARE * sizes[k[0]] * sizes[k[1]] or (n >= SAME_PERSON_MIN_PAIRS and n >= share * sizes[k[0]] * sizes[k[1]])
    )
    return pairs, {"identity_pairs": len(pairs), "impostor_pairs": int(sum(sizes[a] * sizes[b] for a, b in pairs))}


def just_above(boundary: float) -> float:
    """The threshold rounded up to DIGITS decimals, strictly above `boundary` (which it rejects) also
    in float32, the precision scores are compared at (NumPy compares a float32 array with a Python
    float in float32): a 6-decimal threshold can round onto the boundary score there."""
    step = math.ceil(boundary * 10**DIGITS)
    while step <= boundary * 10**DIGITS or np.float32(step / 10**DIGITS) <= np.float32(boundary):
        step += 1
    return step / 10**DIGITS


def far_curve(impostor: np.ndarray) -> dict:
    """The manifest's `far_curve`: (FAR, threshold) at POINTS_PER_DECADE log-spaced FARs from
    CURVE_TOP_FAR down to the last FAR that still allows MIN_FALSE_ACCEPTS; below it, an exponential
    tail, fitted by maximum likelihood to the TAIL_SCORES highest scores (their mean excess over the
    lowest of them), which uses every one of them rather than a few noisy quantiles. A cosine's
    impostor tail is bounded by 1, so it falls at least as fast: the fitted tail errs strict."""
    n = len(impostor)
    top_count = min(n, math.floor(CURVE_TOP_FAR * n) + 1)
    top = np.sort(np.partition(np.asarray(impostor, np.float32), n - top_count)[n - top_count :])[::-1]  # highest first
    points: list[tuple[float, float]] = []
    for step in range(POINTS_PER_DECADE, 10**6):
        far = 10 ** (-step / POINTS_PER_DECADE)
        allowed = math.floor(far * n + 1e-9)
        if allowed < MIN_FALSE_ACCEPTS:
            break
        threshold = just_above(float(top[allowed]))  # the (allowed+1)-th highest score is rejected
        if points and threshold < points[-1][1]:
            threshold = points[-1][1]
        points.append((float(f"{far:.6g}"), threshold))
    if len(points) < 2:
        raise ValueError(
            f"{n} impostor pairs are too few for a FAR curve (it needs at least {math.ceil(10 * MIN_FALSE_ACCEPTS / CURVE_TOP_FAR)})"
        )
    k = min(TAIL_SCORES, top_count - 1)
    base = float(top[k])  # k scores lie above it: its FAR is k / n
    slope = float(np.mean(top[:k] - base)) * math.log(10)  # threshold per decade of FAR
    model = lambda far: base + slope * math.log10(k / n / far)  # noqa: E731
    fitted = [abs(t - model(f)) for f, t in points if f <= k / n]
    return {
        "points": points,
        "impostor_pairs": n,
        "tail_from": (float(f"{k / n:.6g}"), round(base, 6)),
        "tail_slope": round(max(slope, 1e-6), 6),
        "tail_fit_error": round(max(fitted, default=0.0), 6),
    }


def threshold_for_far(impostor: np.ndarray, far: float) -> float | None:
    """The smallest threshold t (score ≥ t accepts) with at most ⌊far·N⌋ impostor scores accepted,
    rounded up to DIGITS decimals; None when that allows fewer than MIN_FALSE_ACCEPTS."""
    allowed = math.floor(far * len(impostor) + 1e-9)
    if allowed < MIN_FALSE_ACCEPTS:
        return None
    # the (allowed+1)-th highest score must be rejected: t goes strictly above it
    boundary = float(np.partition(np.asarray(impostor, np.float64), len(impostor) - allowed - 1)[len(impostor) - allowed - 1])
    return just_above(boundary)


def calibrate_scores(
    genuine: np.ndarray, impostor: np.ndarray, fars=FARS, identities: int = 0, images: int = 0, same_person: dict[str, int] | None = None
) -> Calibration:
    genuine, impostor = np.asarray(genuine), np.asarray(impostor)
    if len(impostor) == 0:
        raise ValueError("no impostor pairs: calibration needs at least two identities")
    result = Calibration(identities, images, len(genuine), len(impostor), same_person=same_person or {})
    if len(impostor) >= 10 * MIN_FALSE_ACCEPTS / CURVE_TOP_FAR:
        result.curve = far_curve(impostor)
    for far in sorted(fars, reverse=True):
        key = far_key(far)
        t = threshold_for_far(impostor, far)
        if t is None:
            need = math.ceil(MIN_FALSE_ACCEPTS / far)
            result.omitted[key] = f"needs ≥ {need:,} impostor pairs for {MIN_FALSE_ACCEPTS} false accepts, have {len(impostor):,}"
            continue
        result.thresholds[key] = t
        result.realized[key] = {
            "far": float((impostor >= t).mean()),
            "tar": float((genuine >= t).mean()) if len(genuine) else None,
        }
    return result


def heldout_source(manifest: Manifest, data: Path | None):
    """The identities to calibrate on: all of `data` when given, else the held-out identities of the
    model's training run (its config in the manifest's provenance: data.train, val_fraction, seed)."""
    from training.data.datasets import Subset, open_source, split_identities  # torch, which only this path needs

    if data is not None:
        return open_source(data, manifest.input.height), f"all identities of {data}"
    provenance = manifest.provenance.get("config")
    config = TrainConfig.model_validate(provenance) if provenance else None
    if config is None or not config.data.val_fraction:
        raise ValueError(f"{manifest.name}: no held-out split in its provenance; give --data with identities it never trained on")
    train = config.data.train
    source = open_source(train, manifest.input.height)
    _, held = split_identities(source.labels, config.data.val_fraction, config.seed)
    return Subset(source, held), f"held-out identities of {train} (val_fraction {config.data.val_fraction}, seed {config.seed})"


def embed_source(embedder, source) -> tuple[np.ndarray, np.ndarray]:
    """(unit embeddings, labels) of every aligned crop of `source`, embedded as the service embeds."""
    return embed_crops(embedder, [source.load(i)[0] for i in range(len(source))]), np.asarray(source.labels)


def embed_crops(embedder, crops) -> np.ndarray:
    """Unit embeddings of aligned crops, as the service embeds them."""
    return l2_normalize(embedder.raw(np.stack(crops)))


def cached_embeddings(embedder, source, origin: str, cache: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """`embed_source`, kept in `cache` (a folder; None: not kept) under the model file's sha256 and a
    digest of the source (`origin`, its images' paths where it has them, its labels), so a second
    calibration of one model on one folder reads 22k embeddings instead of computing them for minutes."""
    if cache is None:
        return embed_source(embedder, source)
    inner = getattr(source, "source", source)  # a Subset's images are some of its source's
    paths = getattr(inner, "paths", [])
    names = [str(paths[i]) for i in getattr(source, "indices", range(len(paths)))]
    key = "\n".join([origin, *names]).encode() + np.asarray(source.labels).tobytes()
    digest = hashlib.sha256(key).hexdigest()[:16]
    path = Path(cache).expanduser() / f"{embedder.model.manifest.file.sha256[:16]}-{digest}.npz"
    if path.is_file():
        with np.load(path) as data:
            return data["embeddings"], data["labels"]
    embeddings, labels = embed_source(embedder, source)
    with replacing(path, suffix=".npz", durable=False) as tmp:
        np.savez(tmp, embeddings=embeddings, labels=labels)
    return embeddings, labels


def one_person_pairs(
    embeddings: np.ndarray, labels: np.ndarray, of_genuine: float | None = None
) -> tuple[list[tuple[int, int]], dict[str, int]]:
    """`same_person_pairs` against these identities' own impostor pairs."""
    return same_person_pairs(embeddings, labels, pair_scores(embeddings, labels)[1], of_genuine=of_genuine)


def calibrate(manifest_path: Path, settings: Settings, data: Path | None = None, fars=FARS, write: bool = True) -> tuple[Calibration, str]:
    """Embed the calibration identities with the model as the service runs it (`settings`: its model
    cache and device), fit the thresholds, and (unless write=False) store them and the calibration report in the manifest."""
    embedder = OnnxEmbedder(manifest_path, settings)
    source, origin = heldout_source(embedder.model.manifest, data)
    embeddings, labels = embed_source(embedder, source)
    genuine, impostor = pair_scores(embeddings, labels)
    one_person, report = same_person_pairs(embeddings, labels, impostor)
    if report["identity_pairs"]:
        genuine, impostor = pair_scores(embeddings, labels, one_person=one_person)
    result = calibrate_scores(genuine, impostor, fars, identities=len(np.unique(labels)), images=len(labels), same_person=report)
    copied = [source.load(i)[0] for i in near_copy.drawn(len(source))]
    result.near_copy = near_copy.measure(lambda batch: embed_crops(embedder, batch), copied, genuine, origin)
    if write:
        manifest = Manifest.load(manifest_path)
        manifest.thresholds = result.thresholds
        manifest.far_curve = FarCurve(**result.curve) if result.curve else None
        manifest.near_copy = result.near_copy
        manifest.metrics = {**manifest.metrics, "calibration": {"source": origin, **result.as_dict()}}
        manifest.save(manifest_path)
    return result, origin
