"""A subject's enrolled faces: enroll (one image or bulk), list, delete. Every write is committed
before its 2xx."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import Service, ServiceDep, StrictQuery, SubjectIdPath
from service.api.requests import read_image_request, request_body
from service.api.schemas import (
    INT64_MAX,
    DuplicateOut,
    EnrollBulkResponse,
    EnrolledFaceOut,
    EnrollItem,
    EnrollOptions,
    ErrorBody,
    FaceOut,
    FacePage,
    StoredFaceOut,
    error_responses,
)
from service.core.decision import decide_search
from service.core.errors import EnrollmentFailed, FaceChipNotStored, FacegateError, InvalidParameters, LowQualityFace
from service.core.open_set import GalleryShape
from service.core.quality import measure, problems
from service.gallery import templates
from service.gallery.interface import FaceRecord, NewFace

router = APIRouter(tags=["gallery"])
log = logging.getLogger("facegate.api.faces")


@router.get("/subjects/{subject_id}/faces", response_model=FacePage, responses=error_responses(401, 404, 422), dependencies=[StrictQuery])
def list_faces(subject_id: SubjectIdPath, service: ServiceDep) -> FacePage:
    key = service.models.embedder_key
    records = service.gallery.list_faces(subject_id)
    return FacePage(faces=[StoredFaceOut.of(r, key.sha256 if key else None) for r in records])


FaceIdPath = Annotated[int, Path(ge=1, le=INT64_MAX)]


@router.delete("/faces/{face_id}", status_code=204, response_class=Response, responses=error_responses(401, 404, 422))
def delete_face(face_id: FaceIdPath, service: ServiceDep) -> Response:
    service.gallery.delete_face(face_id)
    return Response(status_code=204)


@router.get(
    "/faces/{face_id}/chip",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}, "description": "The chip, a PNG."}, **error_responses(401, 404, 422)},
    dependencies=[StrictQuery],
)
def face_chip(face_id: FaceIdPath, service: ServiceDep) -> Response:
    """The image of an enrolled face that FACEGATE_STORE_CROPS=true keeps (a 320×320 PNG with margin
    around the face; an aligned upload as sent): a thumbnail for the console. Biometric data, so
    never cached; 404 face_chip_not_stored for a face enrolled while the setting was off."""
    png = service.gallery.face_chip(face_id)
    if png is None:
        raise FaceChipNotStored(f"face {face_id} was enrolled while FACEGATE_STORE_CROPS was off: no image of it is kept")
    return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})


@dataclass(frozen=True)
class PreparedFace(NewFace):
    """A face ready to store, with what the quality gate found wrong when the request enrolled it anyway."""

    quality_warning: str | None = None


async def prepare_face(service: Service, data: bytes, options: EnrollOptions) -> PreparedFace:
    """Detect, gate on quality, embed: a face ready to store (nothing is written here). Every route
    that enrolls (CompreFace's and DeepStack's too) goes through it, so one quality gate holds for all."""
    settings = service.settings
    (found,) = await service.ready().engine.faces(data, options.aligned, options.face_policy, chips=settings.store_crops)
    face = FaceOut.of(found.face) if found.face is not None else None
    warning = None
    if found.face is not None and settings.enroll_quality_gate:  # an aligned crop has no detection to gate on
        failed = problems(await run_in_threadpool(measure, found.face, found.crop), settings)  # OpenCV off the event loop
        if failed and not options.allow_low_quality:
            raise LowQualityFace("; ".join(p.message for p in failed), [p.detail() for p in failed])
        warning = "; ".join(p.message for p in failed) or None
    return PreparedFace(
        embedding=found.embedding,
        box=face.box if face else None,
        landmarks=face.landmarks if face else None,
        score=face.score if face else None,
        chip=found.chip,
        quality_warning=warning,
    )


def possible_duplicate(service: Service, subject_id: str, embedding: np.ndarray) -> DuplicateOut | None:
    """The other subject /identify would answer for this face at the default fpir if its own
    subject were not enrolled: the face is a stranger's probe against the other N − 1 subjects
    (its leave-one-out score, as the guard scores every enrolled face). One search (not counted in
    facegate_gallery_search_seconds, which times identification), after the face is committed: a
    gallery that cannot be searched just then (or a model with no FPIR curve) gives null rather than
    failing an enrollment that succeeded."""
    try:
        gallery = service.gallery.shape()
        others = GalleryShape(max(gallery.subjects - 1, 1), max(gallery.faces - 1, 1), gallery.tail)
        decision = decide_search(service.ready().manifest, None, None, None, others, service.settings.default_fpir, service.models.cohort)
        searched = templates.search(service.gallery, embedding, decision.candidates_needed + 1, decision)
        found = [c for c in searched if c.subject_id != subject_id]
    except FacegateError as exc:
        log.warning("enrollment into %s: no duplicate check (%s)", subject_id, exc.message)
        return None
    if not found:
        return None
    score = float(decision.scores(embedding, found[: decision.candidates_needed])[0])
    if score < decision.threshold:
        return None
    best = found[0]
    return DuplicateOut(
        subject_id=best.subject_id,
        name=best.name,
        similarity=round(best.similarity, 6),
        template=best.template,
        score=round(score, 6),
        threshold=decision.threshold,
    )


def enrolled(service: Service, record: FaceRecord, face: PreparedFace, sha: str) -> EnrolledFaceOut:
    """The stored face, with the other subject it may be a duplicate of and the gate's warning."""
    duplicate = possible_duplicate(service, record.subject_id, face.embedding)
    return EnrolledFaceOut(
        **StoredFaceOut.of(record, sha).model_dump(), possible_duplicate_of=duplicate, quality_warning=face.quality_warning
    )


@router.post(
    "/subjects/{subject_id}/faces",
    status_code=201,
    response_model=EnrolledFaceOut | EnrollBulkResponse,
    summary="Enroll faces of a subject",
    description=(
        "`image` enrolls its largest face (or 422 multiple_faces with face_policy=reject_multiple). "
        "Several `images` enroll one face each and answer a per-image result; those that fail are skipped, "
        "and 422 enrollment_failed says why when none succeeds. A quality gate refuses a face too small, blurred, turned aside, "
        "tilted or dark, or with a low detection score (422 low_quality_face, `details` naming each check; the FACEGATE_ENROLL_* "
        "settings); `allow_low_quality` enrolls it anyway with `quality_warning`. Each enrolled face says which other "
        "subject, if any, /identify would answer for it at the default fpir (`possible_duplicate_of`)."
    ),
    responses=error_responses(400, 401, 404, 413, 415, 422, 503),
    openapi_extra=request_body(
        EnrollOptions,
        {"image": "One image: a file part, or base64 in a JSON body."},
        [],
        multi=("images", "Several images for bulk enrollment (repeat the file part, or a JSON list of base64 strings)."),
        example={"image": "<base64>"},
    ),
)
async def enroll(subject_id: SubjectIdPath, request: Request, service: ServiceDep):
    limit = service.settings.max_bulk_images
    body = await read_image_request(request, service.readiness, EnrollOptions, optional=("image",), multi="images", max_files=limit + 8)
    options, images, many, gallery = body.options, body.images, body.many, service.gallery
    if bool(images) == bool(many):
        raise InvalidParameters("give image, or images for bulk enrollment (not both)")
    if len(many) > limit:
        raise InvalidParameters(f"{len(many)} images; one request enrolls at most {limit} (FACEGATE_MAX_BULK_IMAGES)")
    await run_in_threadpool(gallery.get_subject, subject_id)  # 404 before any model work
    sha = service.ready().manifest.file.sha256
    if images:
        prepared = await prepare_face(service, images["image"], options)
        (record,) = await run_in_threadpool(gallery.add_faces, subject_id, [prepared])
        return await run_in_threadpool(enrolled, service, record, prepared, sha)
    outcomes = await asyncio.gather(*(prepare_face(service, data, options) for data in many), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, FacegateError):
            raise outcome
    ready = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, PreparedFace)]
    errors = {i: ErrorBody(code=o.code, message=o.message) for i, o in enumerate(outcomes) if isinstance(o, FacegateError)}
    if not ready:
        details = [{"index": i, "code": e.code, "message": e.message} for i, e in errors.items()]
        raise EnrollmentFailed(f"none of the {len(many)} images could be enrolled", details)
    records = await run_in_threadpool(gallery.add_faces, subject_id, [o for _, o in ready])
    stored = {i: await run_in_threadpool(enrolled, service, r, o, sha) for (i, o), r in zip(ready, records, strict=True)}
    return EnrollBulkResponse(
        enrolled=len(records),
        results=[EnrollItem(index=i, face=stored.get(i), error=errors.get(i)) for i in range(len(many))],
    )
