"""A subject's template at search time (issue 46): the index and the follower keep best faces; a
decision on cosine rows calibrated for the mean (`Decision.template`) scores each subject the index
proposed again against the mean of its faces, read from the store at that moment (or its best face,
where that says more: `service.core.decision.on_means`).

The means are not cached: such a decision is below the table's `cosine_below` subjects, so it reads
at most that many subjects' faces, a few SQLite queries that cost little beside the face's own
detection and embedding (docs/api.md, "Templates from several photos"), and reading them from the
store keeps them right after every enrollment and deletion, in every worker and replica alike.
"""

from __future__ import annotations

import numpy as np

from service.core.decision import Candidate, Decision, on_means
from service.core.errors import SubjectNotFound
from service.gallery.interface import GalleryStore


def search(gallery: GalleryStore, query: np.ndarray, top_k: int, decision: Decision | None = None) -> list[Candidate]:
    """The gallery's top_k subjects for one face, scored against their best faces, or as the
    decision's template says (a subject's mean)."""
    found = gallery.search(query, top_k)
    if decision is None or decision.template == "best_face":
        return found
    return on_means(query, found, lambda subject: subject_faces(gallery, subject), decision)[:top_k]


def subject_faces(gallery: GalleryStore, subject_id: str) -> np.ndarray:
    """The subject's faces now; none when it was deleted since the index proposed it."""
    try:
        return gallery.subject_embeddings(subject_id)
    except SubjectNotFound:
        return np.empty((0, 0), np.float32)
