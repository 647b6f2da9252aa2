"""CompreFace's REST API v1 (/api/v1/…) on facegate's own engine, gallery, decisions and keys, so
its SDKs, Double Take and Viseron work with only the URL and key changed. A CompreFace subject is a
facegate subject id (created on first enrollment, as CompreFace does); an image_id is a face id;
adding a face goes through enrollment's quality gate (`prepare_face`), as every enrollment does.
Similarities are calibrated (`compat.similarity`): 0.5 is facegate's default decision. Errors come
in CompreFace's shape, `{"message", "code"}`; no face is HTTP 400 with code 28, which clients test for."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictFloat
from starlette.concurrency import run_in_threadpool

from service.api.compat.similarity import calibrated_similarity
from service.api.deps import Service, ServiceDep
from service.api.requests import read_image_request, read_json_model
from service.api.routes.faces import prepare_face
from service.api.schemas import SUBJECT_ID_PATTERN, EnrollOptions
from service.core.decision import Decision, decide_search
from service.core.errors import FacegateError, FaceNotFound, InvalidParameters, NoFace, SubjectNotFound

NO_FACE_CODE = 28  # CompreFace's "No face is found in the given image"


class CompreFaceRoute(APIRoute):
    """Answers facegate's typed errors in CompreFace's shape on this router only."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request):
            try:
                return await handler(request)
            except NoFace as exc:
                return JSONResponse(
                    {"message": f"No face is found in the given image ({exc.message})", "code": NO_FACE_CODE}, status_code=400
                )
            except FacegateError as exc:
                return JSONResponse({"message": exc.message, "code": exc.code}, status_code=exc.status)

        return route


# Out of facegate's OpenAPI schema: the contract is CompreFace's (docs/compat.md), with its error shape.
router = APIRouter(prefix="/api/v1", tags=["compreface"], route_class=CompreFaceRoute, include_in_schema=False)


class Options(BaseModel):
    """Form fields CompreFace's clients may send beside the image; facegate ignores none silently
    that change an answer (the query string holds CompreFace's options)."""

    model_config = ConfigDict(extra="ignore")


class SubjectBody(BaseModel):
    subject: str = Field(pattern=SUBJECT_ID_PATTERN)


class EmbeddingsBody(BaseModel):
    embeddings: list[list[StrictFloat]]  # JSON numbers only: not "0.1", not true


class EmbeddingsVerifyBody(BaseModel):
    source: list[StrictFloat]
    targets: list[list[StrictFloat]]


def _box(face: Any) -> dict:
    x1, y1, x2, y2 = face.box
    return {"probability": round(float(face.score), 5), "x_min": round(x1), "y_min": round(y1), "x_max": round(x2), "y_max": round(y2)}


def _query_int(request: Request, name: str, default: int, low: int = 0) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"\d{1,6}", raw) or int(raw) < low:
        raise InvalidParameters(f"{name} must be an integer ≥ {low}")
    return int(raw)


def _query_float(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    try:
        value = None if raw in (None, "") else float(raw)
    except ValueError:
        value = -1.0
    if value is not None and not 0.0 <= value <= 1.0:
        raise InvalidParameters(f"{name} must be a number in [0, 1]")
    return value


def _subject(request: Request) -> str | None:
    subject = request.query_params.get("subject")
    if subject is not None and not re.fullmatch(SUBJECT_ID_PATTERN, subject):
        raise InvalidParameters(f"subject must match {SUBJECT_ID_PATTERN}")
    return subject


async def _found(service: Service, data: bytes, request: Request, chips: bool = False) -> list:
    """The image's faces, largest first, above `det_prob_threshold`, at most `limit` (0: all)."""
    faces = await service.ready().engine.faces(data, False, "all", chips=chips)
    floor = _query_float(request, "det_prob_threshold")
    if floor is not None:
        faces = [f for f in faces if f.face is None or f.face.score >= floor]
    if not faces:
        raise NoFace("no face above det_prob_threshold")
    limit = _query_int(request, "limit", 0)
    return faces[:limit] if limit else faces


def _calculator(request: Request) -> bool:
    """Whether `face_plugins` asks for CompreFace's `calculator`: each face's embedding, from the
    served embedder, which the embedding routes take back. Other plugins (age, gender, mask…) are
    not offered and are ignored, as an unset one Double Take sends as `undefined`."""
    return "calculator" in {p.strip() for p in request.query_params.get("face_plugins", "").split(",")}


def _with_embedding(entry: dict, face: Any, request: Request) -> dict:
    if _calculator(request):
        entry["embedding"] = face.embedding.tolist()
    return entry


def _ms(start: float) -> dict:
    return {"detector": round((time.perf_counter() - start) * 1000), "calculator": 0}


async def _search_decision(service: Service) -> Decision:
    """facegate's default FPIR decision for the gallery as it is: what a search's similarities are calibrated by."""
    gallery = await run_in_threadpool(service.gallery.shape)
    return decide_search(service.ready().manifest, None, None, None, gallery, service.settings.default_fpir, service.models.cohort)


def _similarities(service: Service, decision: Decision, probe: np.ndarray, candidates: list) -> list[float]:
    """Each candidate's calibrated similarity: the FPIR of the score the decision holds it to, 0.5 at the default."""
    anchor = service.settings.default_fpir
    return [calibrated_similarity(decision.rate(float(score)), anchor) for score in decision.scores(probe, candidates)]


@router.post("/recognition/recognize", summary="CompreFace: recognize faces in an image")
async def recognize(request: Request, service: ServiceDep) -> dict:
    start = time.perf_counter()
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    count = _query_int(request, "prediction_count", 1, low=1)
    manifest = service.ready().manifest
    decision = await _search_decision(service)
    result = []
    for face in await _found(service, body.images["file"], request):
        candidates = await run_in_threadpool(service.search, face.embedding, max(count, decision.candidates_needed))
        subjects = [
            {"subject": c.subject_id, "similarity": similarity}
            for c, similarity in zip(candidates, _similarities(service, decision, face.embedding, candidates), strict=True)
        ][:count]
        result.append(_with_embedding({"box": _box(face.face), "subjects": subjects, "execution_time": _ms(start)}, face, request))
    return {"result": result, "plugins_versions": {"detector": "facegate", "calculator": manifest.name}}


@router.post("/detection/detect", summary="CompreFace: detect faces")
async def detect(request: Request, service: ServiceDep) -> dict:
    start = time.perf_counter()
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    faces = await _found(service, body.images["file"], request)
    versions = {"detector": "facegate", **({"calculator": service.ready().manifest.name} if _calculator(request) else {})}
    return {
        "result": [_with_embedding({"box": _box(f.face), "execution_time": _ms(start)}, f, request) for f in faces],
        "plugins_versions": versions,
    }


@router.post("/verification/verify", summary="CompreFace: compare the faces of two images")
async def verify(request: Request, service: ServiceDep) -> dict:
    start = time.perf_counter()
    body = await read_image_request(request, service.readiness, Options, required=("source_image", "target_image"))
    manifest = service.ready().manifest
    (source, *_) = await _found(service, body.images["source_image"], request)
    targets = await _found(service, body.images["target_image"], request)
    anchor = float(service.settings.default_far)
    matches: list[dict[str, Any]] = [
        {"box": _box(t.face), "similarity": calibrated_similarity(manifest.far_at(float(source.embedding @ t.embedding)), anchor)}
        for t in targets
    ]
    matches.sort(key=lambda m: m["similarity"], reverse=True)
    return {"result": [{"source_image_face": {"box": _box(source.face)}, "face_matches": matches, "execution_time": _ms(start)}]}


@router.post("/recognition/faces", summary="CompreFace: add a face to a subject (created when new)")
async def add_face(request: Request, service: ServiceDep) -> dict:
    subject = _subject(request)
    if subject is None:
        raise InvalidParameters("subject is required")
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    floor = _query_float(request, "det_prob_threshold")
    new = await prepare_face(service, body.images["file"], EnrollOptions())  # enrollment's quality gate
    if floor is not None and new.score is not None and new.score < floor:  # an aligned crop has no score; _found keeps those too
        raise NoFace("no face above det_prob_threshold")

    def store() -> int:
        try:
            service.gallery.get_subject(subject)
        except SubjectNotFound:
            service.gallery.create_subject(subject, {}, subject_id=subject)
        (record,) = service.gallery.add_faces(subject, [new])
        return record.id

    return {"image_id": str(await run_in_threadpool(store)), "subject": subject}


@router.get("/recognition/faces", summary="CompreFace: list faces (paged, optionally of one subject)")
def list_faces(request: Request, service: ServiceDep) -> dict:
    subject = _subject(request)
    page, size = _query_int(request, "page", 0), _query_int(request, "size", 20, low=1)
    if subject is not None:
        subjects = [subject]
    else:
        listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
        subjects = [s.id for s in listed]
    faces = [{"image_id": str(r.id), "subject": r.subject_id} for s in subjects for r in service.gallery.list_faces(s)]
    total = len(faces)
    return {
        "faces": faces[page * size : (page + 1) * size],
        "page_number": page,
        "page_size": size,
        "total_pages": -(-total // size),
        "total_elements": total,
    }


@router.delete("/recognition/faces", summary="CompreFace: delete every face of a subject")
def delete_subject_faces(request: Request, service: ServiceDep) -> dict:
    subject = _subject(request)
    if subject is None:
        raise InvalidParameters("subject is required")
    records = service.gallery.list_faces(subject)
    for record in records:
        service.gallery.delete_face(record.id)
    return {"deleted": len(records)}


def _delete_ids(service: Service, ids: list[int]) -> list[dict]:
    """Those of `ids` the gallery holds, whichever model made them, deleted: each with its subject."""
    deleted = []
    for face_id in ids:
        with contextlib.suppress(FaceNotFound):
            deleted.append({"image_id": str(face_id), "subject": service.gallery.delete_face(face_id)})
    return deleted


def _face_id(raw: str) -> int:
    if not re.fullmatch(r"\d{1,18}", raw) or int(raw) < 1:
        raise InvalidParameters(f"no face with image_id {raw[:40]!r}")
    return int(raw)


@router.delete("/recognition/faces/{image_id}", summary="CompreFace: delete one face")
def delete_face(image_id: str, service: ServiceDep) -> dict:
    face_id = _face_id(image_id)
    return {"image_id": str(face_id), "subject": service.gallery.delete_face(face_id)}


@router.post("/recognition/faces/{image_id}/verify", summary="CompreFace: compare an image's faces with one stored face")
async def verify_face(image_id: str, request: Request, service: ServiceDep) -> dict:
    """Each face of `file` against the stored face `image_id`, its similarity calibrated as a pair's
    (`verification/verify`: anchored at FACEGATE_DEFAULT_FAR), most similar first."""
    start = time.perf_counter()
    face_id = _face_id(image_id)
    manifest = service.ready().manifest  # the stored face is looked up for the embedder loaded
    known = await run_in_threadpool(service.gallery.lookup_faces, [face_id])
    if face_id not in known:
        raise FaceNotFound(f"no face with image_id {image_id!r}")
    subject, _, stored = known[face_id]
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    anchor = float(service.settings.default_far)
    result = [
        _with_embedding(
            {
                "box": _box(f.face),
                "subject": subject,
                "similarity": calibrated_similarity(manifest.far_at(float(stored @ f.embedding)), anchor),
                "execution_time": _ms(start),
            },
            f,
            request,
        )
        for f in await _found(service, body.images["file"], request)
    ]
    result.sort(key=lambda r: r["similarity"], reverse=True)
    return {"result": result, "plugins_versions": {"detector": "facegate", "calculator": manifest.name}}


@router.post("/recognition/faces/delete", summary="CompreFace: delete several faces")
async def delete_faces(request: Request, service: ServiceDep) -> list[dict]:
    ids = (await read_json_model(request, RootModel[list[str]])).root
    return await run_in_threadpool(_delete_ids, service, [_face_id(i) for i in ids])


@router.post("/recognition/subjects", summary="CompreFace: create a subject")
async def add_subject(request: Request, service: ServiceDep) -> dict:
    subject = (await read_json_model(request, SubjectBody)).subject
    await run_in_threadpool(service.gallery.create_subject, subject, {}, subject)
    return {"subject": subject}


@router.get("/recognition/subjects", summary="CompreFace: list subjects")
def list_subjects(service: ServiceDep) -> dict:
    listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    return {"subjects": [s.id for s in listed]}


@router.delete("/recognition/subjects/{subject}", summary="CompreFace: delete a subject and its faces")
def delete_subject(subject: str, service: ServiceDep) -> dict:
    if not re.fullmatch(SUBJECT_ID_PATTERN, subject):
        raise SubjectNotFound(f"no subject {subject[:140]!r}")
    service.gallery.delete_subject(subject)
    return {"subject": subject}


@router.delete("/recognition/subjects", summary="CompreFace: delete every subject and its faces")
def delete_all_subjects(service: ServiceDep) -> dict:
    listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    for subject in listed:
        service.gallery.delete_subject(subject.id)
    return {"deleted": len(listed)}


def _unit(service: Service, vectors: list[list[float]], name: str) -> np.ndarray:
    """Received embeddings as unit float32 rows: each of the active embedder's dimension, finite, not
    zero; at most FACEGATE_MAX_IDENTIFY_CANDIDATES of them. Anything else is a 422, never a 5xx."""
    manifest = service.ready().manifest
    dim = manifest.embedding_dim
    most = service.settings.max_identify_candidates
    if not vectors:
        raise InvalidParameters(f"{name}: at least one embedding is required")
    if len(vectors) > most:
        raise InvalidParameters(f"{name}: {len(vectors)} embeddings; one request takes at most {most} (FACEGATE_MAX_IDENTIFY_CANDIDATES)")
    for i, vector in enumerate(vectors):
        if len(vector) != dim:
            raise InvalidParameters(f"{name}[{i}]: {len(vector)} numbers; the embedder {manifest.name!r} makes {dim}")
    rows = np.asarray(vectors, np.float64)
    if not np.isfinite(rows).all():
        raise InvalidParameters(f"{name}: every number must be finite")
    peaks = np.abs(rows).max(axis=1, keepdims=True)
    if not (peaks > 0).all():
        raise InvalidParameters(f"{name}: an embedding of zero length has no direction")
    rows = rows / peaks  # 1e300 and 1e-300 alike, without overflow or underflow in the norm
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


@router.post("/recognition/embeddings/recognize", summary="CompreFace: recognize embeddings")
async def recognize_embeddings(request: Request, service: ServiceDep) -> dict:
    """Each embedding's top `prediction_count` subjects, with `recognition/recognize`'s calibrated
    similarity. The embeddings must come from the active embedder (facegate's /embed, or CompreFace's
    `face_plugins=calculator` on facegate)."""
    body = await read_json_model(request, EmbeddingsBody)
    count = _query_int(request, "prediction_count", 1, low=1)
    rows = _unit(service, body.embeddings, "embeddings")
    if len(rows) * count > service.settings.max_identify_candidates:
        raise InvalidParameters(
            f"{len(rows)} embeddings × prediction_count {count} exceeds "
            f"FACEGATE_MAX_IDENTIFY_CANDIDATES ({service.settings.max_identify_candidates})"
        )
    decision = await _search_decision(service)
    result = []
    for row, received in zip(rows, body.embeddings, strict=True):
        candidates = await run_in_threadpool(service.search, row, max(count, decision.candidates_needed))
        similarities = [
            {"subject": c.subject_id, "similarity": similarity}
            for c, similarity in zip(candidates, _similarities(service, decision, row, candidates), strict=True)
        ][:count]
        result.append({"embedding": received, "similarities": similarities})
    return {"result": result}


@router.post("/verification/embeddings/verify", summary="CompreFace: compare an embedding with others")
async def verify_embeddings(request: Request, service: ServiceDep) -> dict:
    """`source` against each of `targets` (echoed as received), with `verification/verify`'s calibrated similarity, most similar first."""
    body = await read_json_model(request, EmbeddingsVerifyBody)
    (source,) = _unit(service, [body.source], "source")
    targets = _unit(service, body.targets, "targets")
    manifest = service.ready().manifest
    anchor = float(service.settings.default_far)
    result: list[dict[str, Any]] = [
        {"embedding": received, "similarity": calibrated_similarity(manifest.far_at(float(source @ t)), anchor)}
        for t, received in zip(targets, body.targets, strict=True)
    ]
    result.sort(key=lambda r: r["similarity"], reverse=True)
    return {"result": result}
