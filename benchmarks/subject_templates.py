"""A subject's template in a small gallery (issue 46): its best face, the mean of its faces, or both.

The decision in a small gallery holds the best subject's cosine to cosine rows calibrated on people
the model never trained on. Each template needs its own rows, so each is measured end to end: rows
calibrated for it on the calibration identities (`--calibration`: their embeddings and labels in an
.npz, as `facegate calibrate-open-set --cache` keeps them; drawn as it draws them: seeded galleries
of N identities enrolled by f photos, every other identity's photos scored as strangers, 200,000 per
row, one person under two names not compared), then the same seeded
LFW draws as benchmarks/small_galleries.py decided at FPIR 1e-2 and 1e-3 with them: the people found
(right subject first, at or above T) and the strangers matched. "mean" scores a subject by the
probe's cosine with its faces' embeddings averaged (and normalized); "both" by the higher of the two.

    FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. .venv/bin/python benchmarks/subject_templates.py \\
        --images ../shared/data/lfw --cache /tmp/lfw-dlib.npz --calibration ~/.cache/facegate/embeddings/FILE.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from benchmarks.open_set_variants import embeddings
from benchmarks.small_galleries import draws
from training.open_set_table import GALLERIES, GALLERY_FACES, ONE_PERSON_OF_GENUINE, SAMPLES, partners, threshold_at
from training.thresholds import one_person_pairs

TEMPLATES = ("best", "mean", "both")
RATES = (1e-2, 1e-3)


def subject_scores(probes: np.ndarray, gallery: np.ndarray, faces: int, template: str) -> np.ndarray:
    """(probes, subjects) scores against a gallery of subjects × `faces` rows, each enrolled face a row."""
    enrolled = gallery.reshape(-1, faces, gallery.shape[1])
    best = np.einsum("pd,nfd->pn", probes, enrolled) if faces == 1 else np.einsum("pd,nfd->pnf", probes, enrolled).max(axis=2)
    if template == "best":
        return best
    mean = enrolled.mean(axis=1)
    mean = probes @ (mean / np.linalg.norm(mean, axis=1, keepdims=True)).T
    return mean if template == "mean" else np.maximum(best, mean)


def calibrated(
    emb, labels, size: int, faces: int, template: str, pairs: dict[int, set[int]], samples: int, seed: int, pool=None, rates=RATES
) -> dict:
    """T at `rates` for the best subject's `template` score, from strangers to seeded galleries of the
    calibration identities (one person under two names not compared), as calibrate-open-set draws them;
    `pool` (a mask over the sorted identities): only those enrolled, every identity still a stranger."""
    rng = np.random.default_rng([seed, faces, size])
    identities, inverse = np.unique(labels, return_inverse=True)
    photos = np.split(np.argsort(inverse, kind="stable"), np.cumsum(np.bincount(inverse))[:-1])
    eligible = np.array([i for i, p in enumerate(photos) if len(p) >= faces and (pool is None or pool[i])])
    per_gallery = -(-samples // max(GALLERIES, min(samples // 10, -(-GALLERY_FACES // (size * faces)))))
    gathered, count = [], 0
    while count < samples:
        chosen = rng.choice(eligible, size, replace=False)
        gallery = emb[np.concatenate([rng.choice(photos[i], faces, replace=False) for i in chosen])]
        outside = np.ones(len(identities), bool)
        outside[chosen] = False
        left = np.flatnonzero(outside[inverse])
        probes = rng.choice(left, min(len(left), per_gallery), replace=False)
        scores = subject_scores(emb[probes], gallery, faces, template)
        for row, identity in enumerate(inverse[probes]):
            scores[row, np.isin(chosen, list(pairs.get(int(identity), ())))] = -np.inf
        gathered.append(scores.max(axis=1))
        count += len(probes)
    scores = np.concatenate(gathered)
    scores = scores[np.isfinite(scores)]
    return {q: threshold_at(scores, q) for q in rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="LFW's identity folders (people with one photo are the strangers).")
    parser.add_argument("--cache", type=Path, help="LFW embeddings cache (.npz), as benchmarks/small_galleries.py keeps it.")
    parser.add_argument(
        "--calibration", type=Path, required=True, help="Embeddings and labels of identities the model never trained on (.npz)."
    )
    parser.add_argument("--sizes", default="1,2,3,5,9")
    parser.add_argument("--faces", default="3,5")
    parser.add_argument("--galleries", type=int, default=300)
    parser.add_argument("--strangers", type=int, default=25, help="Stranger probes per gallery.")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="Calibration strangers per row.")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with np.load(args.calibration) as data:
        train, train_labels = data["embeddings"], data["labels"]
    pairs = partners(train_labels, one_person_pairs(train, train_labels, of_genuine=ONE_PERSON_OF_GENUINE)[0])
    lfw, _, labels = embeddings(args.images, args.cache)
    print("\n".join(machine_lines()))
    print(
        f"rows calibrated on {args.calibration.name} ({len(train_labels):,} photos, {args.samples:,} strangers a row); "
        f"{args.images}: {args.galleries} galleries per row, {args.strangers} strangers each; values best / mean / both"
    )
    print("| f × N | T at 1e-2 | found at 1e-2 | strangers at 1e-2 | T at 1e-3 | found at 1e-3 | strangers at 1e-3 |")
    print("| --- |" + " --- |" * 6)
    for faces in (int(f) for f in args.faces.split(",")):
        for size in (int(n) for n in args.sizes.split(",")):
            drawn = list(draws(labels, size, faces, args.galleries, args.strangers, np.random.default_rng([args.seed, size, faces])))
            cells: dict[str, list[str]] = {}
            for template in TEMPLATES:
                t = calibrated(train, train_labels, size, faces, template, pairs, args.samples, 0)
                right, genuine, strangers = [], [], []
                for enrolled, probes, outsiders in drawn:
                    gallery = lfw[enrolled.reshape(-1)]
                    scores = subject_scores(lfw[probes], gallery, faces, template)
                    right.append(np.argmax(scores, axis=1) == np.arange(size))
                    genuine.append(scores.max(axis=1))
                    strangers.append(subject_scores(lfw[outsiders], gallery, faces, template).max(axis=1))
                r, g, s = map(np.concatenate, (right, genuine, strangers))
                for q in RATES:
                    cells.setdefault(f"T {q:g}", []).append(f"{t[q]:.4f}")
                    cells.setdefault(f"found {q:g}", []).append(f"{100 * (r & (g >= t[q])).mean():.1f}")
                    cells.setdefault(f"strangers {q:g}", []).append(f"{100 * (s >= t[q]).mean():.2f}")
            print(f"| {faces} × {size} | " + " | ".join(" / ".join(v) for v in cells.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
