"""DeepStack's / CodeProject.AI's face API (/v1/vision/face…) on facegate's own engine, gallery,
decisions and keys, so Double Take, Home Assistant's DeepStack face integration and their Python
clients work with only the URL (and key) changed. A userid is a subject's name (`compat.subjects`:
free text, one subject whatever its case, created on first registration); `confidence` is the
calibrated similarity of `compat.similarity`, and a face gets its userid only where facegate's own
FPIR decision (as /identify's) matches, else "unknown".
Requests are DeepStack's forms, answers `{"success": true, …}`; errors are `{"success": false,
"error"}` with DeepStack's 400 for bad input (facegate's 422s become 400), its 401 for a key."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException

from service.api.admission import ticket
from service.api.compat import subjects
from service.api.compat.similarity import search_similarity
from service.api.deps import Service, ServiceDep
from service.api.requests import MAX_FORM_FIELDS
from service.api.routes.faces import prepare_face
from service.api.schemas import EnrollOptions
from service.core.decision import decide_search
from service.core.errors import FacegateError, InvalidParameters, NoFace, SubjectNotFound, Unauthorized
from service.gallery.collection_names import COLLECTION
from service.gallery.interface import NewFace


def _error(request: Request, message: str, status: int, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"success": False, "error": message, "duration": _elapsed(request)}, status_code=status, headers=headers)


def _elapsed(request: Request) -> float:
    return round(time.perf_counter() - request.state.deepstack_started, 4)


def _presented_key(request: Request, form: FormData) -> str | None:
    """X-API-Key where a client sends it, else DeepStack's `api_key` form field; two of either is none."""
    presented = request.headers.getlist("x-api-key") or form.getlist("api_key")
    return presented[0] if len(presented) == 1 and isinstance(presented[0], str) else None


class DeepStackRoute(APIRoute):
    """On this router only: reads the form once, checks the key there (DeepStack clients send it in
    the body, so the header middleware lets these paths through: `PATHS`), and answers every error
    in DeepStack's shape."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request):
            request.state.deepstack_started = time.perf_counter()
            service: Service = request.app.state.service  # settings and keys only: the caller's collection is the handler's (ServiceDep)
            try:
                max_files = service.settings.max_bulk_images + 8  # more parts are refused before they are read
                async with request.form(max_files=max_files, max_fields=MAX_FORM_FIELDS) as form:
                    if service.keys.enabled:
                        collection = service.keys.collection(_presented_key(request, form))
                        if collection is None:
                            raise Unauthorized("Incorrect api key")
                        request.scope[COLLECTION] = collection  # the handler's ServiceDep is this key's collection
                    admitted = ticket(request)
                    if admitted is not None:  # out of the slots kept for requests whose key is not yet known
                        await admitted.authenticated()
                    request.state.deepstack_form = form
                    return await handler(request)
            except FacegateError as exc:
                retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
                return _error(request, exc.message, 400 if exc.status == 422 else exc.status, retry)
            except HTTPException as exc:  # the form parser's 400, the body limit's 408 and 413
                return _error(request, str(exc.detail), exc.status_code, exc.headers)

        return route


# Out of facegate's OpenAPI schema: the contract is DeepStack's (docs/compat.md), with its error shape.
router = APIRouter(prefix="/v1/vision/face", tags=["deepstack"], route_class=DeepStackRoute, include_in_schema=False)


def _ok(request: Request, **fields: Any) -> dict:
    return {"success": True, **fields, "duration": _elapsed(request)}


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) and value != "" else None


async def _image(form: FormData) -> bytes:
    image = form.get("image")
    if not isinstance(image, UploadFile):
        raise InvalidParameters("No valid image file found")
    return await image.read()


def _min_confidence(form: FormData) -> float | None:
    raw = _text(form, "min_confidence")
    try:
        value = None if raw is None else float(raw)
    except ValueError:
        value = math.nan
    if value is not None and not math.isfinite(value):
        raise InvalidParameters("Invalid value for min_confidence")
    if value is not None and value > 1.0:
        raise InvalidParameters("min_confidence cannot be greater than 1")
    return value


def _userid(form: FormData) -> str:
    userid = _text(form, "userid")
    if userid is None:
        raise InvalidParameters("userid not specified")
    return subjects.checked(userid, "userid")


def _box(face: Any) -> dict:
    x1, y1, x2, y2 = (max(0, round(v)) for v in face.box)
    return {"x_min": x1, "y_min": y1, "x_max": x2, "y_max": y2}


async def _faces(service: Service, data: bytes) -> list:
    """Every face, largest first; none is an empty list, as DeepStack answers (success, no predictions)."""
    try:
        return await service.ready().engine.faces(data, False, "all")
    except NoFace:
        return []


@router.post("", summary="DeepStack: detect faces")
async def detect(request: Request, service: ServiceDep) -> dict:
    form = request.state.deepstack_form
    data, floor = await _image(form), _min_confidence(form)
    service.readiness.require()
    faces = [f.face for f in await _faces(service, data)]
    predictions = [{"confidence": round(float(f.score), 5), **_box(f)} for f in faces if floor is None or f.score >= floor]
    return _ok(request, predictions=predictions)


@router.post("/recognize", summary="DeepStack: recognize faces")
async def recognize(request: Request, service: ServiceDep) -> dict:
    """min_confidence only ever tightens facegate's decision (DeepStack's default of 0.67 is on its
    own scale, so an absent value means facegate's default, 0.5 on the calibrated one)."""
    form = request.state.deepstack_form
    data, floor = await _image(form), _min_confidence(form)
    manifest, fpir = service.ready().manifest, service.settings.default_fpir
    gallery = await run_in_threadpool(service.gallery.shape)
    decision = decide_search(manifest, None, None, None, gallery, fpir, service.models.cohort)
    found = []
    for face in await _faces(service, data):
        best = await run_in_threadpool(service.search, face.embedding, decision.candidates_needed, decision)
        score = float(decision.scores(face.embedding, best)[0]) if best else -math.inf  # what the decision holds
        confidence = search_similarity(decision, manifest, score, best[0], fpir) if best else 0.0
        known = score >= decision.threshold and (floor is None or confidence >= floor)
        found.append((face, best[0].subject_id if known else None, confidence))
    names = await run_in_threadpool(subjects.labels, service.gallery, [owner for _, owner, _ in found if owner is not None])
    predictions = [
        {"confidence": confidence if owner else 0, "userid": names[owner] if owner else "unknown", **_box(face.face)}
        for face, owner, confidence in found
    ]
    return _ok(request, predictions=predictions)


@router.post("/register", summary="DeepStack: register a userid's face images")
async def register(request: Request, service: ServiceDep) -> dict:
    """Every file part is an image (DeepStack takes any field names); each adds a face to the
    subject through enrollment's quality gate. Unlike DeepStack, earlier registrations are kept,
    not replaced: Double Take registers one image per call."""
    form = request.state.deepstack_form
    userid = _userid(form)
    images = [await value.read() for _, value in form.multi_items() if isinstance(value, UploadFile)]
    if not images:
        raise InvalidParameters("No valid image file found")
    if len(images) > service.settings.max_bulk_images:
        raise InvalidParameters(
            f"{len(images)} images; one request registers at most {service.settings.max_bulk_images} (FACEGATE_MAX_BULK_IMAGES)"
        )
    service.readiness.require()
    outcomes = await asyncio.gather(*(prepare_face(service, data, EnrollOptions()) for data in images), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, FacegateError):
            raise outcome
    ready: list[NewFace] = [o for o in outcomes if isinstance(o, NewFace)]
    if not ready:  # every outcome is then a FacegateError: the first image's is the answer
        raise next(o for o in outcomes if isinstance(o, FacegateError))

    _, made = await run_in_threadpool(subjects.add_faces, service.gallery, userid, ready)
    return _ok(request, message="face added" if made else "face updated")


@router.post("/delete", summary="DeepStack: delete a userid and its faces")
def delete(request: Request, service: ServiceDep) -> dict:
    """Success whether or not the userid existed, as DeepStack answers; a userid no subject could
    hold (over the length limit, a control character) is refused as `register` refuses it (400),
    not reported deleted."""
    found = subjects.find(service.gallery, _userid(request.state.deepstack_form))
    if found is not None:
        with contextlib.suppress(SubjectNotFound):  # deleted meanwhile
            service.gallery.delete_subject(found.id)
    return _ok(request)


@router.post("/list", summary="DeepStack: list userids")
def list_userids(request: Request, service: ServiceDep) -> dict:
    listed, _ = service.gallery.list_subjects(limit=1_000_000, offset=0)
    return _ok(request, faces=[subjects.label(s) for s in listed])


PATHS = frozenset(
    route.path for route in router.routes if isinstance(route, APIRoute)
)  # the key is checked in DeepStackRoute, not by the header middleware
