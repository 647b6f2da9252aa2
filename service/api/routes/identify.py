"""POST /identify: who is this? A 1:N search of the gallery."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from service.api.deps import ServiceDep
from service.api.requests import IMAGE, read_image_request, request_body
from service.api.schemas import (
    CandidateOut,
    FaceOut,
    IdentifyOptions,
    IdentifyResponse,
    IdentifyResult,
    ModelOut,
    OpenSetOut,
    error_responses,
)
from service.core.decision import decide_search
from service.core.errors import TooManyFaces

router = APIRouter(tags=["recognition"])


@router.post(
    "/identify",
    response_model=IdentifyResponse,
    summary="Who is this? (1:N search of the gallery)",
    description="Candidates ranked by subject; `match` is null when the best one is below the threshold: the person is unknown. "
    "By default the threshold holds strangers to a false-positive identification rate (`fpir`) at the gallery's size, "
    "on the margin score when the model has its open-set table (`score`, `open_set`).",
    responses=error_responses(400, 401, 413, 415, 422, 503),
    openapi_extra=request_body(IdentifyOptions, {"image": IMAGE}, ["image"], example={"image": "<base64>", "top_k": 5}),
)
async def identify(request: Request, service: ServiceDep) -> IdentifyResponse:
    body = await read_image_request(request, service.readiness, IdentifyOptions, required=("image",))
    options, ready = body.options, service.ready()
    manifest = ready.manifest
    gallery = await run_in_threadpool(service.gallery.shape)
    decision = decide_search(
        manifest, options.fpir, options.far, options.threshold, gallery, service.settings.default_fpir, service.models.cohort
    )
    policy = "all" if options.faces == "all" else options.face_policy
    found = await ready.engine.faces(body.images["image"], options.aligned, policy)
    if len(found) * options.top_k > service.settings.max_identify_candidates:
        raise TooManyFaces(
            f"{len(found)} faces × top_k {options.top_k} is above {service.settings.max_identify_candidates} candidates "
            "(FACEGATE_MAX_IDENTIFY_CANDIDATES); lower top_k"
        )
    results = []
    for face in found:
        candidates = await run_in_threadpool(
            service.search, face.embedding, max(options.top_k, decision.candidates_needed), decision.template
        )
        scores = decision.scores(face.embedding, candidates)
        ranked = [CandidateOut.of(c, float(score)) for c, score in zip(candidates[: options.top_k], scores, strict=False)]
        match = ranked[0] if candidates and scores[0] >= decision.threshold else None
        best = round(float(scores[0]), 6) if candidates else None
        results.append(IdentifyResult(face=FaceOut.of(face.face), candidates=ranked, match=match, best_score=best))
    return IdentifyResponse(
        **results[0].model_dump(),
        threshold=decision.threshold,
        score=decision.score,
        far=decision.far,
        fpir=decision.fpir,
        gallery_faces=decision.gallery_faces,
        extrapolated=decision.extrapolated,
        open_set=OpenSetOut.of(decision.margin),
        model=ModelOut.of(manifest),
        results=results if options.faces == "all" else None,
    )
