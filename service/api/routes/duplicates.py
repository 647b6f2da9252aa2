"""GET /gallery/duplicates: pairs of subjects that may be one person under two ids, read from the
open-set guard the gallery keeps (service/gallery/duplicates.py). Not under /subjects: a subject may
be called `duplicates`."""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import ServiceDep, StrictQuery, subject_id_path
from service.api.schemas import DuplicatePairOut, DuplicatesOut, ErrorResponse, error_responses
from service.core.errors import DuplicatesUnavailable, Overloaded
from service.gallery import duplicates

router = APIRouter(tags=["gallery"])
_building = threading.Lock()  # one state built from the database at a time, where the gallery keeps no guard


@router.get(
    "/gallery/duplicates",
    response_model=DuplicatesOut,
    summary="Subjects that may be one person under two ids",
    responses={
        **error_responses(401, 404, 422),
        503: {
            "model": ErrorResponse,
            "description": (
                "No embedder loaded; a gallery without a guard too large to score per request, or whose guard lists a sample "
                "of its faces, asked for every subject; another such scoring running"
            ),
        },
    },
    dependencies=[StrictQuery],
)
def list_duplicates(
    service: ServiceDep,
    fpir: Annotated[float | None, Query(ge=1e-9, le=0.5, description="The FPIR to flag at (default FACEGATE_DEFAULT_FPIR).")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    subject_id: Annotated[
        str | None, Query(description="Only the pairs in which one of this subject's faces is answered as another.")
    ] = None,
) -> DuplicatesOut:
    """Each pair of subjects where a face of one would be answered by /identify, at `fpir`, as the
    other were its own subject not enrolled (its leave-one-out score reaches the threshold of a gallery
    of the other subjects), highest score first. Merge such pairs: they are one person's, or look alike
    enough to be answered for each other, and they make the open-set guard stricter for everyone.
    With `subject_id`, the pairs of that subject's faces, each searched against every face (any gallery
    size); without it, every pair, from a guard that lists every face."""
    manifest = service.ready().manifest
    faces = service.gallery.shape().faces
    if subject_id is not None:
        own = service.gallery.get_subject(subject_id_path(subject_id)).face_count  # 404 subject_not_found
        if own * faces > duplicates.MAX_SUBJECT_PRODUCTS:  # a request's CPU, bounded (the guard's lock is not held meanwhile)
            raise DuplicatesUnavailable(
                f"subject {subject_id!r} holds {own:,} faces, too many to search against the gallery's {faces:,} per request: "
                "run `facegate gallery duplicates`"
            )
    state = service.gallery.leave_one_out()
    if state is not None and not state.complete and subject_id is None:
        raise DuplicatesUnavailable(
            f"the gallery holds {faces:,} faces and its open-set guard lists a sample of them ({state.share:.2%}): ask for one "
            "subject's pairs (?subject_id=), or run `facegate gallery duplicates` for all of them"
        )
    if state is None:  # no guard kept (FACEGATE_OPEN_SET_GUARD=false, Milvus on PostgreSQL): built here, bounded
        if faces > duplicates.MAX_BUILT_FACES:
            raise DuplicatesUnavailable(
                f"the gallery keeps no open-set guard (FACEGATE_OPEN_SET_GUARD=false, or Milvus on PostgreSQL) and holds {faces:,} faces, "
                f"above the {duplicates.MAX_BUILT_FACES:,} a request scores: run `facegate gallery duplicates`"
            )
        if not _building.acquire(blocking=False):
            raise Overloaded("another GET /gallery/duplicates is scoring the gallery; retry in a few seconds")
        try:
            state = duplicates.build(service.gallery)
        finally:
            _building.release()
    found = duplicates.find(state, manifest, fpir, service.settings.default_fpir, subject_id)
    shown, names = duplicates.names(service.gallery, found.pairs[:limit])
    decision = found.decision
    assert decision.fpir is not None  # decided by fpir
    return DuplicatesOut(
        pairs=[
            DuplicatePairOut(
                face_id=p.face_id,
                subject_id=p.subject_id,
                name=names[p.subject_id],
                other_subject_id=p.other_subject_id,
                other_name=names[p.other_subject_id],
                similarity=round(p.similarity, 6),
                score=round(p.score, 6),
            )
            for p in shown
        ],
        total=len(found.pairs),
        limit=limit,
        fpir=decision.fpir,
        threshold=decision.threshold,
        score="margin" if decision.margin else "cosine",
        subjects=found.shape.subjects,
        faces=found.shape.faces,
    )
