"""POST /verify: are two faces (or a face and an enrolled subject) the same person?"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.api.deps import ServiceDep
from service.api.requests import IMAGE, read_image_request, request_body
from service.api.schemas import FaceOut, ModelOut, VerifyOptions, VerifyResponse, error_responses
from service.core.decision import decide, decide_subject, on_subject
from service.core.errors import FacegateError, InvalidParameters, NoEnrolledFaces

router = APIRouter(tags=["recognition"])


@router.post(
    "/verify",
    response_model=VerifyResponse,
    summary="Are two faces the same person?",
    description="`image1` + `image2`, or `image1` + `subject_id` (similarity = the cosine with the mean of the subject's k enrolled "
    "faces where the model's cosine rows are the mean's, `template`; else the max over them, each held to the per-comparison FAR "
    "that keeps the subject at `far`).",
    responses=error_responses(400, 401, 404, 413, 415, 422, 503),
    openapi_extra=request_body(
        VerifyOptions,
        {"image1": IMAGE, "image2": IMAGE + " Omit when subject_id is given."},
        ["image1"],
        example={"image1": "<base64>", "image2": "<base64>", "far": "1e-3"},
    ),
)
async def verify(request: Request, service: ServiceDep) -> VerifyResponse:
    body = await read_image_request(request, service.readiness, VerifyOptions, required=("image1",), optional=("image2",))
    options, images, ready = body.options, body.images, service.ready()
    engine, manifest = ready.engine, ready.manifest
    if ("image2" in images) == (options.subject_id is not None):
        raise InvalidParameters("give exactly one of image2 and subject_id")
    decision = decide(manifest, options.far, options.threshold, service.settings.default_far)
    policy, subject_faces, template = options.face_policy, None, None
    if options.subject_id is not None:
        enrolled = await run_in_threadpool(service.gallery.subject_embeddings, options.subject_id)
        if len(enrolled) == 0:
            raise NoEnrolledFaces(f"subject {options.subject_id!r} has no face enrolled with the active embedder")
        # the max over k faces: the subject's FAR is the one asked for, each face is held to 1/k of it
        subject_faces = len(enrolled)
        decision = decide_subject(manifest, options.far, options.threshold, service.settings.default_far, subject_faces)
        (probe,) = await engine.faces(images["image1"], options.aligned, policy)
        decision, template, similarity = on_subject(decision, enrolled, probe.embedding)
        faces = [FaceOut.of(probe.face)]
    else:
        # Both images run at once; when both fail, image1's error is the answer whichever failed first,
        # so one request always gets one error code.
        results = await asyncio.gather(
            *(engine.faces(images[name], options.aligned, policy) for name in ("image1", "image2")), return_exceptions=True
        )
        found = []
        for name, result in zip(("image1", "image2"), results, strict=True):
            if isinstance(result, FacegateError) and result.status < 500:
                result.message = f"{name}: {result.message}"  # which of the two photos it was (the console says so)
            if isinstance(result, BaseException):
                raise result
            found.append(result)
        (a,), (b,) = found
        similarity = float(a.embedding @ b.embedding)
        faces = [FaceOut.of(a.face), FaceOut.of(b.face)]
    return VerifyResponse(
        match=decision.matches(similarity),
        similarity=round(similarity, 6),
        threshold=decision.threshold,
        far=decision.far,
        faces=faces,
        subject_id=options.subject_id,
        subject_faces=subject_faces,
        template=template,
        model=ModelOut.of(manifest),
        warning=decision.warning,
    )
