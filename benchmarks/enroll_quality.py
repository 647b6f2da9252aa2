"""Enrollment's quality gate (service/core/quality.py) on photo sets: what each check refuses and
what it saves. Every photo's largest face is detected, aligned and measured through the service's
pipeline (the measures cached in --cache). Per check at the settings' limits it prints the photos
refused and, with LFW's View-2 pairs (--pairs, and --embeddings: open_set_variants' cache of the
same folder), how often a genuine pair with a refused photo misses at the model's FAR 1e-3
threshold against the pairs without one, and the impostor pairs it would have accepted. With
--embeddings it also prints open-set DIR with and without the gate: every person with three or more
photos enrolled by one and probing with their last, the one-photo people as strangers, decided by
/identify's decision code at the gallery's size (the table; no guard). Without the gate the first
photo is enrolled; with it the first that passes (the photo a person would send next), or the first
when none does (enrolled with allow_low_quality).

    FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. .venv/bin/python benchmarks/enroll_quality.py \\
        --images ../shared/data/lfw --cache /tmp/lfw-quality.npz \\
        --pairs ../shared/data/lfw/pairs.txt --embeddings /tmp/lfw-dlib.npz
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from benchmarks.open_set_variants import embeddings
from service.core.decision import decide_search
from service.core.models.manifest import Manifest
from service.core.open_set import GalleryShape, K, margin_scores
from service.core.quality import FaceQuality, measure, problems
from service.core.settings import get_settings

FIELDS = list(FaceQuality.__dataclass_fields__)


def photos(images: Path) -> list[Path]:
    """Every photo of the identity folders, in open_set_variants' order (its embeddings line up)."""
    return sorted(
        p for d in sorted(images.iterdir()) if d.is_dir() for p in sorted(d.iterdir()) if p.suffix.lower() in (".jpg", ".jpeg", ".png")
    )


def measures(paths: list[Path], template: str, cache: Path | None) -> np.ndarray:
    """A row of FaceQuality's fields per photo (NaN where no face was found)."""
    if cache and cache.is_file():
        return np.load(cache)["measures"]
    from service.core.pipeline import FacePipeline

    pipeline = FacePipeline.from_settings(get_settings(), require_embedder=False)
    out = np.full((len(paths), len(FIELDS)), np.nan)
    for i, path in enumerate(paths):
        image = pipeline.decode(path.read_bytes())
        faces = pipeline.detect(image)
        if faces:
            q = measure(faces[0], pipeline.align(image, faces[:1], template)[0])
            out[i] = [getattr(q, f) for f in FIELDS]
    if cache:
        np.savez(cache, measures=out)
    return out


def pairs(path: Path, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """LFW View-2's genuine and impostor pairs as indices into `paths`."""
    index = {(p.parent.name, p.name): i for i, p in enumerate(paths)}
    photo = lambda name, n: index[(name, f"{name}_{int(n):04d}.jpg")]  # noqa: E731
    genuine, impostor = [], []
    for line in path.read_text().splitlines()[1:]:
        cells = line.split("\t")
        if len(cells) == 3:
            genuine.append((photo(cells[0], cells[1]), photo(cells[0], cells[2])))
        elif len(cells) == 4:
            impostor.append((photo(cells[0], cells[1]), photo(cells[2], cells[3])))
    return np.array(genuine), np.array(impostor)


def open_set(manifest: Manifest, emb: np.ndarray, labels: np.ndarray, refused: np.ndarray) -> None:
    """DIR and strangers matched at FPIR 1e-2 and 1e-3, enrolling ungated and gated photos."""
    ids, counts = np.unique(labels, return_counts=True)
    photos = {i: np.flatnonzero(labels == i) for i in ids}
    known = [photos[i] for i in ids[counts >= 3]]
    strangers = emb[np.concatenate([photos[i] for i in ids[counts == 1]])]
    probes = emb[[p[-1] for p in known]]
    size = len(known)
    shape = GalleryShape(size, size)
    gated_photos = [next((j for j in p[:-1] if not refused[j]), p[0]) for p in known]
    print(f"open set: {size} people enrolled (three or more photos), {len(strangers)} strangers; found / strangers matched")
    for name, gated in (("ungated", False), ("gated", True)):
        enrolled = gated_photos if gated else [p[0] for p in known]
        gallery = emb[enrolled]
        cells, moved = [], np.array([g != p[0] for g, p in zip(gated_photos, known, strict=True)])
        for rate in (1e-2, 1e-3):
            decision = decide_search(manifest, rate, None, None, shape, 0.01)
            found, matched = 0.0, 0.0
            for rows, genuine in ((probes, True), (strangers, False)):
                cos = rows @ gallery.T
                top = -np.sort(-cos, axis=1)[:, : K + 1]
                score = margin_scores(top, size) if decision.score == "margin" else top[:, 0]
                passed = score >= decision.threshold
                if genuine:
                    hits = passed & (np.argmax(cos, axis=1) == np.arange(size))
                    found, found_moved = float(hits.mean()), int(hits[moved].sum())
                else:
                    matched = float(passed.mean())
            cells.append(f"fpir {rate:g}: {found:.1%} / {matched:.2%}, {found_moved} of the {moved.sum()} the gate moves")
        print(f"{name}: " + "; ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="Identity folders of photos.")
    parser.add_argument("--cache", type=Path, help="Measures cache (.npz), made on the first run.")
    parser.add_argument("--limit", type=int, default=0, help="Measure only every k-th photo so that about this many are measured.")
    parser.add_argument("--pairs", type=Path, help="LFW's pairs.txt (with --embeddings).")
    parser.add_argument("--embeddings", type=Path, help="open_set_variants' embeddings cache of the same folder.")
    parser.add_argument("--model", type=Path, default=Path(__file__).parents[1] / "models" / "dlib-resnet-v1.json")
    args = parser.parse_args()
    settings = get_settings()
    manifest = Manifest.load(args.model)
    paths = photos(args.images)
    if args.limit:
        paths = paths[:: max(1, len(paths) // args.limit)]
    rows = measures(paths, manifest.alignment or "dlib_150", args.cache)
    found = ~np.isnan(rows[:, 0])
    failed: dict[str, np.ndarray] = {}
    for i in np.flatnonzero(found):
        for problem in problems(FaceQuality(*rows[i]), settings):
            failed.setdefault(problem.check, np.zeros(len(paths), bool))[i] = True
    failed["any"] = np.any(list(failed.values()), axis=0) if failed else np.zeros(len(paths), bool)
    print("\n".join(machine_lines()))
    print(f"{args.images}: {len(paths)} photos, a face found in {found.sum()}")
    scored = args.pairs and args.embeddings
    if scored:
        emb, _, labels = embeddings(args.images, args.embeddings)
        genuine, impostor = pairs(args.pairs, paths)
        cos = lambda p: np.einsum("pd,pd->p", emb[p[:, 0]], emb[p[:, 1]])  # noqa: E731
        g, s, t = cos(genuine), cos(impostor), manifest.thresholds["1e-3"]
        print(
            f"{len(genuine)} genuine and {len(impostor)} impostor pairs; FAR 1e-3 threshold {t}; genuine pairs missed {(g < t).mean():.1%}"
        )
        print("| check | photos refused | genuine pairs with one | missed with one | missed without | impostor pairs accepted with one |")
        print("| --- | --- | --- | --- | --- | --- |")
    else:
        print("| check | photos refused |\n| --- | --- |")
    for check, bad in failed.items():
        line = f"| {check} | {bad.mean():.2%} ({bad.sum()})"
        if scored:
            bg, bi = bad[genuine].any(axis=1), bad[impostor].any(axis=1)
            missed = (g[bg] < t).mean() if bg.any() else float("nan")
            line += f" | {bg.mean():.2%} | {missed:.1%} | {(g[~bg] < t).mean():.1%} | {(s[bi] >= t).sum()} of {bi.sum()}"
        print(line + " |")
    if args.embeddings:
        open_set(manifest, emb, labels, failed["any"])


if __name__ == "__main__":
    main()
