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
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictFloat
from starlette.concurrency import run_in_threadpool

from service.api.compat import subjects
from service.api.compat.similarity import calibrated_similarity, search_similarity
from service.api.deps import Service, ServiceDep
from service.api.requests import read_image_request, read_json_model
from service.api.routes.faces import prepare_face
from service.api.schemas import EnrollOptions
from service.core.decision import Decision, decide_search
from service.core.errors import (
    FaceChipNotStored,
    FacegateError,
    FaceNotFound,
    InvalidParameters,
    MissingImage,
    NoFace,
    SubjectExists,
    SubjectNotFound,
)

PREFIX = "/api/v1"
# CompreFace's codes clients read: NO_FACES_FOUND, MISSING_REQUEST_HEADER, MODEL_NOT_FOUND (its
# answer to a key no service has), and 34, its 400 for a request without its image part; its other
# errors carry facegate's code names.
NO_FACE_CODE, MISSING_KEY_CODE, UNKNOWN_KEY_CODE, MISSING_IMAGE_CODE = 28, 20, 10, 34
# What Spring reads as a Boolean query parameter (`status`); anything else is a 400.
TRUE_WORDS, FALSE_WORDS = {"true", "on", "yes", "1"}, {"false", "off", "no", "0", ""}
MAX_DELETE_IDS = 1000  # image ids one `faces/delete` takes: deleted in one statement


class CompreFaceRoute(APIRoute):
    """Answers facegate's typed errors in CompreFace's shape on this router only."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request):
            try:
                return await handler(request)
            except FacegateError as exc:
                return compreface_error(exc)

        return route


def compreface_error(exc: FacegateError) -> JSONResponse:
    """A typed error in CompreFace's shape: no face and a missing image with CompreFace's numeric
    codes, the rest with facegate's code names and statuses. The app's handlers answer every error
    under /api/v1/ through it too, an unknown route's or method's included."""
    if isinstance(exc, NoFace):
        return JSONResponse({"message": f"No face is found in the given image ({exc.message})", "code": NO_FACE_CODE}, status_code=400)
    if isinstance(exc, MissingImage):
        return JSONResponse({"message": exc.message, "code": MISSING_IMAGE_CODE}, status_code=exc.status)
    return JSONResponse({"message": exc.message, "code": exc.code}, status_code=exc.status)


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


class DeleteIds(RootModel[list[str]]):
    root: list[str] = Field(max_length=MAX_DELETE_IDS)


class SubjectBody(BaseModel):
    subject: str


async def _images(request: Request, service: Service, *names: str):
    """The request's images, as CompreFace reads them: a request without one of `names` (no body,
    or a body without that part) is its 400 with code 34, not a 415 or 422."""
    if not request.headers.get("content-type"):
        raise MissingImage(f"Required request part '{names[0]}' is not present")
    body = await read_image_request(request, service.readiness, Options, optional=names)
    for name in names:
        if name not in body.images:
            raise MissingImage(f"Required request part '{name}' is not present")
    return body


def _detect_faces(request: Request) -> bool:
    """CompreFace's `detect_faces` (default true): false takes the image as the face itself, which
    facegate embeds as an aligned crop of the embedder's template size (150×150 for dlib_150)."""
    raw = request.query_params.get("detect_faces", "true").strip().lower()
    if raw not in TRUE_WORDS | FALSE_WORDS:
        raise InvalidParameters("detect_faces must be true or false")
    return raw in TRUE_WORDS


class EmbeddingsBody(BaseModel):
    embeddings: list[list[StrictFloat]]  # JSON numbers only: not "0.1", not true


class EmbeddingsVerifyBody(BaseModel):
    source: list[StrictFloat]
    targets: list[list[StrictFloat]]


def _box(found: Any) -> dict:
    """A found face's box; an aligned crop (`detect_faces=false`) is a face as a whole, at probability 1."""
    if found.face is None:
        height, width = found.crop.shape[:2]
        return {"probability": 1.0, "x_min": 0, "y_min": 0, "x_max": width, "y_max": height}
    x1, y1, x2, y2 = found.face.box
    score = float(found.face.score)
    return {"probability": round(score, 5), "x_min": round(x1), "y_min": round(y1), "x_max": round(x2), "y_max": round(y2)}


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
    faces = await service.ready().engine.faces(data, not _detect_faces(request), "all", timings=timings)
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


def _timed(entry: dict, timings: dict[str, float] | None, calculator: bool = True) -> dict:
    """`entry` with CompreFace's `execution_time` (ms its image waited on each model), when `status`
    asked for it: the plugins `plugins_versions` names, no other."""
    if timings is not None:
        plugins = PLUGIN_MODELS if calculator else {"detector": PLUGIN_MODELS["detector"]}
        entry["execution_time"] = {plugin: round(timings.get(model, 0.0) * 1000, 1) for plugin, model in plugins.items()}
    return entry


def _timings(request: Request) -> dict[str, float] | None:
    return {} if _status(request) else None


def _versions(service: Service, calculator: bool = True) -> dict:
    return {"detector": "facegate", **({"calculator": service.ready().manifest.name} if calculator else {})}


def _search_decision(service: Service) -> Decision:
    """facegate's default FPIR decision for the gallery as it is: what a search's similarities are
    calibrated by (blocking: the gallery's shape may be read from the database)."""
    gallery = service.gallery.shape()
    return decide_search(service.ready().manifest, None, None, None, gallery, service.settings.default_fpir, service.models.cohort)


def _similarities(service: Service, decision: Decision, probe: np.ndarray, candidates: list) -> list[float]:
    """Each candidate's calibrated similarity: the FPIR of the score the decision holds it to, 0.5 at the default."""
    anchor, manifest = service.settings.default_fpir, service.ready().manifest
    scores = decision.scores(probe, candidates)
    return [search_similarity(decision, manifest, float(s), c, anchor) for s, c in zip(scores, candidates, strict=True)]


@router.post("/recognition/recognize", summary="CompreFace: recognize faces in an image")
async def recognize(request: Request, service: ServiceDep) -> dict:
    body = await _images(request, service, "file")
    count = _query_int(request, "prediction_count", 1, low=1)
    timings = _timings(request)
    decision = await run_in_threadpool(_search_decision, service)
    found = []
    for face in await _found(service, body.images["file"], request, timings):
        candidates = await run_in_threadpool(service.search, face.embedding, max(count, decision.candidates_needed), decision)
        found.append((face, candidates, _similarities(service, decision, face.embedding, candidates)))
    names = await run_in_threadpool(subjects.labels, service.gallery, [c.subject_id for _, candidates, _ in found for c in candidates])
    result = []
    for face, candidates, similarities in found:
        similar = [{"subject": names[c.subject_id], "similarity": s} for c, s in zip(candidates, similarities, strict=True)][:count]
        result.append(_timed(_with_embedding({"box": _box(face), "subjects": similar}, face, request), timings))
    return {"result": result, **({"plugins_versions": _versions(service)} if timings is not None else {})}


@router.post("/detection/detect", summary="CompreFace: detect faces")
async def detect(request: Request, service: ServiceDep) -> dict:
    body = await _images(request, service, "file")
    timings = _timings(request)
    faces = await _found(service, body.images["file"], request, timings)
    calculator = _calculator(request)
    return {
        "result": [_timed(_with_embedding({"box": _box(f)}, f, request), timings, calculator) for f in faces],
        **({"plugins_versions": _versions(service, _calculator(request))} if timings is not None else {}),
    }


@router.post("/verification/verify", summary="CompreFace: compare the faces of two images")
async def verify(request: Request, service: ServiceDep) -> dict:
    """CompreFace's shape: with `status=true`, `execution_time` on the source face and each match
    (its own image's), `plugins_versions` beside them."""
    body = await _images(request, service, "source_image", "target_image")
    manifest = service.ready().manifest
    source_timings, target_timings = _timings(request), _timings(request)
    (source, *_) = await _found(service, body.images["source_image"], request, source_timings)
    targets = await _found(service, body.images["target_image"], request, target_timings)
    anchor = float(service.settings.default_far)
    matches: list[dict[str, Any]] = [
        _timed(
            {"box": _box(t), "similarity": calibrated_similarity(manifest.far_at(float(source.embedding @ t.embedding)), anchor)},
            target_timings,
        )
        for t in targets
    ]
    matches.sort(key=lambda m: m["similarity"], reverse=True)
    entry = {"source_image_face": _timed({"box": _box(source)}, source_timings), "face_matches": matches}
    return {"result": [{**entry, **({"plugins_versions": _versions(service)} if source_timings is not None else {})}]}


@router.post("/recognition/faces", summary="CompreFace: add a face to a subject (created when new)")
async def add_face(request: Request, service: ServiceDep) -> dict:
    """Answers the subject as the request named it, as CompreFace does (`Tony_Blair` adds to `tony_blair`).
    With `detect_faces=false` the image is the face, an aligned crop (`_detect_faces`)."""
    name = _subject(request)
    body = await _images(request, service, "file")
    floor = _query_float(request, "det_prob_threshold")
    options = EnrollOptions(aligned=not _detect_faces(request))
    new = await prepare_face(service, body.images["file"], options)  # enrollment's quality gate
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


@router.delete("/recognition/faces", summary="CompreFace: delete every face of a subject (and the subject), or of every subject")
def delete_subject_faces(request: Request, service: ServiceDep) -> dict:
    """The subject goes with its faces, and one no one has deletes nothing: as CompreFace does.
    Without `subject`, every face goes, as CompreFace documents, with the subjects that held them."""
    if request.query_params.get("subject") is None:
        return {"deleted": _delete_every_subject(service)[1]}
    found = subjects.find(service.gallery, _subject(request))
    if found is None:
        return {"deleted": 0}
    try:
        return {"deleted": service.gallery.delete_subject(found.id)}
    except SubjectNotFound:  # deleted meanwhile
        return {"deleted": 0}


def _delete_every_subject(service: Service) -> tuple[int, int]:
    """Every subject deleted with its faces: (subjects, faces)."""
    listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    faces = 0
    for subject in listed:
        with contextlib.suppress(SubjectNotFound):  # deleted meanwhile
            faces += service.gallery.delete_subject(subject.id)
    return len(listed), faces


def _delete_ids(service: Service, raw: list[str]) -> list[dict]:
    """Those of `raw` image ids the gallery holds, whichever model made them, deleted in one
    statement: each with its subject's name, in the order asked (a UUID, CompreFace's own kind of
    id, is one the gallery does not hold)."""
    ids = [i for i in (_face_id(r) for r in raw) if i is not None]
    deleted = service.gallery.delete_faces(ids)
    names = subjects.labels(service.gallery, list(deleted.values()))
    return [{"image_id": str(i), "subject": names[deleted[i]]} for i in dict.fromkeys(ids) if i in deleted]


def _face_id(raw: str) -> int | None:
    """facegate's face id an image_id names; None for a UUID (CompreFace's kind of id: no face here
    has one); anything else is a 422."""
    if re.fullmatch(r"\d{1,18}", raw) and int(raw) >= 1:
        return int(raw)
    with contextlib.suppress(ValueError):
        uuid.UUID(raw)
        return None
    raise InvalidParameters(f"image_id {raw[:40]!r} is neither a face id nor a UUID")


def _held_face_id(raw: str) -> int:
    """The face id of a route's {image_id}: a UUID or an id no face has is a 404 face_not_found."""
    face_id = _face_id(raw)
    if face_id is None:
        raise FaceNotFound(f"no face with image_id {raw!r}")
    return face_id


@router.delete("/recognition/faces/{image_id}", summary="CompreFace: delete one face (its subject stays)")
def delete_face(image_id: str, service: ServiceDep) -> dict:
    face_id = _held_face_id(image_id)
    owner = service.gallery.delete_face(face_id)
    return {"image_id": str(face_id), "subject": subjects.labels(service.gallery, [owner])[owner]}


@router.post("/recognition/faces/{image_id}/verify", summary="CompreFace: compare an image's faces with one stored face")
async def verify_face(image_id: str, request: Request, service: ServiceDep) -> dict:
    """Each face of `file` against the stored face `image_id`, its similarity calibrated as a pair's
    (`verification/verify`: anchored at FACEGATE_DEFAULT_FAR), most similar first."""
    face_id = _held_face_id(image_id)
    manifest = service.ready().manifest  # the stored face is looked up for the embedder loaded
    known = await run_in_threadpool(service.gallery.lookup_faces, [face_id])
    if face_id not in known:
        raise FaceNotFound(f"no face with image_id {image_id!r}")
    owner, _, stored = known[face_id]
    subject = (await run_in_threadpool(subjects.labels, service.gallery, [owner]))[owner]
    body = await _images(request, service, "file")
    timings = _timings(request)
    anchor = float(service.settings.default_far)
    result = [
        _timed(
            _with_embedding(
                {
                    "box": _box(f),
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


@router.get("/recognition/faces/{image_id}/img", summary="CompreFace: download a stored face's image")
def face_image(image_id: str, service: ServiceDep) -> Response:
    """The image facegate keeps of the face (FACEGATE_STORE_CROPS=true: a 320×320 PNG around it,
    not the photo sent); a face enrolled without one is a 404 face_chip_not_stored that says so."""
    face_id = _held_face_id(image_id)
    png = service.gallery.face_chip(face_id)
    if png is None:
        raise FaceChipNotStored(f"face {face_id} was enrolled while FACEGATE_STORE_CROPS was off: no image of it is kept")
    return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})


@router.post("/recognition/faces/delete", summary="CompreFace: delete several faces")
async def delete_faces(request: Request, service: ServiceDep) -> list[dict]:
    """At most MAX_DELETE_IDS ids a request; ids the gallery does not hold are left out of the answer."""
    ids = (await read_json_model(request, DeleteIds)).root
    return await run_in_threadpool(_delete_ids, service, ids)


@router.post("/recognition/subjects", summary="CompreFace: create a subject")
async def add_subject(request: Request, service: ServiceDep) -> dict:
    """A name taken, whatever its case, is CompreFace's "Subject already exists" (409 here)."""
    name = subjects.checked((await read_json_model(request, SubjectBody)).subject, "subject")
    _, made = await run_in_threadpool(subjects.ensure, service.gallery, name)
    if not made:
        raise SubjectExists("Subject already exists")
    return {"subject": name}


@router.get("/recognition/subjects", summary="CompreFace: list subjects")
@router.get("/recognition/subjects/", summary="CompreFace: list subjects (as its Rest API description writes the URL)")
def list_subjects(service: ServiceDep) -> dict:
    listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    return {"subjects": [subjects.label(s) for s in listed]}


class RenameBody(BaseModel):
    subject: str


@router.put("/recognition/subjects/{subject:path}", summary="CompreFace: rename a subject (merged into one that has the name)")
async def rename_subject(subject: str, request: Request, service: ServiceDep) -> dict:
    """As CompreFace does: the subject takes the new name, or, where another subject holds it
    (whatever its case), its faces move to that one and it is deleted. A subject of facegate's own
    API (listed by its id) is renamed with PATCH /subjects/{id} instead: it holds no name here."""
    new = subjects.checked((await read_json_model(request, RenameBody)).subject, "subject")
    old = subjects.checked(subject, "subject")

    def rename() -> dict:
        found = subjects.find(service.gallery, old)
        if found is None:
            raise SubjectNotFound(f"Subject {old[:140]} not found")
        holder = subjects.find(service.gallery, new)
        if holder is not None and holder.id != found.id:
            service.gallery.merge_subjects(found.id, holder.id)
        elif not found.unique_name:
            raise InvalidParameters(f"subject {found.id!r} was made through facegate's API: rename it with PATCH /subjects/{found.id}")
        else:
            service.gallery.update_subject(found.id, new, None)
        return {"updated": True}

    return await run_in_threadpool(rename)


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
    return {"deleted": _delete_every_subject(service)[0]}


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
async def recognize_embeddings(request: Request, service: ServiceDep) -> JSONResponse:
    """Each embedding's top `prediction_count` subjects, with `recognition/recognize`'s calibrated
    similarity. The embeddings must come from the active embedder (facegate's /embed, or CompreFace's
    `face_plugins=calculator` on facegate)."""
    body = await read_json_model(request, EmbeddingsBody)
    count = _query_int(request, "prediction_count", 1, low=1)
    service.ready()
    return await run_in_threadpool(_recognized, service, body.embeddings, count)


def _recognized(service: Service, received: list[list[float]], count: int) -> JSONResponse:
    """Blocking, like every step of an embeddings route: a thousand embeddings are normalized,
    searched and echoed, and their answer rendered here (it takes seconds to serialize)."""
    rows = _unit(service, received, "embeddings")
    if len(rows) * count > service.settings.max_identify_candidates:
        raise InvalidParameters(
            f"{len(rows)} embeddings × prediction_count {count} exceeds "
            f"FACEGATE_MAX_IDENTIFY_CANDIDATES ({service.settings.max_identify_candidates})"
        )
    decision = _search_decision(service)
    found = []
    for row in rows:
        candidates = service.search(row, max(count, decision.candidates_needed), decision)
        found.append((candidates, _similarities(service, decision, row, candidates)))
    names = subjects.labels(service.gallery, [c.subject_id for candidates, _ in found for c in candidates])
    result = []
    for (candidates, similarities), embedding in zip(found, received, strict=True):
        similar = [{"subject": names[c.subject_id], "similarity": s} for c, s in zip(candidates, similarities, strict=True)][:count]
        result.append({"embedding": embedding, "similarities": similar})
    return JSONResponse({"result": result})


@router.post("/verification/embeddings/verify", summary="CompreFace: compare an embedding with others")
async def verify_embeddings(request: Request, service: ServiceDep) -> JSONResponse:
    """`source` against each of `targets` (echoed as received), with `verification/verify`'s calibrated similarity, most similar first."""
    body = await read_json_model(request, EmbeddingsVerifyBody)
    service.ready()
    return await run_in_threadpool(_verified, service, body.source, body.targets)


def _verified(service: Service, source_received: list[float], received: list[list[float]]) -> JSONResponse:
    (source,) = _unit(service, [source_received], "source")
    targets = _unit(service, received, "targets")
    manifest = service.ready().manifest
    anchor = float(service.settings.default_far)
    result: list[dict[str, Any]] = [
        {"embedding": embedding, "similarity": calibrated_similarity(manifest.far_at(float(source @ t)), anchor)}
        for t, embedding in zip(targets, received, strict=True)
    ]
    result.sort(key=lambda r: r["similarity"], reverse=True)
    return JSONResponse({"result": result})
