"""/subjects: the people in the gallery. Every write is committed before its 2xx."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.deps import ServiceDep
from service.api.schemas import INT64_MAX, SubjectIn, SubjectOut, SubjectPage, SubjectPatch, error_responses

router = APIRouter(tags=["gallery"])


@router.post("/subjects", status_code=201, response_model=SubjectOut, responses=error_responses(401, 409, 413, 422))
def create_subject(body: SubjectIn, service: ServiceDep) -> SubjectOut:
    """Create a subject (a person); faces are enrolled with POST /subjects/{id}/faces."""
    return SubjectOut.of(service.gallery.create_subject(body.name, body.metadata, body.id))


@router.get("/subjects", response_model=SubjectPage, responses=error_responses(401, 422))
def list_subjects(
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> SubjectPage:
    """Subjects in creation order, a page at a time."""
    subjects, total = service.gallery.list_subjects(limit, offset)
    return SubjectPage(subjects=[SubjectOut.of(s) for s in subjects], total=total, limit=limit, offset=offset)


@router.get("/subjects/{subject_id}", response_model=SubjectOut, responses=error_responses(401, 404))
def get_subject(subject_id: str, service: ServiceDep) -> SubjectOut:
    return SubjectOut.of(service.gallery.get_subject(subject_id))


@router.patch("/subjects/{subject_id}", response_model=SubjectOut, responses=error_responses(401, 404, 422))
def update_subject(subject_id: str, body: SubjectPatch, service: ServiceDep) -> SubjectOut:
    """Rename a subject and/or replace its metadata."""
    return SubjectOut.of(service.gallery.update_subject(subject_id, body.name, body.metadata))


@router.delete("/subjects/{subject_id}", status_code=204, response_class=Response, responses=error_responses(401, 404))
def delete_subject(subject_id: str, service: ServiceDep) -> Response:
    """Delete a subject and all its faces (from the database and the search index)."""
    service.gallery.delete_subject(subject_id)
    return Response(status_code=204)
