"""Which threshold decides a match.

/verify compares one pair: an explicit cosine, or the manifest's threshold for a false-accept rate
(the request's, else FACEGATE_DEFAULT_FAR). A model calibrated on few people may lack the default's
threshold (12 held-out people give only 1e-2): a request naming no FAR is then decided at the
nearest calibrated FAR not looser than the default, else at the strictest the model has, and the
decision carries a warning saying so, rather than every default request being a 422 or the model
being refused while explicit FARs and thresholds work. A search compares a probe with many faces and keeps the
best, so a per-comparison FAR would let a stranger through about N times as often: /identify decides
by a false-positive identification rate (FPIR, the chance that someone not enrolled is returned as a
match) and turns it into the per-comparison FAR of the number of faces searched,
FAR = 1 − (1 − FPIR)^(1/N), whose threshold the manifest's calibrated curve gives. Verifying against
a subject with k faces is the same search with N = k.

A model whose manifest has an open-set table (`facegate calibrate-open-set`) decides an FPIR on the
margin score instead (service/core/open_set.py): the best subject's cosine and how far it stands
above the next ones, held to a threshold for the gallery's number of subjects, guarded from 100
subjects up by the gallery's own leave-one-out scores: fewer known people missed at the same FPIR.
Below the table's `cosine_below` subjects the best cosine alone is held to the table's cosine rows,
calibrated the same way (in a small gallery the margin's next subjects are too few to say anything).
With a cohort (FACEGATE_COHORT, service/core/models/cohort.py) an FPIR decision holds the best
candidate's AS-norm score to the cohort's own calibrated curve instead. Explicit `far` and
`threshold` stay per-comparison cosine decisions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from service.core.errors import InvalidParameters, UnknownFar
from service.core.models.cohort import Cohort
from service.core.models.manifest import Manifest, OpenSetTable, Template, far_key
from service.core.open_set import (
    GalleryShape,
    K,
    MarginThreshold,
    candidate_scores,
    margin_rate,
    margin_threshold,
    mean_template,
    on_cosine,
    rate_knots,
)


@dataclass(frozen=True)
class Candidate:
    """A face the gallery found for a probe: what a search decision is made on."""

    subject_id: str
    name: str
    similarity: float
    face_id: int
    embedding: np.ndarray = field(repr=False, compare=False)  # the face's, for a cohort-normalized decision
    template: Template = "best_face"  # what `similarity` is against: the subject's best face (face_id), or its faces' mean
    best_face: float | None = None  # scored on the mean's rows: its best face's cosine (the compat similarity's floor reads it)
    mean: float | None = None  # scored on the mean's rows: its mean's cosine, whichever template decided it

    @property
    def face_similarity(self) -> float:
        """The cosine with the subject's best face, whatever its template."""
        return self.similarity if self.best_face is None else self.best_face


def on_means(probe: np.ndarray, candidates: list[Candidate], faces_of: Callable[[str], np.ndarray], decision: Decision) -> list[Candidate]:
    """The candidates a search proposed by their best faces, each scored again for a decision on the
    mean's cosine rows (`faces_of`: its faces' embeddings as the store has them now; a subject left
    with none is dropped): against its subject's mean template, or against its best face where that
    says more (`Decision.on_mean_scale`: the rule before the margin score would match it at a rarer
    stranger rate), and ranked by the decision's score, best first (of equal ones, the earlier proposed)."""
    probe = np.asarray(probe, np.float32).reshape(-1)
    kept, means = [], []
    for candidate in candidates:
        faces = faces_of(candidate.subject_id)
        if len(faces):
            kept.append(candidate)
            means.append(float(mean_template(faces) @ probe))
    bests = [c.face_similarity for c in kept]
    on_face = decision.on_mean_scale(np.array(bests))  # one pass for all: a search's few subjects
    scores = np.maximum(means, on_face)  # what `Decision.scores` holds each to
    scored = [
        replace(c, similarity=b if f > m else m, template="best_face" if f > m else "mean", best_face=b, mean=m)
        for c, m, b, f in zip(kept, means, bests, on_face, strict=True)
    ]
    return [scored[i] for i in sorted(range(len(scored)), key=lambda i: -scores[i])]


@dataclass(frozen=True)
class Margin:
    """A margin-score decision's table, the gallery it was read for, and how its threshold came about."""

    table: OpenSetTable
    gallery: GalleryShape
    detail: MarginThreshold

    @cached_property
    def knots(self) -> tuple[list[float], list[float]]:
        """The thresholds `rate` inverts, read once for all the candidates of a search."""
        return rate_knots(self.table, self.gallery)


@dataclass(frozen=True)
class Decision:
    threshold: float
    far: str | None  # None when the caller gave an explicit threshold, or for a margin decision (no per-comparison FAR)
    fpir: float | None = None  # the promise of a search decided by FPIR
    gallery_faces: int | None = None  # the number of faces that promise was computed for
    extrapolated: bool = False  # the threshold comes from beyond the calibrated points (a fitted tail, a larger gallery)
    cohort: Cohort | None = None  # set when the threshold applies to AS-norm scores against it
    margin: Margin | None = field(default=None, compare=False)  # set when it applies to the margin score
    curve: Manifest | None = field(default=None, compare=False, repr=False)  # the pair's cosine curve an FPIR decision reads
    warning: str | None = None  # why the decision is not at the rate asked for (the default FAR's fallback)

    @property
    def score(self) -> str:
        """What `threshold` applies to."""
        if self.margin:
            return "cosine" if self.margin.detail.cosine else "margin"
        return "as-norm" if self.cohort else "cosine"

    @property
    def template(self) -> Template:
        """What a candidate's cosine is against: its subject's mean where the decision reads cosine rows
        calibrated for the mean (the manifest's `cosine_template`), else its best face."""
        if self.margin and self.margin.detail.cosine:
            return self.margin.table.cosine_template
        return "best_face"

    @property
    def candidates_needed(self) -> int:
        """Subjects a search must return for this decision's score: the margin's best and its k next;
        on the mean every subject (fewer than cosine_below), since the best face ranks them otherwise."""
        if self.template == "mean" and self.margin:
            return max(self.margin.gallery.subjects, 1)
        return K + 1 if self.score == "margin" else 1

    def matches(self, similarity: float) -> bool:
        """A cosine decision (an explicit far or threshold, /verify)."""
        return similarity >= self.threshold

    def on_mean_scale(self, best_faces: np.ndarray) -> np.ndarray:
        """Subjects' best faces' cosines as scores on the mean's cosine rows (a decision whose
        `template` is "mean"), so that a subject matches where either rule says so: its mean's
        cosine by those rows, or its best face by the rule before the margin score (the face's
        calibrated FAR over the gallery's faces, 1 − (1 − FAR)^N, a stranger's chance of scoring as
        high). Each is the mean's threshold at that rate (linear in log10 q between the rows' knots,
        the strictest below them); −inf where the rate is above the rows' loosest or the face below
        the pair curve's first point, or the model has no pair curve. A mean smooths away a probe
        close to one enrolled photo and far from the others: on LFW's galleries of ten photos a
        subject the mean alone found fewer people than the rule before (docs/api.md, "Ten photos")."""
        best = np.asarray(best_faces, np.float64)
        if self.template != "mean" or self.margin is None or self.curve is None:
            return np.full(best.shape, -np.inf)
        try:
            fars, lowest = self.curve.fars_at(best), self.curve.threshold_at(1.0)  # the curve's first point
        except KeyError:
            return np.full(best.shape, -np.inf)
        rates = search_rates(fars, self.gallery_faces or 1)
        logs, thresholds = self.margin.knots
        at = np.log10(np.maximum(rates, 1e-300))
        return np.where((at > logs[-1]) | (best < lowest), -np.inf, np.interp(at, logs, thresholds))

    def scores(self, probe: np.ndarray, candidates: list[Candidate]) -> np.ndarray:
        """What this decision holds to its threshold, per candidate (best first, as a search ranks
        them): the cosine; with a cohort the AS-norm score (the probe's cohort statistics computed
        once for all); for the margin, each one's cosine against the same next subjects
        (`candidate_scores`: the best one's is its S)."""
        cosines = np.array([c.similarity for c in candidates], np.float64)
        if not candidates:
            return cosines
        if self.margin and not self.margin.detail.cosine:
            return candidate_scores(cosines, self.margin.gallery.subjects)
        if self.cohort:
            return self.cohort.normalize(probe, np.stack([c.embedding for c in candidates]), cosines.astype(np.float32))
        if self.template == "mean":  # a candidate decided by its best face, on the mean's scale
            by_face = np.array([c.template == "best_face" and c.mean is not None for c in candidates])
            return np.where(by_face, self.on_mean_scale(cosines), cosines)
        return cosines

    def rate(self, score: float) -> float:
        """The FPIR a score stands for in this gallery (how often a stranger's best scores this high):
        what the compatibility routes' calibrated similarity is made of. A cosine's or an AS-norm
        score's calibrated per-comparison FAR over the faces searched, 1 − (1 − FAR)^N; a margin
        score's, the FPIR whose threshold it is."""
        if self.margin:
            return margin_rate(self.margin.table, self.margin.gallery, score, self.margin.knots)
        curve = self.cohort or self.curve
        if curve is None:
            raise ValueError("an explicit far or threshold decision has no FPIR curve")
        return search_rate(curve.far_at(score), self.gallery_faces or 1)


def default_far_fallback(manifest: Manifest, default_far: str) -> str | None:
    """The calibrated FAR a request naming none is decided at when the manifest lacks the default's
    threshold: the loosest at or below the default, else the strictest there is; None when the
    default is calibrated, or nothing is."""
    key = far_key(default_far)
    if key in manifest.thresholds or not manifest.thresholds:
        return None
    calibrated = sorted(manifest.thresholds, key=float)
    stricter = [far for far in calibrated if float(far) <= float(key)]
    return stricter[-1] if stricter else calibrated[0]


def fallback_warning(manifest: Manifest, default_far: str, fallback: str) -> str:
    available = ", ".join(sorted(manifest.thresholds, key=float))
    return (
        f"the model has no threshold for the default FAR {far_key(default_far)} (FACEGATE_DEFAULT_FAR); decided at FAR {fallback}, "
        f"the nearest it has (available: {available}): pass far or threshold, or calibrate the model on more held-out people"
    )


def decide(manifest: Manifest, far: float | str | None, threshold: float | None, default_far: str) -> Decision:
    if far is not None and threshold is not None:
        raise InvalidParameters("give far or threshold, not both")
    if threshold is not None:
        return Decision(threshold, None)
    try:
        key = far_key(far if far is not None else default_far)
    except ValueError as exc:
        raise InvalidParameters(f"far: {exc}") from None
    if far is None and (fallback := default_far_fallback(manifest, key)):
        return Decision(manifest.threshold(fallback), fallback, warning=fallback_warning(manifest, key, fallback))
    try:
        return Decision(manifest.threshold(key), key)
    except KeyError:
        origin = "requested" if far is not None else "default (FACEGATE_DEFAULT_FAR)"
        available = ", ".join(sorted(manifest.thresholds, key=float)) or "none (pass an explicit threshold)"
        raise UnknownFar(f"the model has no threshold for the {origin} FAR {key}; available FARs: {available}") from None


def per_comparison_far(rate: float, comparisons: int) -> float:
    """The per-comparison FAR at which the best of `comparisons` impostor scores passes with
    probability `rate` (independent comparisons): 1 − (1 − rate)^(1/N)."""
    return -math.expm1(math.log1p(-rate) / max(comparisons, 1))


def search_rate(far: float, comparisons: int) -> float:
    """The chance that the best of `comparisons` independent impostor scores passes a per-comparison
    FAR, 1 − (1 − FAR)^N: `per_comparison_far` read backwards."""
    return float(search_rates(np.array([far]), comparisons)[0])


def search_rates(fars: np.ndarray, comparisons: int) -> np.ndarray:
    """`search_rate` of many FARs at once."""
    return -np.expm1(max(comparisons, 1) * np.log1p(-np.minimum(fars, 1 - 1e-12)))


def decide_search(
    manifest: Manifest,
    fpir: float | None,
    far: float | str | None,
    threshold: float | None,
    gallery: GalleryShape | int,
    default_fpir: float,
    cohort: Cohort | None = None,
) -> Decision:
    """/identify's decision: an explicit threshold or per-comparison FAR when given, else the FPIR
    (the request's, else FACEGATE_DEFAULT_FPIR) for this gallery (its subjects, faces and
    leave-one-out tail; an int: that many subjects of one face each): on AS-norm scores with a
    cohort, else on the margin score when the manifest has its table, else on cosines."""
    if sum(x is not None for x in (fpir, far, threshold)) > 1:
        raise InvalidParameters("give one of fpir, far or threshold")
    if far is not None or threshold is not None:
        return decide(manifest, far, threshold, default_far="")
    rate = default_fpir if fpir is None else fpir
    if not 1e-9 <= rate < 1.0:
        raise InvalidParameters(f"fpir must be in [1e-9, 1), got {rate}")
    shape = gallery if isinstance(gallery, GalleryShape) else GalleryShape(gallery, gallery)
    if cohort is None and manifest.open_set is not None:
        detail = margin_threshold(manifest.open_set, shape, rate)
        return Decision(
            round(detail.threshold, 6),
            None,
            fpir=rate,
            gallery_faces=shape.faces,
            extrapolated=detail.extrapolated,
            margin=Margin(manifest.open_set, shape, detail),
            curve=manifest,  # a best face's rate, where the decision reads the mean's rows (`on_mean_scale`)
        )
    return at_rate(manifest, rate, shape.faces, cohort)


def decide_subject(manifest: Manifest, far: float | str | None, threshold: float | None, default_far: str, faces: int) -> Decision:
    """/verify against a subject with `faces` enrolled faces. Where the manifest's cosine rows hold
    the mean (`cosine_template`) and cover the FAR asked for, the subject's mean template is held to
    their threshold for a gallery of that one subject (`template` "mean": a stranger's cosine with a
    mean of `faces` faces reaches it at that rate); else similarity is the max over its faces, and as
    the FAR asked for is the subject's, each face is held to the per-comparison FAR of `faces` tries."""
    decision = decide(manifest, far, threshold, default_far)
    if decision.far is None or faces <= 1:
        return decision
    table, rate = manifest.open_set, float(decision.far)
    if table is not None and table.cosine_template == "mean" and on_cosine(table, 1) and table.fpirs[-1] <= rate <= table.fpirs[0]:
        shape = GalleryShape(1, faces)
        detail = margin_threshold(table, shape, rate)
        return Decision(
            round(detail.threshold, 6),
            decision.far,
            gallery_faces=faces,
            extrapolated=detail.extrapolated,
            margin=Margin(table, shape, detail),
            curve=manifest,
            warning=decision.warning,
        )
    return each_face(manifest, decision.far, faces, decision.warning)


def each_face(manifest: Manifest, far: str, faces: int, warning: str | None) -> Decision:
    """/verify against a subject on its best face: each of its `faces` held to the per-comparison FAR
    of that many tries at the subject's `far`."""
    return Decision(at_rate(manifest, float(far), faces).threshold, far, gallery_faces=faces, warning=warning)


def on_subject(decision: Decision, faces: np.ndarray, probe: np.ndarray) -> tuple[Decision, Template, float]:
    """/verify against a subject of `faces` (`decide_subject`'s decision): the decision that holds, the
    template it holds and the probe's cosine with it. On the mean's rows the subject's best face
    decides instead where it says more (`Decision.on_mean_scale`), then held to `each_face`'s threshold."""
    best = float(np.max(faces @ probe))
    if decision.template != "mean":
        return decision, "best_face", best
    mean = float(mean_template(faces) @ probe)
    if decision.curve is None or decision.far is None or float(decision.on_mean_scale(np.array(best))) <= mean:
        return decision, "mean", mean
    return each_face(decision.curve, decision.far, len(faces), decision.warning), "best_face", best


def at_rate(manifest: Manifest, rate: float, faces: int, cohort: Cohort | None = None) -> Decision:
    """The threshold that holds `faces` comparisons to `rate`, on the cohort's curve when there is one."""
    per = per_comparison_far(rate, faces)
    curve = cohort or manifest
    try:
        threshold = curve.threshold_at(per)
    except KeyError as exc:
        raise UnknownFar(f"the model has no calibrated FAR curve: {exc.args[0]}; pass far or threshold") from None
    return Decision(
        round(threshold, 6),
        far_key(per),
        fpir=rate,
        gallery_faces=faces,
        extrapolated=curve.beyond_calibration(per),
        cohort=cohort,
        curve=None if cohort else manifest,
    )
