"""Open-set variants on a development open set of training identities (never LFW), as issue 22
asks: which score finds more enrolled people at the same rate of strangers matched?

The identities are split once (seeded): a third become an AS-norm cohort (training/cohort_builder.py), the
rest an open set: --known people enrolled by their first photo (or their first two, for the
template rules) probing with the next, every photo of the others probing as strangers. Each row's DIR
is at the threshold fitted to these strangers (an oracle: it compares scores, not calibrations);
the AS-norm rows also show the realized FPIR of the cohort's own calibrated threshold.

    python benchmarks/open_set_variants.py --images ../shared/data/train [--cache emb.npz]
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np

from service.core.decision import per_comparison_far
from service.core.models.cohort import as_norm, cohort_stats
from service.core.models.manifest import FarCurve, threshold_at
from training.cohort_builder import build

RATES = (1e-1, 1e-2, 1e-3)
DLIB = Path(__file__).parents[1] / "models" / "dlib-resnet-v1.json"


def embeddings(images: Path, cache: Path | None, model: Path = DLIB) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit embeddings, of the flipped crops, identity labels) of every photo, through the service's
    pipeline and the embedder `model` (a manifest; a cache holds one model's)."""
    if cache and cache.is_file():
        data = np.load(cache)
        return data["emb"], data["flip"], np.unique(data["labels"], return_inverse=True)[1]
    from service.core.pipeline import FacePipeline
    from service.core.settings import get_settings
    from training.pair_evaluation import OnnxEmbedder, align_images

    paths = sorted(
        p for d in sorted(images.iterdir()) if d.is_dir() for p in sorted(d.iterdir()) if p.suffix.lower() in (".jpg", ".jpeg", ".png")
    )
    settings = get_settings()
    embedder = OnnxEmbedder(model, settings)
    crops, _ = align_images(paths, FacePipeline.from_settings(settings, require_embedder=False), embedder.alignment)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    emb, flip = unit(embedder.raw(crops)), unit(embedder.raw(np.ascontiguousarray(crops[:, :, ::-1])))
    labels = np.array([p.parent.name for p in paths])
    if cache:
        np.savez(cache, emb=emb, flip=flip, labels=labels)
    return emb, flip, np.unique(labels, return_inverse=True)[1]


def dir_at(correct, known, strangers, rate) -> float:
    return float((correct & (known > np.quantile(strangers, 1 - rate, method="higher"))).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="Identity folders of training photos (never LFW).")
    parser.add_argument("--cache", type=Path, help="Embeddings cache (.npz).")
    parser.add_argument("--known", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    emb, flip, labels = embeddings(args.images, args.cache)
    _, curve, figures = build(emb, labels, seed=args.seed)  # the cohort's identities: a seeded third
    chosen = np.random.default_rng(args.seed).permutation(np.unique(labels))[: round(len(np.unique(labels)) / 3)]
    cohort = emb[np.isin(labels, chosen)]
    rest = np.random.default_rng(args.seed + 1).permutation(np.setdiff1d(np.unique(labels), chosen))
    photos = {i: np.flatnonzero(labels == i) for i in rest}
    known = [i for i in rest if len(photos[i]) >= 3][: args.known]
    strangers = np.concatenate([photos[i] for i in rest if i not in set(known)])
    first, second, probe = (np.array([photos[i][k] for i in known]) for k in (0, 1, 2))
    print(
        f"{platform.node()} ({platform.processor() or platform.machine()}); {len(known)} enrolled, {len(strangers)} stranger probes "
        f"({len(rest) - len(known)} people), cohort {len(cohort)} faces of {len(chosen)} other people"
    )
    print(f"{'variant':42s} " + "  ".join(f"DIR@{r:g}" for r in RATES))

    def row(name, score, note=""):
        """score(gallery rows, probe rows) → (best gallery index, score) per probe."""
        best_k, known_score = score(probe)
        _, stranger_score = score(strangers)
        correct = best_k == np.arange(len(known))
        print(f"{name:42s} " + "  ".join(f"{dir_at(correct, known_score, stranger_score, r):8.3f}" for r in RATES) + note)
        return stranger_score

    def best(matrix):
        b = matrix.argmax(axis=1)
        return b, matrix[np.arange(len(matrix)), b]

    def normalized(x, top, gallery=first, table=emb):
        mg, sg = cohort_stats(table[gallery], cohort, top)
        b, s = best(table[x] @ table[gallery].T)
        return b, as_norm(s, cohort_stats(table[x], cohort, top), (mg[b], sg[b]))

    both = emb + flip
    both /= np.linalg.norm(both, axis=1, keepdims=True)
    row("cosine (today)", lambda x: best(emb[x] @ emb[first].T))
    row("flip TTA: mean of the photo and its mirror", lambda x: best(both[x] @ both[first].T), "  (2× the embedder's work)")

    def cohort_margin(x, k):
        s = np.sort(emb[x] @ emb[first].T, axis=1)[:, ::-1]
        return (emb[x] @ emb[first].T).argmax(axis=1), s[:, 0] - s[:, 1 : k + 1].mean(axis=1)

    row("gallery cohort: best − mean of next 10", lambda x: cohort_margin(x, 10))
    row("gallery cohort: best − second best", lambda x: cohort_margin(x, 1))
    for top in (50, 200):
        strangers_norm = row(f"AS-norm, cohort top {top}", lambda x, t=top: normalized(x, t))
        if top == 200:
            threshold = threshold_at(FarCurve(**curve).curve, per_comparison_far(1e-2, len(known)))
            print(
                f"{'':42s} its calibrated fpir=1e-2 threshold {threshold:.3f}: realized FPIR {(strangers_norm >= threshold).mean():.4f} "
                f"({figures['impostor_pairs']:,} impostor pairs of {figures['calibration_identities']} people)"
            )
    row("AS-norm top 200 + flip TTA", lambda x: normalized(x, 200, table=both))
    print("two photos enrolled:")
    row("  max of the two cosines (today)", lambda x: best(np.maximum(emb[x] @ emb[first].T, emb[x] @ emb[second].T)))
    row("  mean of the two cosines", lambda x: best(0.5 * (emb[x] @ emb[first].T + emb[x] @ emb[second].T)))
    template = emb[first] + emb[second]
    template /= np.linalg.norm(template, axis=1, keepdims=True)
    row("  cosine to the mean embedding", lambda x: best(emb[x] @ template.T))


if __name__ == "__main__":
    main()
