"""POST /verify, /identify and /embed."""

from __future__ import annotations

import asyncio
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from service.api.body import read_image_request, request_body
from service.api.deps import Service, get_service
from service.api.errors import documented
from service.api.schemas import (
    CandidateOut,
    EmbeddedFaceOut,
    EmbedOptions,
    EmbedResponse,
    FaceOut,
    IdentifyOptions,
    IdentifyResponse,
    IdentifyResult,
    ModelOut,
    VerifyOptions,
    VerifyResponse,
)
from service.api_errors import InvalidParameters, NoEnrolledFaces

router = APIRouter(tags=["recognition"])
ServiceDep = Annotated[Service, Depends(get_service)]
IMAGE = "An image (JPEG, PNG, WebP, BMP, GIF, TIFF): a file part, or base64 in a JSON body."


@router.post(
    "/verify",
    response_model=VerifyResponse,
    summary="Are two faces the same person?",
    description="`image1` + `image2`, or `image1` + `subject_id` (similarity = max over the subject's enrolled faces).",
    responses=documented(400, 401, 404, 413, 415, 422, 503),
    openapi_extra=request_body(
        VerifyOptions,
        {"image1": IMAGE, "image2": IMAGE + " Omit when subject_id is given."},
        ["image1"],
        example={"image1": "<base64>", "image2": "<base64>", "far": "1e-3"},
    ),
)
async def verify(request: Request, service: ServiceDep) -> VerifyResponse:
    options, images, _ = await read_image_request(request, VerifyOptions, ("image1", "image2"))
    inference = service.inference
    inference.require()
    if "image1" not in images:
        raise InvalidParameters("image1 is required")
    if ("image2" in images) == (options.subject_id is not None):
        raise InvalidParameters("give exactly one of image2 and subject_id")
    decision = inference.decision(options.far, options.threshold)
    policy = options.face_policy
    if options.subject_id is not None:
        enrolled = await run_in_threadpool(service.gallery.subject_embeddings, options.subject_id)
        if len(enrolled) == 0:
            raise NoEnrolledFaces(f"subject {options.subject_id!r} has no face enrolled with the active embedder")
        (probe,) = await inference.faces(images["image1"], options.aligned, policy)
        similarity = float(np.max(enrolled @ probe.embedding))
        faces = [FaceOut.of(probe.face)]
    else:
        (a,), (b,) = await asyncio.gather(
            inference.faces(images["image1"], options.aligned, policy), inference.faces(images["image2"], options.aligned, policy)
        )
        similarity = float(a.embedding @ b.embedding)
        faces = [FaceOut.of(a.face), FaceOut.of(b.face)]
    return VerifyResponse(
        match=similarity >= decision.threshold,
        similarity=round(similarity, 6),
        threshold=decision.threshold,
        far=decision.far,
        faces=faces,
        subject_id=options.subject_id,
        model=ModelOut(**inference.model_info()),
    )


@router.post(
    "/identify",
    response_model=IdentifyResponse,
    summary="Who is this? (1:N search of the gallery)",
    description="Candidates ranked by subject; `match` is null when the best one is below the threshold: the person is unknown.",
    responses=documented(400, 401, 413, 415, 422, 503),
    openapi_extra=request_body(IdentifyOptions, {"image": IMAGE}, ["image"], example={"image": "<base64>", "top_k": 5}),
)
async def identify(request: Request, service: ServiceDep) -> IdentifyResponse:
    options, images, _ = await read_image_request(request, IdentifyOptions, ("image",))
    inference = service.inference
    inference.require()
    if "image" not in images:
        raise InvalidParameters("image is required")
    decision = inference.decision(options.far, options.threshold)
    policy = "all" if options.faces == "all" else options.face_policy
    found = await inference.faces(images["image"], options.aligned, policy)
    results = []
    for face in found:
        ranked = [CandidateOut.of(c) for c in await run_in_threadpool(service.gallery.search, face.embedding, options.top_k)]
        match = ranked[0] if ranked and ranked[0].similarity >= decision.threshold else None
        results.append(IdentifyResult(face=FaceOut.of(face.face), candidates=ranked, match=match))
    return IdentifyResponse(
        **results[0].model_dump(),
        threshold=decision.threshold,
        far=decision.far,
        model=ModelOut(**inference.model_info()),
        results=results if options.faces == "all" else None,
    )


@router.post(
    "/embed",
    response_model=EmbedResponse,
    summary="Embeddings of every face (for clients with their own store)",
    responses=documented(400, 401, 413, 415, 422, 503),
    openapi_extra=request_body(EmbedOptions, {"image": IMAGE}, ["image"], example={"image": "<base64>"}),
)
async def embed(request: Request, service: ServiceDep) -> EmbedResponse:
    options, images, _ = await read_image_request(request, EmbedOptions, ("image",))
    inference = service.inference
    inference.require()
    if "image" not in images:
        raise InvalidParameters("image is required")
    found = await inference.faces(images["image"], options.aligned, "all")
    return EmbedResponse(
        faces=[EmbeddedFaceOut(face=FaceOut.of(f.face), embedding=f.embedding.tolist()) for f in found],
        dim=int(found[0].embedding.shape[0]),
        model=ModelOut(**inference.model_info()),
    )
