"""Small galleries, where most homes are (issue 46): the same seeded draws decided three ways (four
with --best-face, five with --options).

Per row, --galleries random galleries of N LFW people enrolled by f random photos each (people with
more photos than f), each enrolled person probing with another photo, and --strangers one-photo
people per gallery probing as strangers. Each draw is decided by /identify's decision code at
FPIR 1e-2 and 1e-3 for the gallery's shape (`decide_search`): as it decided before the margin score
(cosines over the N·f faces searched), on the margin score alone (the table's cosine rows unused),
with --best-face a manifest whose cosine rows hold best faces (the one before the mean's rows, e.g.
`git show 27f25da~1:models/dlib-resnet-v1.json`), and as the manifest decides now (the best cosine
below its cosine_below subjects, each subject scored against the template the decision names,
`Decision.template`: its best face, or its faces' mean unless its best face says more,
`on_templates`, as /identify re-scores it). It prints the
people found and the strangers matched, and the CompreFace similarity the compatibility routes
would return (genuine at or above 0.6 and 0.9, strangers at or above 0.4; and at 0.4 with the
decision's rate alone, without the cosine's floor below the decision), as a Markdown table.

    FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. .venv/bin/python benchmarks/small_galleries.py \\
        --images ../shared/data/lfw --cache /tmp/lfw-dlib.npz [--sizes 1,2,3,5,9,30] [--faces 1,3,5]

--options decides one more way beside (issue 46's ten photos per subject, docs/api.md): the mean's
rows read no further than their 5-face table ("5-face rows": what recalibrated 10-face rows as
strict as the 5-face ones would decide).

--flip decides on flip-averaged embeddings (each face's and its mirror's, summed): the tables were
calibrated without it, so only the oracle columns (the threshold fitted to these strangers) compare.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from benchmarks.open_set_variants import DLIB, embeddings
from service.core.decision import Decision, decide_search, search_rate
from service.core.models.manifest import Manifest
from service.core.open_set import GalleryShape, K, margin_scores, mean_template

RATES = (1e-2, 1e-3)
RATE_GRID = np.logspace(-9, math.log10(0.5), 200)  # a score's FPIR read off the decision's thresholds at these


def rules(manifest: Manifest, best_face: Manifest | None = None, options: bool = False) -> dict[str, Manifest]:
    table = manifest.open_set
    margin = None if table is None else table.model_copy(update={"cosine_below": 0, "cosine_template": "best_face"})
    capped = (
        None if table is None else table.model_copy(update={"cosine_tables": [r for r in table.cosine_tables if r.faces_per_subject <= 5]})
    )
    return {
        "before": manifest.model_copy(update={"open_set": None}),
        "margin": manifest.model_copy(update={"open_set": margin}),
        **({"best face": best_face} if best_face else {}),
        "now": manifest,
        **({"5-face rows": manifest.model_copy(update={"open_set": capped})} if options else {}),
    }


def draws(labels: np.ndarray, size: int, faces: int, galleries: int, strangers: int, rng: np.random.Generator):
    """(enrolled photos size × faces, a probe photo per enrolled person, stranger photos) per gallery."""
    ids, counts = np.unique(labels, return_counts=True)
    photos = {i: np.flatnonzero(labels == i) for i in ids}
    singles = np.concatenate([photos[i] for i in ids[counts == 1]])
    eligible = ids[counts > faces]
    for _ in range(galleries):
        shuffled = [rng.permutation(photos[i]) for i in rng.choice(eligible, size, replace=False)]
        yield np.stack([p[:faces] for p in shuffled]), np.array([p[faces] for p in shuffled]), rng.choice(singles, strangers, replace=False)


def scores(emb, labels, size, faces, galleries, strangers, seed):
    """Genuine probes' (right person first, best cosine, margin score) and strangers' (best cosine,
    margin score), pooled, per template (a subject's best face, "best_face", or its faces' "mean")."""
    out: dict[str, list] = {}
    for enrolled, probes, outsiders in draws(labels, size, faces, galleries, strangers, np.random.default_rng([seed, size, faces])):
        gallery = emb[enrolled]
        for rows, genuine in ((emb[probes], True), (emb[outsiders], False)):
            for template in ("best_face", "mean"):
                if template == "mean":
                    subject = rows @ mean_template(gallery).T
                else:
                    subject = np.einsum("pd,nfd->pnf", rows, gallery).max(axis=2)  # each subject's best face
                top = -np.sort(-subject, axis=1)[:, : K + 1]
                prefix = "g" if genuine else "s"
                out.setdefault(f"{prefix}_subjects {template}", []).append(subject)  # every subject's, for `on_templates`
                faces_of_best = np.einsum("pd,pfd->pf", rows, gallery[np.argmax(subject, axis=1)]).max(axis=1)
                out.setdefault(f"{prefix}_face {template}", []).append(faces_of_best)  # the best subject's best face
                out.setdefault(f"{prefix}_cos {template}", []).append(top[:, 0])
                out.setdefault(f"{prefix}_margin {template}", []).append(margin_scores(top, size))
                if genuine:
                    out.setdefault(f"right {template}", []).append(np.argmax(subject, axis=1) == np.arange(size))
    return {key: np.concatenate(value) for key, value in out.items()}


def rate_of(manifest: Manifest, shape: GalleryShape):
    """A score's FPIR under this manifest's default decision for the gallery (`Decision.rate`,
    vectorized: read off its thresholds at RATE_GRID)."""
    thresholds = np.array([decide_search(manifest, q, None, None, shape, 0.01).threshold for q in RATE_GRID])
    order = np.argsort(thresholds)
    return lambda x: np.exp(np.interp(x, thresholds[order], np.log(RATE_GRID)[order]))


def cosine_rate(manifest: Manifest, cosine: np.ndarray, faces: int) -> np.ndarray:
    """A best face's cosine's FPIR over the gallery's faces, the rule before the margin score's."""
    return np.array([search_rate(manifest.far_at(float(c)), faces) for c in cosine])


def similarity(rate: np.ndarray) -> np.ndarray:
    """service/api/compat/similarity.py's calibrated_similarity at the default FPIR 1e-2, vectorized."""
    return np.clip(np.log10(rate) / (2 * math.log10(0.01)), 0, 1)


def on_templates(decision: Decision, s: dict, p: str, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """As /identify scores a gallery on the mean's rows (`on_means`): each subject on its mean, or on
    its best face where that says more (`Decision.on_mean_scale`), the best of them named. For genuine
    ("g") or stranger ("s") probes: the named subject's score, whether it is the probe's own (probe i
    of a gallery is its subject i), its best face's cosine and its mean's."""
    means, faces = s[f"{p}_subjects mean"], s[f"{p}_subjects best_face"]
    scored = np.maximum(means, decision.on_mean_scale(faces))
    named, rows = np.argmax(scored, axis=1), np.arange(len(scored))
    own = np.tile(np.arange(size), len(scored) // size) if p == "g" else np.full(len(scored), -1)
    return scored[rows, named], named == own, faces[rows, named], means[rows, named]


def row(manifest: Manifest, s: dict, size: int, faces: int) -> dict[str, float]:
    shape = GalleryShape(size, size * faces)
    decided = {q: decide_search(manifest, q, None, None, shape, 0.01) for q in RATES}
    default = decided[RATES[0]]
    kind = "margin" if default.score == "margin" else "cos"
    template = default.template  # what /identify scores each subject against for this decision
    genuine, stranger, right = s[f"g_{kind} {template}"], s[f"s_{kind} {template}"], s[f"right {template}"]
    g_cos, s_cos = s[f"g_face {template}"], s[f"s_face {template}"]  # the floor's cosine: the candidate's best face (Candidate.face_cosine)
    g_mean = s_mean = None
    if template == "mean":
        (genuine, right, g_cos, g_mean), (stranger, _, s_cos, s_mean) = (on_templates(default, s, p, size) for p in "gs")
    out = {}
    for q, d in decided.items():
        out[f"found {q:g}"] = float((right & (genuine >= d.threshold)).mean())
        out[f"strangers {q:g}"] = float((stranger >= d.threshold).mean())
        out[f"oracle {q:g}"] = float((right & (genuine > np.quantile(stranger, 1 - q, method="higher"))).mean())
    rate = rate_of(manifest, shape)

    def compat(x: np.ndarray, cosine: np.ndarray, mean: np.ndarray | None, floor: bool = True) -> np.ndarray:
        """search_similarity: the decision's rate, below its threshold no lower than the best face's
        cosine's over the faces searched, nor the mean's (where the best face scored it)."""
        r = rate(x)
        if floor and default.margin is not None:
            below = np.maximum(r, cosine_rate(manifest, cosine, shape.faces))
            r = np.where(x < default.threshold, below if mean is None else np.maximum(below, rate(mean)), r)
        return similarity(r)

    out["genuine ≥ 0.6"] = float((right & (compat(genuine, g_cos, g_mean) >= 0.6)).mean())
    out["genuine ≥ 0.9"] = float((right & (compat(genuine, g_cos, g_mean) >= 0.9)).mean())
    out["strangers ≥ 0.4"] = float((compat(stranger, s_cos, s_mean) >= 0.4).mean())
    out["strangers ≥ 0.4, the decision's rate alone"] = float((compat(stranger, s_cos, s_mean, floor=False) >= 0.4).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="LFW's identity folders (people with one photo are the strangers).")
    parser.add_argument("--cache", type=Path, help="Embeddings cache (.npz), made on the first run.")
    parser.add_argument(
        "--model", type=Path, default=DLIB, help="The embedder's manifest: it embeds the photos (unless --cache has them) and decides."
    )
    parser.add_argument("--sizes", default="1,2,3,5,9,30")
    parser.add_argument("--faces", default="1,3,5")
    parser.add_argument("--galleries", type=int, default=300)
    parser.add_argument("--strangers", type=int, default=25, help="Stranger probes per gallery.")
    parser.add_argument("--best-face", type=Path, help="A manifest whose cosine rows hold best faces, decided beside (`best face`).")
    parser.add_argument("--flip", action="store_true", help="Flip-averaged embeddings (compare the oracle columns only).")
    parser.add_argument("--options", action="store_true", help="Beside: the mean's rows read no further than 5 faces.")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    emb, flip, labels = embeddings(args.images, args.cache, args.model)
    if args.flip:
        emb = (emb + flip) / np.linalg.norm(emb + flip, axis=1, keepdims=True)
    manifest = Manifest.load(args.model)
    decided = rules(manifest, Manifest.load(args.best_face) if args.best_face else None, args.options)
    names = list(decided)
    print("\n".join(machine_lines()))
    print(f"{args.images}: {args.galleries} galleries per row, {args.strangers} strangers each; values {' / '.join(names)}")
    columns = None
    for faces in (int(f) for f in args.faces.split(",")):
        for size in (int(n) for n in args.sizes.split(",")):
            s = scores(emb, labels, size, faces, args.galleries, args.strangers, args.seed)
            cells = {name: row(rule, s, size, faces) for name, rule in decided.items()}
            if columns is None:
                columns = list(cells["now"])
                print("| f × N | " + " | ".join(columns) + " |\n| --- |" + " --- |" * len(columns))
            print(f"| {faces} × {size} | " + " | ".join(" / ".join(f"{100 * cells[n][c]:.2f}" for n in names) for c in columns) + " |")


if __name__ == "__main__":
    main()
