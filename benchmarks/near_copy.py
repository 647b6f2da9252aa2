"""The cosine at which an enrolled face counts as a near copy of another, for one embedder: the recall
check leaves a held-out face's near copies out with it (service/gallery/recall.py, `without_copies`),
since a new photo has none in the gallery, and reads the bound from the embedder's manifest
(`near_copy`). Copies sit at a cosine that is the embedder's own: a model that is less invariant to
a mirror or a re-crop puts them lower, where a bound measured on another model would keep them in.

The copies: `--faces` photos of the training folder, each aligned through the service's pipeline and
copied as `benchmarks/gallery_ann.py --distractors faces` copies it (its mirror image, then crops of
85–100 % resized back, every other one mirrored). The bound is the cosine that `--reach` of the
copies reach (to the nearest 0.005); against it, the share of LFW's genuine pairs (two photos of one
person, pairs.txt) at or above it: those pairs are left out with a held-out face too, so it should
stay small. Prints the manifest's `near_copy` block.

    FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/near_copy.py --embedder dlib-resnet-v1 \\
        --train ../shared/data/train --lfw ../shared/data/lfw
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from benchmarks.gallery_ann import aligned, photos_of  # noqa: E402
from service.core.pipeline import FacePipeline  # noqa: E402
from service.core.settings import Settings  # noqa: E402
from training.near_copy import bound, copy_cosines  # noqa: E402


def genuine_pairs(lfw: Path, count: int, rng: np.random.Generator) -> list[tuple[Path, Path]]:
    """`count` of pairs.txt's genuine pairs (two photos of one person), drawn."""
    found = []
    for line in (lfw / "pairs.txt").read_text().splitlines()[1:]:
        cells = line.split("\t")
        if len(cells) == 3:
            name, a, b = cells
            found.append((lfw / name / f"{name}_{int(a):04d}.jpg", lfw / name / f"{name}_{int(b):04d}.jpg"))
    return [found[i] for i in sorted(rng.choice(len(found), min(count, len(found)), replace=False))]


def pair_cosines(pipeline: FacePipeline, pairs: list[tuple[Path, Path]]) -> np.ndarray:
    out = []
    for a, b in pairs:
        crops = [aligned(pipeline, a), aligned(pipeline, b)]
        if crops[0] is not None and crops[1] is not None:
            vectors = pipeline.require_embedder().embed(np.stack(crops))  # type: ignore[arg-type]  # both checked above
            out.append(float(vectors[0] @ vectors[1]))
    return np.array(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedder", default=None, help="embedder manifest (default: FACEGATE_EMBEDDER's)")
    parser.add_argument("--train", type=Path, required=True, help="the training faces, one folder per person")
    parser.add_argument("--lfw", type=Path, required=True, help="LFW's folder, with pairs.txt")
    parser.add_argument("--faces", type=int, default=600, help="training photos copied")
    parser.add_argument("--copies", type=int, default=4, help="near copies of each")
    parser.add_argument("--pairs", type=int, default=1500, help="LFW genuine pairs measured")
    parser.add_argument("--reach", type=float, default=0.8, help="the share of the copies at or above the bound")
    args = parser.parse_args()
    settings = Settings() if args.embedder is None else Settings(embedder=args.embedder)
    pipeline = FacePipeline.from_settings(settings)
    manifest = pipeline.require_embedder().manifest
    rng = np.random.default_rng(0)
    photos = photos_of(args.train)
    drawn = [photos[i] for i in sorted(rng.choice(len(photos), min(args.faces, len(photos)), replace=False))]
    crops = [crop for crop in (aligned(pipeline, photo) for photo in drawn) if crop is not None]
    copies = copy_cosines(pipeline.require_embedder().embed, crops, rng, args.copies)
    pairs = pair_cosines(pipeline, genuine_pairs(args.lfw, args.pairs, rng))
    source = f"benchmarks/near_copy.py: {len(crops)} training faces x {args.copies} copies, {len(pairs)} LFW genuine pairs"
    block = bound(copies, pairs, source, args.reach)
    for line in machine_lines():
        print(line)
    print(
        f"embedder {manifest.name} ({manifest.file.sha256[:12]}): {len(copies):,} copies of {len(copies) // args.copies:,} faces, "
        f"{len(pairs):,} LFW genuine pairs"
    )
    print(
        f"copies' cosine: median {np.median(copies):.4f}, 5th percentile {np.quantile(copies, 0.05):.4f}, "
        f"{1 - args.reach:.0%} quantile {np.quantile(copies, 1 - args.reach):.4f}"
    )
    print(f"LFW genuine pairs: median {np.median(pairs):.4f}, 99.9th percentile {np.quantile(pairs, 0.999):.4f}")
    print(json.dumps({"near_copy": None if block is None else block.model_dump()}, indent=2))


if __name__ == "__main__":
    main()
