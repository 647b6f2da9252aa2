"""CompreFace's REST API v1 (/api/v1/…) on facegate's own engine, gallery, decisions and keys, so
its SDKs, Double Take and Viseron work with only the URL and key changed. A CompreFace subject is a
subject's name (`compat.subjects`: free text, one subject whatever its case, created with its first
face, deleted with all its faces by `DELETE …/faces?subject=`, as CompreFace does); an image_id is
a face id; adding a face goes through enrollment's quality gate (`prepare_face`), as every
enrollment does.
Similarities are calibrated (`compat.similarity`): 0.5 is facegate's default decision. Errors come
in CompreFace's shape, `{"message", "code"}`, a refused key's too (`refused`); no face is HTTP 400
with code 28, which clients test for. `execution_time` and `plugins_versions` come with `status=true`
only, as CompreFace sends them."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, RootModel, StrictFloat
from starlette.concurrency import run_in_threadpool

from service.api.compat import subjects
from service.api.compat.similarity import calibrated_similarity
from service.api.deps import Service, ServiceDep
from service.api.requests import read_image_request, read_json_model
from service.api.routes.faces import prepare_face
from service.api.schemas import EnrollOptions
from service.core.decision import search_fars
from service.core.errors import FacegateError, FaceNotFound, InvalidParameters, NoFace, SubjectExists, SubjectNotFound

PREFIX = "/api/v1"
# CompreFace's codes clients read: NO_FACES_FOUND, MISSING_REQUEST_HEADER, MODEL_NOT_FOUND (its
# answer to a key no service has); its other errors carry facegate's code names.
NO_FACE_CODE, MISSING_KEY_CODE, UNKNOWN_KEY_CODE = 28, 20, 10
# What Spring reads as a Boolean query parameter (`status`); anything else is a 400.
TRUE_WORDS, FALSE_WORDS = {"true", "on", "yes", "1"}, {"false", "off", "no", "0", ""}


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
router = APIRouter(prefix=PREFIX, tags=["compreface"], route_class=CompreFaceRoute, include_in_schema=False)


def refused(presented: bool) -> JSONResponse:
    """The key middleware's answer on this router (`ApiKeyAuth`): CompreFace's message and code for
    a missing or an unknown x-api-key, at facegate's 401. The key itself is never echoed."""
    if presented:
        return JSONResponse({"message": "Recognition service with this API Key not found", "code": UNKNOWN_KEY_CODE}, status_code=401)
    return JSONResponse({"message": "Missing header: x-api-key", "code": MISSING_KEY_CODE}, status_code=401)


class Options(BaseModel):
    """Form fields CompreFace's clients may send beside the image; facegate ignores none silently
    that change an answer (the query string holds CompreFace's options)."""

    model_config = ConfigDict(extra="ignore")


class SubjectBody(BaseModel):
    subject: str


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


def _subject(request: Request) -> str:
    return subjects.checked(request.query_params.get("subject"), "subject")


def _status(request: Request) -> bool:
    """CompreFace's `status`: whether `execution_time` and `plugins_versions` are answered."""
    raw = request.query_params.get("status", "false").strip().lower()
    if raw not in TRUE_WORDS | FALSE_WORDS:
        raise InvalidParameters("status must be true or false")
    return raw in TRUE_WORDS


async def _found(service: Service, data: bytes, request: Request, timings: dict[str, float] | None = None) -> list:
    """The image's faces, largest first, above `det_prob_threshold`, at most `limit` (0: all);
    `timings` gets the seconds spent on each model (`Engine.faces`)."""
    faces = await service.ready().engine.faces(data, False, "all", timings=timings)
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


PLUGIN_MODELS = {"detector": "detect", "calculator": "embed"}  # CompreFace's plugin → facegate's model (Engine.faces)


def _timed(entry: dict, timings: dict[str, float] | None) -> dict:
    """`entry` with CompreFace's `execution_time` (ms its image waited on each model), when `status` asked for it."""
    if timings is not None:
        entry["execution_time"] = {plugin: round(timings.get(model, 0.0) * 1000, 1) for plugin, model in PLUGIN_MODELS.items()}
    return entry


def _timings(request: Request) -> dict[str, float] | None:
    return {} if _status(request) else None


def _versions(service: Service, calculator: bool = True) -> dict:
    return {"detector": "facegate", **({"calculator": service.ready().manifest.name} if calculator else {})}


@router.post("/recognition/recognize", summary="CompreFace: recognize faces in an image")
async def recognize(request: Request, service: ServiceDep) -> dict:
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    count = _query_int(request, "prediction_count", 1, low=1)
    timings = _timings(request)
    manifest = service.ready().manifest
    searched = (service.gallery.index_info() or {}).get("size", 0) or 1
    found = []
    for face in await _found(service, body.images["file"], request, timings):
        candidates = await run_in_threadpool(service.search, face.embedding, count)
        found.append((face, candidates, search_fars(manifest, service.models.cohort, face.embedding, candidates)))
    names = await run_in_threadpool(subjects.labels, service.gallery, [c.subject_id for _, candidates, _ in found for c in candidates])
    result = []
    for face, candidates, fars in found:
        similar = [
            {"subject": names[c.subject_id], "similarity": calibrated_similarity(far, service.settings.default_fpir, searched)}
            for c, far in zip(candidates, fars, strict=True)
        ]
        result.append(_timed(_with_embedding({"box": _box(face.face), "subjects": similar}, face, request), timings))
    return {"result": result, **({"plugins_versions": _versions(service)} if timings is not None else {})}


@router.post("/detection/detect", summary="CompreFace: detect faces")
async def detect(request: Request, service: ServiceDep) -> dict:
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    timings = _timings(request)
    faces = await _found(service, body.images["file"], request, timings)
    return {
        "result": [_timed(_with_embedding({"box": _box(f.face)}, f, request), timings) for f in faces],
        **({"plugins_versions": _versions(service, _calculator(request))} if timings is not None else {}),
    }


@router.post("/verification/verify", summary="CompreFace: compare the faces of two images")
async def verify(request: Request, service: ServiceDep) -> dict:
    """CompreFace's shape: with `status=true`, `execution_time` on the source face and each match
    (its own image's), `plugins_versions` beside them."""
    body = await read_image_request(request, service.readiness, Options, required=("source_image", "target_image"))
    manifest = service.ready().manifest
    source_timings, target_timings = _timings(request), _timings(request)
    (source, *_) = await _found(service, body.images["source_image"], request, source_timings)
    targets = await _found(service, body.images["target_image"], request, target_timings)
    anchor = float(service.settings.default_far)
    matches: list[dict[str, Any]] = [
        _timed(
            {"box": _box(t.face), "similarity": calibrated_similarity(manifest.far_at(float(source.embedding @ t.embedding)), anchor)},
            target_timings,
        )
        for t in targets
    ]
    matches.sort(key=lambda m: m["similarity"], reverse=True)
    entry = {"source_image_face": _timed({"box": _box(source.face)}, source_timings), "face_matches": matches}
    return {"result": [{**entry, **({"plugins_versions": _versions(service)} if source_timings is not None else {})}]}


@router.post("/recognition/faces", summary="CompreFace: add a face to a subject (created when new)")
async def add_face(request: Request, service: ServiceDep) -> dict:
    """Answers the subject as the request named it, as CompreFace does (`Tony_Blair` adds to `tony_blair`)."""
    name = _subject(request)
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    floor = _query_float(request, "det_prob_threshold")
    new = await prepare_face(service, body.images["file"], EnrollOptions())  # enrollment's quality gate
    if floor is not None and new.score is not None and new.score < floor:  # an aligned crop has no score; _found keeps those too
        raise NoFace("no face above det_prob_threshold")

    (record,), _ = await run_in_threadpool(subjects.add_faces, service.gallery, name, [new])
    return {"image_id": str(record.id), "subject": name}


@router.get("/recognition/faces", summary="CompreFace: list faces (paged, optionally of one subject)")
def list_faces(request: Request, service: ServiceDep) -> dict:
    """A subject no one has is an empty page, as CompreFace answers."""
    page, size = _query_int(request, "page", 0), _query_int(request, "size", 20, low=1)
    if request.query_params.get("subject", "") != "":
        found = subjects.find(service.gallery, _subject(request))
        listed = [found] if found is not None else []
    else:
        listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    faces = []
    for subject in listed:
        with contextlib.suppress(SubjectNotFound):  # deleted meanwhile
            faces += [{"image_id": str(r.id), "subject": subjects.label(subject)} for r in service.gallery.list_faces(subject.id)]
    total = len(faces)
    return {
        "faces": faces[page * size : (page + 1) * size],
        "page_number": page,
        "page_size": size,
        "total_pages": -(-total // size),
        "total_elements": total,
    }


@router.delete("/recognition/faces", summary="CompreFace: delete every face of a subject, and the subject")
def delete_subject_faces(request: Request, service: ServiceDep) -> dict:
    """The subject goes with its faces, and one no one has deletes nothing: as CompreFace does."""
    found = subjects.find(service.gallery, _subject(request))
    if found is None:
        return {"deleted": 0}
    try:
        return {"deleted": service.gallery.delete_subject(found.id)}
    except SubjectNotFound:  # deleted meanwhile
        return {"deleted": 0}


def _delete_ids(service: Service, ids: list[int]) -> list[dict]:
    """Those of `ids` the gallery holds, whichever model made them, deleted: each with its subject."""
    deleted = []
    for face_id in ids:
        with contextlib.suppress(FaceNotFound):
            deleted.append((face_id, service.gallery.delete_face(face_id)))
    names = subjects.labels(service.gallery, [owner for _, owner in deleted])
    return [{"image_id": str(face_id), "subject": names[owner]} for face_id, owner in deleted]


def _face_id(raw: str) -> int:
    if not re.fullmatch(r"\d{1,18}", raw) or int(raw) < 1:
        raise InvalidParameters(f"no face with image_id {raw[:40]!r}")
    return int(raw)


@router.delete("/recognition/faces/{image_id}", summary="CompreFace: delete one face (its subject stays)")
def delete_face(image_id: str, service: ServiceDep) -> dict:
    face_id = _face_id(image_id)
    owner = service.gallery.delete_face(face_id)
    return {"image_id": str(face_id), "subject": subjects.labels(service.gallery, [owner])[owner]}


@router.post("/recognition/faces/{image_id}/verify", summary="CompreFace: compare an image's faces with one stored face")
async def verify_face(image_id: str, request: Request, service: ServiceDep) -> dict:
    """Each face of `file` against the stored face `image_id`, its similarity calibrated as a pair's
    (`verification/verify`: anchored at FACEGATE_DEFAULT_FAR), most similar first."""
    face_id = _face_id(image_id)
    manifest = service.ready().manifest  # the stored face is looked up for the embedder loaded
    known = await run_in_threadpool(service.gallery.lookup_faces, [face_id])
    if face_id not in known:
        raise FaceNotFound(f"no face with image_id {image_id!r}")
    owner, _, stored = known[face_id]
    subject = (await run_in_threadpool(subjects.labels, service.gallery, [owner]))[owner]
    body = await read_image_request(request, service.readiness, Options, required=("file",))
    timings = _timings(request)
    anchor = float(service.settings.default_far)
    result = [
        _timed(
            _with_embedding(
                {
                    "box": _box(f.face),
                    "subject": subject,
                    "similarity": calibrated_similarity(manifest.far_at(float(stored @ f.embedding)), anchor),
                },
                f,
                request,
            ),
            timings,
        )
        for f in await _found(service, body.images["file"], request, timings)
    ]
    result.sort(key=lambda r: r["similarity"], reverse=True)
    return {"result": result, **({"plugins_versions": _versions(service)} if timings is not None else {})}


@router.post("/recognition/faces/delete", summary="CompreFace: delete several faces")
async def delete_faces(request: Request, service: ServiceDep) -> list[dict]:
    ids = (await read_json_model(request, RootModel[list[str]])).root
    return await run_in_threadpool(_delete_ids, service, [_face_id(i) for i in ids])


@router.post("/recognition/subjects", summary="CompreFace: create a subject")
async def add_subject(request: Request, service: ServiceDep) -> dict:
    """A name taken, whatever its case, is CompreFace's "Subject already exists" (409 here)."""
    name = subjects.checked((await read_json_model(request, SubjectBody)).subject, "subject")
    _, made = await run_in_threadpool(subjects.ensure, service.gallery, name)
    if not made:
        raise SubjectExists("Subject already exists")
    return {"subject": name}


@router.get("/recognition/subjects", summary="CompreFace: list subjects")
def list_subjects(service: ServiceDep) -> dict:
    listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    return {"subjects": [subjects.label(s) for s in listed]}


@router.delete("/recognition/subjects/{subject:path}", summary="CompreFace: delete a subject and its faces")
def delete_subject(subject: str, service: ServiceDep) -> dict:
    """Answers the subject's name as stored, as CompreFace does; a name with a `/` is sent as %2F."""
    found = subjects.find(service.gallery, subjects.checked(subject, "subject"))
    if found is None:
        raise SubjectNotFound(f"Subject {subject[:140]} not found")
    service.gallery.delete_subject(found.id)
    return {"subject": subjects.label(found)}


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
    manifest = service.ready().manifest
    searched = (service.gallery.index_info() or {}).get("size", 0) or 1
    found = []
    for row in rows:
        candidates = await run_in_threadpool(service.search, row, count)
        found.append((candidates, search_fars(manifest, service.models.cohort, row, candidates)))
    names = await run_in_threadpool(subjects.labels, service.gallery, [c.subject_id for candidates, _ in found for c in candidates])
    result = []
    for (candidates, fars), received in zip(found, body.embeddings, strict=True):
        similarities = [
            {"subject": names[c.subject_id], "similarity": calibrated_similarity(far, service.settings.default_fpir, searched)}
            for c, far in zip(candidates, fars, strict=True)
        ]
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
