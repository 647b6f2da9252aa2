"""Open-set identification measured the way the service decides it: enroll some people, probe with
other photos of them and with people who are not enrolled, and hold each probe's best subject to the
threshold `service.core.decision.decide_search` gives for the FPIR and the gallery's size.

DIR (detection and identification rate) is the share of enrolled people's probes whose best subject
is right and reaches the threshold; the realized FPIR is the share of strangers' probes that reach
it (returned as someone's match). An oracle row fits the threshold to these very strangers: what the
model could do with a perfectly calibrated threshold, the ceiling of the calibrated one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.core.decision import decide_search
from service.core.models.cohort import Cohort, as_norm
from service.core.models.manifest import Manifest

FPIRS = (1e-1, 1e-2, 1e-3)


@dataclass
class Protocol:
    gallery: list[Path]  # enrolled photos
    gallery_labels: np.ndarray
    known: list[Path]  # other photos of enrolled people
    known_labels: np.ndarray
    strangers: list[Path]  # people not enrolled


def protocol(folder: Path, enroll: int = 1, strangers: int | None = None) -> Protocol:
    """Identity folders (LFW's layout: NAME/*.jpg, sorted): a person with more than `enroll` photos is
    enrolled by the first `enroll` and probes with the next; a person with fewer is a stranger,
    probing with the first photo (the first `strangers` of them, if given)."""
    people = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    gallery, gallery_labels, known, known_labels, others = [], [], [], [], []
    for label, person in enumerate(people):
        photos = sorted(p for p in person.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        if len(photos) > enroll:
            gallery += photos[:enroll]
            gallery_labels += [label] * enroll
            known.append(photos[enroll])
            known_labels.append(label)
        elif photos:
            others.append(photos[0])
    if not gallery or not others:
        raise ValueError(f"{folder}: an open set needs people with more than {enroll} photo(s) and people with fewer")
    return Protocol(gallery, np.array(gallery_labels), known, np.array(known_labels), others[:strangers])


def best_subjects(
    gallery: np.ndarray, labels: np.ndarray, probes: np.ndarray, cohort: Cohort | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each probe's best subject as the gallery ranks them (by its best face's cosine) and the score
    its FPIR decision holds: that cosine, or with a cohort its AS-norm score (as `Decision.best_match`)."""
    scores = probes @ gallery.T
    best = np.argmax(scores, axis=1)
    cosine = scores[np.arange(len(probes)), best]
    if cohort is None:
        return labels[best], cosine
    face_mean, face_spread = cohort.stats(gallery)
    return labels[best], as_norm(cosine, cohort.stats(probes), (face_mean[best], face_spread[best]))


def report(manifest: Manifest, p: Protocol, embed, default_fpir: float, fpirs=FPIRS, cohort: Cohort | None = None) -> dict:
    """`embed(paths) → unit embeddings`. DIR and realized FPIR at each FPIR the service would be asked
    for, the oracle DIR at the same rate of strangers, and the DET curve's points."""
    gallery, known, strangers = embed(p.gallery), embed(p.known), embed(p.strangers)
    known_best, known_score = best_subjects(gallery, p.gallery_labels, known, cohort)
    _, stranger_score = best_subjects(gallery, p.gallery_labels, strangers, cohort)
    correct = known_best == p.known_labels
    rows = []
    for rate in sorted({*fpirs, default_fpir}, reverse=True):
        decision = decide_search(manifest, rate, None, None, len(gallery), default_fpir, cohort)
        oracle = float(np.quantile(stranger_score, 1 - rate, method="higher"))
        rows.append(
            {
                "fpir": rate,
                "default": rate == default_fpir,
                "threshold": decision.threshold,
                "far": decision.far,
                "extrapolated": decision.extrapolated,
                "realized_fpir": float((stranger_score >= decision.threshold).mean()),
                "dir": float((correct & (known_score >= decision.threshold)).mean()),
                "oracle_dir": float((correct & (known_score > oracle)).mean()),
            }
        )
    sweep = np.unique(np.concatenate([known_score, stranger_score]))
    det = {
        "fpir": [float((stranger_score >= t).mean()) for t in sweep],
        "fnir": [float(1 - (correct & (known_score >= t)).mean()) for t in sweep],
    }
    return {
        "score": "cosine" if cohort is None else "as-norm",
        "enrolled_subjects": len(np.unique(p.gallery_labels)),
        "gallery_faces": len(gallery),
        "known_probes": len(known),
        "stranger_probes": len(strangers),
        "rank1": float(correct.mean()),
        "rows": rows,
        "det": det,
    }


def det_png(result: dict, path: Path, title: str) -> None:
    """The DET curve (missed enrolled people against strangers accepted, log FPIR), the decided points on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.plot(result["det"]["fpir"], result["det"]["fnir"], label="any threshold")
    for row in result["rows"]:
        ax.plot(
            row["realized_fpir"],
            1 - row["dir"],
            "o",
            label=f"fpir={row['fpir']:g}: realized {row['realized_fpir']:.4f}, DIR {row['dir']:.3f}",
        )
    ax.set_xscale("log")
    ax.set_xlim(1 / max(result["stranger_probes"], 1) / 2, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("FPIR (strangers returned as a match)")
    ax.set_ylabel("FNIR (enrolled people missed or misidentified)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
