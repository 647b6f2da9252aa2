"""Open-set identification measured the way the service decides it: enroll some people, probe with
other photos of them and with people who are not enrolled, and hold each probe's best subject to the
threshold `service.core.decision.decide_search` gives for the FPIR and the gallery (its subjects,
faces and, from 100 subjects, the guard's leave-one-out tail, computed as the gallery store keeps it).

DIR (detection and identification rate) is the share of enrolled people's probes whose best subject
is right and reaches the threshold; the realized FPIR is the share of strangers' probes that reach
it (returned as someone's match). An oracle row fits the threshold to these very strangers: what the
score could do with a perfectly calibrated threshold, the ceiling of the calibrated one.

The decision is the service's: the margin score when the manifest has its open-set table (and no
cohort is given; below its cosine_below subjects the best subject's cosine, against its faces' mean
where the table's cosine rows are the mean's, or its best face where that says more), AS-norm with
a cohort, else the best cosine; `cosine_rows` repeat the cosine decision (what /identify did before
the margin score) for comparison. `sizes` measure smaller galleries too, both ways: seeded draws of
that many enrolled people, the others' photos joining the strangers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.core.decision import Decision, decide_search
from service.core.models.cohort import Cohort, as_norm
from service.core.models.manifest import Manifest, Template
from service.core.open_set import K, LeaveOneOut, margin_scores, mean_template

FPIRS = (1e-1, 1e-2, 1e-3)
IMAGES = (".jpg", ".jpeg", ".png")


@dataclass
class Protocol:
    gallery: list[Path]  # enrolled photos
    gallery_labels: np.ndarray
    known: list[Path]  # other photos of enrolled people
    known_labels: np.ndarray
    strangers: list[Path]  # people not enrolled: every photo of theirs


def protocol(folder: Path, enroll: int = 1, strangers: int | None = None, swap: bool = False) -> Protocol:
    """Identity folders (LFW's layout: NAME/*.jpg, sorted): a person with more than `enroll` photos is
    enrolled by the first `enroll` and probes with the next (`swap`: enrolled by the next `enroll`,
    probing with the first); a person with fewer is a stranger, probing with every photo (the first
    `strangers` such people, if given)."""
    people = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    gallery, gallery_labels, known, known_labels, others = [], [], [], [], []
    for label, person in enumerate(people):
        photos = sorted(p for p in person.iterdir() if p.suffix.lower() in IMAGES)
        if len(photos) > enroll:
            enrolled, probe = (photos[1 : enroll + 1], photos[0]) if swap else (photos[:enroll], photos[enroll])
            gallery += enrolled
            gallery_labels += [label] * enroll
            known.append(probe)
            known_labels.append(label)
        elif photos:
            others.append(photos)
    if not gallery or not others:
        raise ValueError(f"{folder}: an open set needs people with more than {enroll} photo(s) and people with fewer")
    return Protocol(gallery, np.array(gallery_labels), known, np.array(known_labels), [p for ps in others[:strangers] for p in ps])


def subject_cosines(
    gallery: np.ndarray, labels: np.ndarray, probes: np.ndarray, template: Template = "best_face"
) -> tuple[np.ndarray, np.ndarray]:
    """(probes × subjects cosines to each subject's best face, or its faces' mean, the subjects' labels)."""
    order = np.argsort(labels, kind="stable")
    subjects, starts = np.unique(labels[order], return_index=True)
    if template == "mean":
        means = np.stack([mean_template(faces) for faces in np.split(gallery[order], starts[1:])])
        return probes @ means.T, subjects
    return np.maximum.reduceat(probes @ gallery[order].T, starts, axis=1), subjects


def best_subjects(
    gallery: np.ndarray,
    labels: np.ndarray,
    probes: np.ndarray,
    cohort: Cohort | None = None,
    margin: bool = False,
    template: Template = "best_face",
    decision: Decision | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each probe's best subject as the gallery ranks them (by its best face's cosine, or its mean's
    with `template` "mean", as /identify re-scores them: with the `decision`, its best face's where
    that says more, `Decision.on_mean_scale`) and the score its FPIR decision holds: that cosine, the
    margin score over the next K subjects (`margin`), or with a cohort its AS-norm score (as
    `Decision.scores`)."""
    cosines, subjects = subject_cosines(gallery, labels, probes, template)
    if template == "mean" and decision is not None:
        cosines = np.maximum(cosines, decision.on_mean_scale(subject_cosines(gallery, labels, probes)[0]))
    best = np.argmax(cosines, axis=1)
    cosine = cosines[np.arange(len(probes)), best]
    if margin:
        take = min(K + 1, cosines.shape[1])
        top = -np.sort(-np.partition(cosines, cosines.shape[1] - take, axis=1)[:, -take:], axis=1)
        return subjects[best], margin_scores(top, len(subjects))
    if cohort is None:
        return subjects[best], cosine
    scores = probes @ gallery.T
    face = np.argmax(np.where(labels[None, :] == subjects[best][:, None], scores, -np.inf), axis=1)  # the best subject's best face
    face_mean, face_spread = cohort.stats(gallery)
    return subjects[best], as_norm(cosine, cohort.stats(probes), (face_mean[face], face_spread[face]))


def _rows(manifest, rates, gallery, labels, known, known_labels, strangers, default_fpir, cohort, cosine_only) -> tuple[list, dict]:
    """The decided rows and the DET curve of one gallery, for the service's decision (`cosine_only`:
    the cosine one, as /identify decided before the margin score). The gallery is described as a
    store describes it (its roster and guard: `LeaveOneOut`)."""
    if cosine_only:
        manifest, cohort = manifest.model_copy(update={"open_set": None}), None
    shape = LeaveOneOut.build(np.arange(len(gallery)), [str(x) for x in labels], gallery).shape()
    decisions = [decide_search(manifest, rate, None, None, shape, default_fpir, cohort) for rate in rates]
    kind = decisions[0]
    known_best, known_score = best_subjects(gallery, labels, known, kind.cohort, kind.score == "margin", kind.template, kind)
    _, stranger_score = best_subjects(gallery, labels, strangers, kind.cohort, kind.score == "margin", kind.template, kind)
    correct = known_best == known_labels
    rows = []
    for rate, decision in zip(rates, decisions, strict=True):
        oracle = float(np.quantile(stranger_score, 1 - rate, method="higher"))
        detail = decision.margin.detail if decision.margin else None
        rows.append(
            {
                "fpir": rate,
                "default": rate == default_fpir,
                "score": decision.score,
                "threshold": decision.threshold,
                "far": decision.far,
                "table_threshold": None if detail is None else round(detail.table, 6),
                "guard_threshold": None if detail is None or detail.guard is None else round(detail.guard, 6),
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
    return rows, det


def report(
    manifest: Manifest,
    p: Protocol,
    embed,
    default_fpir: float,
    fpirs=FPIRS,
    cohort: Cohort | None = None,
    sizes=(),
    repeats: int = 10,
    seed: int = 0,
) -> dict:
    """`embed(paths) → unit embeddings`. DIR and realized FPIR at each FPIR the service would be asked
    for, the oracle DIR at the same rate of strangers, and the DET curve, for the service's decision
    and the cosine one; then the same pooled over `repeats` draws of each of `sizes` enrolled people."""
    gallery, known, strangers = embed(p.gallery), embed(p.known), embed(p.strangers)
    rates = sorted({*fpirs, default_fpir}, reverse=True)
    rows, det = _rows(manifest, rates, gallery, p.gallery_labels, known, p.known_labels, strangers, default_fpir, cohort, False)
    cosine_rows, cosine_det = _rows(manifest, rates, gallery, p.gallery_labels, known, p.known_labels, strangers, default_fpir, None, True)
    known_best, _ = best_subjects(gallery, p.gallery_labels, known)
    result = {
        "score": rows[0]["score"],
        "enrolled_subjects": len(np.unique(p.gallery_labels)),
        "gallery_faces": len(gallery),
        "known_probes": len(known),
        "stranger_probes": len(strangers),
        "rank1": float((known_best == p.known_labels).mean()),
        "rows": rows,
        "cosine_rows": cosine_rows,
        "det": det,
        "cosine_det": cosine_det,
        "by_size": [],
    }
    people = np.unique(p.gallery_labels)
    rng = np.random.default_rng(seed)
    for size in (s for s in sizes if s < len(people)):
        pooled: dict[tuple[bool, float], list[tuple[float, float, float, int]]] = {}
        for _ in range(repeats):
            chosen = rng.choice(people, size, replace=False)
            enrolled, probing = np.isin(p.gallery_labels, chosen), np.isin(p.known_labels, chosen)
            outsiders = np.concatenate([strangers, gallery[~enrolled], known[~probing]])  # the others' photos are strangers now
            drawn = (gallery[enrolled], p.gallery_labels[enrolled], known[probing], p.known_labels[probing], outsiders)
            for cosine_only in (False, True):
                for row in _rows(manifest, rates, *drawn, default_fpir, cohort, cosine_only)[0]:
                    runs = pooled.setdefault((cosine_only, row["fpir"]), [])
                    runs.append((row["realized_fpir"], row["dir"], row["threshold"], len(outsiders)))
        result["by_size"].append(
            {
                "subjects": int(size),
                "repeats": repeats,
                **{
                    key: [_pooled(rate, pooled[(cosine_only, rate)]) for rate in rates]
                    for key, cosine_only in (("rows", False), ("cosine_rows", True))
                },
            }
        )
    return result


def _pooled(rate: float, runs: list[tuple[float, float, float, int]]) -> dict:
    """One rate's draws together: strangers passed over all of them, enrolled people found and the threshold on average."""
    realized, found, threshold, strangers = (np.array(column, np.float64) for column in zip(*runs, strict=True))
    return {
        "fpir": rate,
        "realized_fpir": float(np.average(realized, weights=strangers)),
        "dir": float(found.mean()),
        "threshold": float(threshold.mean()),
    }


def det_png(result: dict, path: Path, title: str) -> None:
    """The DET curves (missed enrolled people against strangers accepted, log FPIR) of the service's
    decision and of the cosine one, the decided points on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    curves = [("cosine", result["cosine_det"], result["cosine_rows"], "C0")]
    if result["score"] != "cosine":
        curves.append((result["score"], result["det"], result["rows"], "C3"))
    for name, det, rows, color in curves:
        ax.plot(det["fpir"], det["fnir"], color=color, label=f"{name} score, any threshold")
        for row, marker in zip(rows, "os^vD", strict=False):
            ax.plot(
                row["realized_fpir"] or 1 / max(result["stranger_probes"], 1) / 2,
                1 - row["dir"],
                marker,
                color=color,
                label=f"{name}, fpir={row['fpir']:g}: realized {row['realized_fpir']:.4f}, DIR {row['dir']:.3f}",
            )
    ax.set_xscale("log")
    ax.set_xlim(1 / max(result["stranger_probes"], 1) / 2, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("FPIR (strangers returned as a match)")
    ax.set_ylabel("FNIR (enrolled people missed or misidentified)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
