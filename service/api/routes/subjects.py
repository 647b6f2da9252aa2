"""/subjects: the people in the gallery. Every write is committed before its 2xx, and only after
its metadata passed the limits (`service.api.metadata`); a page is bounded in bytes. Bodies are read,
checked, written and answered on worker threads: nothing of their size runs on the event loop."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from service.api import metadata
from service.api.deps import ServiceDep, StrictQuery, SubjectIdPath
from service.api.requests import read_json_model
from service.api.schemas import INT64_MAX, SubjectIn, SubjectMerge, SubjectOut, SubjectPage, SubjectPatch, error_responses
from service.core.errors import InvalidParameters

router = APIRouter(tags=["gallery"])
PAGE_ENVELOPE = 200  # bytes of a page around its subjects: {"subjects": [...], "total": …, …}


def _json_body(model: type[BaseModel]) -> dict:
    """`openapi_extra` for a JSON body read by read_json_model (FastAPI does not parse it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


@router.post(
    "/subjects",
    status_code=201,
    response_model=SubjectOut,
    responses=error_responses(400, 401, 409, 413, 415, 422),
    openapi_extra=_json_body(SubjectIn),
)
async def create_subject(request: Request, service: ServiceDep) -> SubjectOut:
    """Create a subject (a person); faces are enrolled with POST /subjects/{id}/faces."""
    body = await read_json_model(request, SubjectIn, lambda b: metadata.check(b.metadata, service.settings))

    def create() -> SubjectOut:
        return SubjectOut.of(service.gallery.create_subject(body.name, body.metadata, body.id), service.settings)

    return await run_in_threadpool(create)


@router.get("/subjects", response_model=SubjectPage, responses=error_responses(401, 422), dependencies=[StrictQuery])
def list_subjects(
    service: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    search: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=256,
            pattern=r"^[^\x00]+$",  # PostgreSQL's text holds no NUL: refused here, as a name with one is
            description="Only subjects whose name or id contains this, in any case (`total` counts them).",
        ),
    ] = None,
) -> SubjectPage:
    """Subjects in creation order, a page at a time: up to `limit`, fewer when FACEGATE_MAX_PAGE_BYTES
    would be exceeded (always at least one); continue from `next_offset`. `search` looks through the
    whole gallery in the store (the console's search), not a page of it."""
    subjects, total = service.gallery.list_subjects(limit, offset, search)
    page: list[SubjectOut] = []
    used = PAGE_ENVELOPE
    for subject in subjects:
        out = SubjectOut.of(subject, service.settings)
        size = len(out.model_dump_json().encode()) + 1  # and a comma
        if page and used + size > service.settings.max_page_bytes:
            break
        page.append(out)
        used += size
    end = offset + len(page)
    return SubjectPage(subjects=page, total=total, limit=limit, offset=offset, next_offset=end if end < total else None)


@router.get("/subjects/{subject_id}", response_model=SubjectOut, responses=error_responses(401, 404, 422), dependencies=[StrictQuery])
def get_subject(subject_id: SubjectIdPath, service: ServiceDep) -> SubjectOut:
    return SubjectOut.of(service.gallery.get_subject(subject_id), service.settings)


@router.patch(
    "/subjects/{subject_id}",
    response_model=SubjectOut,
    responses=error_responses(400, 401, 404, 409, 413, 415, 422),
    openapi_extra=_json_body(SubjectPatch),
)
async def update_subject(subject_id: SubjectIdPath, request: Request, service: ServiceDep) -> SubjectOut:
    """Rename a subject and/or replace its metadata. A subject made through the CompreFace or
    DeepStack API is found there by its name (docs/compat.md): renamed, it is found by the new one,
    which no other such subject may hold (409 subject_exists)."""
    body = await read_json_model(request, SubjectPatch, lambda b: metadata.check(b.metadata, service.settings))

    def update() -> SubjectOut:
        return SubjectOut.of(service.gallery.update_subject(subject_id, body.name, body.metadata), service.settings)

    return await run_in_threadpool(update)


@router.post(
    "/subjects/{subject_id}/merge",
    response_model=SubjectOut,
    responses=error_responses(400, 401, 404, 413, 415, 422),
    openapi_extra=_json_body(SubjectMerge),
)
async def merge_subject(subject_id: SubjectIdPath, request: Request, service: ServiceDep) -> SubjectOut:
    """Merge another subject into this one (one person enrolled twice, as GET /gallery/duplicates
    finds): its faces move here and it is deleted, in one transaction. This subject keeps its id,
    name and metadata."""
    body = await read_json_model(request, SubjectMerge)
    if body.subject_id == subject_id:
        raise InvalidParameters("a subject cannot be merged into itself")

    def merge() -> SubjectOut:
        service.gallery.merge_subjects(body.subject_id, subject_id)
        return SubjectOut.of(service.gallery.get_subject(subject_id), service.settings)

    return await run_in_threadpool(merge)


@router.delete("/subjects/{subject_id}", status_code=204, response_class=Response, responses=error_responses(401, 404))
def delete_subject(subject_id: SubjectIdPath, service: ServiceDep) -> Response:
    """Delete a subject and all its faces (from the database and the search index)."""
    service.gallery.delete_subject(subject_id)
    return Response(status_code=204)
