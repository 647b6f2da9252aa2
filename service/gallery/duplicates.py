"""Possible duplicates: pairs of subjects that may be one person under two ids. A face of one is
listed when /identify, at an FPIR, would answer it as the other were its own subject not enrolled:
its leave-one-out score (the open-set guard's, service/core/open_set.py) reaches the threshold of a
gallery of the other subjects, as enrollment's `possible_duplicate_of` scores a new face.

One home for `facegate gallery duplicates` and GET /gallery/duplicates. The service reads the
guard its gallery keeps in step with the index (`GalleryStore.leave_one_out`); the CLI, and the
service where no guard is kept, build the exact state from the gallery's faces (`build`): one exact
search per face, so the API bounds it (`MAX_BUILT_FACES`). A guard that lists a sample of the faces
(a large gallery: open_set.sample_share) answers for one subject at a time, each of its faces
searched exactly against every face then (`find`'s `subject`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.core.decision import Decision, decide_search
from service.core.errors import SubjectNotFound
from service.core.models.manifest import Manifest
from service.core.open_set import GalleryShape, LeaveOneOut
from service.gallery.interface import GalleryStore

PAGE = 10_000  # faces read from the store at a time
MAX_BUILT_FACES = 10_000  # GET /gallery/duplicates builds the state for at most this many faces (about a second on 2 cores)
MAX_SUBJECT_PRODUCTS = 20_000_000  # a subject's faces × the gallery's, scored per request (20 faces at 1M; searches go on meanwhile)


@dataclass(frozen=True)
class Pair:
    """The face of `subject_id` that /identify would answer as `other_subject_id` most surely."""

    face_id: int
    subject_id: str
    other_subject_id: str
    similarity: float  # the face's cosine with the other subject's best face
    score: float  # what the decision holds to its threshold: the margin score, or the cosine without an open-set table


@dataclass(frozen=True)
class Duplicates:
    pairs: list[Pair]  # every pair at or above the threshold, highest score first
    decision: Decision  # for a gallery of the other subjects: its fpir, threshold and score kind
    shape: GalleryShape  # the gallery the scores describe


def build(gallery: GalleryStore, listed: bool = True) -> LeaveOneOut:
    """The leave-one-out state of the active embedder's faces as the store holds them: every face
    listed (an exact search of each), or with `listed` False none (for one subject's, `find`'s `subject`)."""
    ids: list[int] = []
    subjects: list[str] = []
    vectors: list[np.ndarray] = []
    after = 0
    while len(page := gallery.embeddings_after(after, PAGE)[0]):
        for face_id, (subject, _, vector) in sorted(gallery.lookup_faces(page.tolist()).items()):
            ids.append(face_id)
            subjects.append(subject)
            vectors.append(vector)
        after = int(page[-1])
    if not ids:
        return LeaveOneOut(0)
    return LeaveOneOut.build(np.array(ids, np.int64), subjects, np.stack(vectors), sample=False, share=None if listed else 0.0)


def find(state: LeaveOneOut, manifest: Manifest, fpir: float | None, default_fpir: float, subject: str | None = None) -> Duplicates:
    """The pairs /identify would confuse at `fpir` (default `default_fpir`): per pair of subjects,
    the face scoring highest against the other (of equal ones, the lowest id: the same whatever order
    the guard holds its faces in). Decided without a cohort, on the margin score when
    the manifest has its open-set table (on the best cosine below its cosine_below subjects), else on cosines.
    `subject`: only the pairs one of its faces would be answered in (each of them searched exactly,
    the guard sampled or not); the other subject's faces are scored when it is asked about."""
    shape = state.shape()
    others = GalleryShape(max(shape.subjects - 1, 1), max(shape.faces - 1, 1), shape.tail)
    decision = decide_search(manifest, fpir, None, None, others, default_fpir)
    best: dict[tuple[str, str], Pair] = {}
    on_cosine = decision.score == "cosine"  # without a table, or a gallery below its cosine_below
    for face_id, own, other, cosine, score in state.nearest_others(decision.threshold, by_cosine=on_cosine, subject=subject):
        held = cosine if on_cosine else score
        key = (min(own, other), max(own, other))
        if key not in best or (held, -face_id) > (best[key].score, -best[key].face_id):  # a tie: the older face
            best[key] = Pair(face_id, own, other, cosine, held)
    return Duplicates(sorted(best.values(), key=lambda p: (-p.score, p.face_id)), decision, shape)


def names(gallery: GalleryStore, pairs: list[Pair]) -> tuple[list[Pair], dict[str, str]]:
    """The pairs whose subjects both still exist, and their names (a subject deleted since the
    scores were read leaves its pairs out)."""
    found: dict[str, str] = {}
    for subject in dict.fromkeys(s for p in pairs for s in (p.subject_id, p.other_subject_id)):
        try:
            found[subject] = gallery.get_subject(subject).name
        except SubjectNotFound:
            continue
    return [p for p in pairs if p.subject_id in found and p.other_subject_id in found], found
