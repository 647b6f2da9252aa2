"""Which threshold decides a match.

/verify compares one pair: an explicit cosine, or the manifest's threshold for a false-accept rate
(the request's, else FACEGATE_DEFAULT_FAR). A search compares a probe with many faces and keeps the
best, so a per-comparison FAR would let a stranger through about N times as often: /identify decides
by a false-positive identification rate (FPIR, the chance that someone not enrolled is returned as a
match) and turns it into the per-comparison FAR of the number of faces searched,
FAR = 1 − (1 − FPIR)^(1/N), whose threshold the manifest's calibrated curve gives. Verifying against
a subject with k faces is the same search with N = k.

With a cohort (FACEGATE_COHORT, service/core/models/cohort.py) an FPIR decision holds the best candidate's
AS-norm score, not its cosine, to the cohort's own calibrated curve: the same FPIR, fewer known people
missed. Explicit `far` and `threshold` stay per-comparison cosine decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from service.core.errors import InvalidParameters, UnknownFar
from service.core.models.cohort import Cohort
from service.core.models.manifest import Manifest, far_key


@dataclass(frozen=True)
class Candidate:
    """A face the gallery found for a probe: what a search decision is made on."""

    subject_id: str
    name: str
    similarity: float
    face_id: int
    embedding: np.ndarray = field(repr=False, compare=False)  # the face's, for a cohort-normalized decision


@dataclass(frozen=True)
class Decision:
    threshold: float
    far: str | None  # None when the caller gave an explicit threshold
    fpir: float | None = None  # the promise of a search decided by FPIR
    gallery_faces: int | None = None  # the number of faces that promise was computed for
    extrapolated: bool = False  # the threshold comes from the fitted tail beyond the calibrated points
    cohort: Cohort | None = None  # set when the threshold applies to AS-norm scores against it

    @property
    def score(self) -> str:
        """What `threshold` applies to."""
        return "cosine" if self.cohort is None else "as-norm"

    def matches(self, similarity: float) -> bool:
        """A cosine decision (an explicit far or threshold, /verify)."""
        return similarity >= self.threshold

    def best_match(self, probe: np.ndarray, candidates: list[Candidate]) -> Candidate | None:
        """The best-ranked candidate when its score (`search_scores`) reaches the threshold."""
        if candidates and search_scores(self.cohort, probe, candidates[:1])[0] >= self.threshold:
            return candidates[0]
        return None


def decide(manifest: Manifest, far: float | str | None, threshold: float | None, default_far: str) -> Decision:
    if far is not None and threshold is not None:
        raise InvalidParameters("give far or threshold, not both")
    if threshold is not None:
        return Decision(threshold, None)
    try:
        key = far_key(far if far is not None else default_far)
    except ValueError as exc:
        raise InvalidParameters(f"far: {exc}") from None
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


def decide_search(
    manifest: Manifest,
    fpir: float | None,
    far: float | str | None,
    threshold: float | None,
    gallery_faces: int,
    default_fpir: float,
    cohort: Cohort | None = None,
) -> Decision:
    """/identify's decision: an explicit threshold or per-comparison FAR when given, else the FPIR
    (the request's, else FACEGATE_DEFAULT_FPIR) over the `gallery_faces` searched, on AS-norm scores
    when a cohort is given."""
    if sum(x is not None for x in (fpir, far, threshold)) > 1:
        raise InvalidParameters("give one of fpir, far or threshold")
    if far is not None or threshold is not None:
        return decide(manifest, far, threshold, default_far="")
    rate = default_fpir if fpir is None else fpir
    if not 1e-9 <= rate < 1.0:
        raise InvalidParameters(f"fpir must be in [1e-9, 1), got {rate}")
    return at_rate(manifest, rate, gallery_faces, cohort)


def decide_subject(manifest: Manifest, far: float | str | None, threshold: float | None, default_far: str, faces: int) -> Decision:
    """/verify against a subject with `faces` enrolled faces (similarity = the max over them): the
    FAR asked for is the subject's, so each face is held to the per-comparison FAR of `faces` tries."""
    decision = decide(manifest, far, threshold, default_far)
    if decision.far is None or faces <= 1:
        return decision
    return Decision(at_rate(manifest, float(decision.far), faces).threshold, decision.far, gallery_faces=faces)


def at_rate(manifest: Manifest, rate: float, faces: int, cohort: Cohort | None = None) -> Decision:
    """The threshold that holds `faces` comparisons to `rate`, on the cohort's curve when there is one."""
    per = per_comparison_far(rate, faces)
    curve = cohort or manifest
    try:
        threshold = curve.threshold_at(per)
    except KeyError as exc:
        raise UnknownFar(f"the model has no calibrated FAR curve: {exc.args[0]}; pass far or threshold") from None
    return Decision(
        round(threshold, 6), far_key(per), fpir=rate, gallery_faces=faces, extrapolated=curve.beyond_calibration(per), cohort=cohort
    )


def search_scores(cohort: Cohort | None, probe: np.ndarray, candidates: list[Candidate]) -> np.ndarray:
    """What an FPIR decision holds to its threshold, per candidate: the cosine, or with a cohort the
    AS-norm score (the probe's cohort statistics computed once for all of them)."""
    cosines = np.array([c.similarity for c in candidates], np.float32)
    if cohort is None or not candidates:
        return cosines
    return cohort.normalize(probe, np.stack([c.embedding for c in candidates]), cosines)


def search_fars(manifest: Manifest, cohort: Cohort | None, probe: np.ndarray, candidates: list[Candidate]) -> list[float]:
    """The calibrated per-comparison FAR of each search candidate's score, on the curve that score
    is calibrated by (the cohort's or the manifest's)."""
    curve = cohort or manifest
    return [curve.far_at(float(score)) for score in search_scores(cohort, probe, candidates)]
