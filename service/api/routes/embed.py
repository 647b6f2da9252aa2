"""POST /embed: the embedding of every face, for clients that keep their own store."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.api.deps import ServiceDep
from service.api.requests import IMAGE, read_image_request, request_body
from service.api.schemas import EmbeddedFaceOut, EmbedOptions, EmbedResponse, FaceOut, ModelOut, error_responses

router = APIRouter(tags=["recognition"])


@router.post(
    "/embed",
    response_model=EmbedResponse,
    summary="Embeddings of every face (for clients with their own store)",
    responses=error_responses(400, 401, 413, 415, 422, 503),
    openapi_extra=request_body(EmbedOptions, {"image": IMAGE}, ["image"], example={"image": "<base64>"}),
)
async def embed(request: Request, service: ServiceDep) -> EmbedResponse:
    body = await read_image_request(request, service.readiness, EmbedOptions, required=("image",))
    ready = service.ready()
    found = await ready.engine.faces(body.images["image"], body.options.aligned, "all")
    return EmbedResponse(
        faces=[EmbeddedFaceOut(face=FaceOut.of(f.face), embedding=f.embedding.tolist()) for f in found],
        dim=int(found[0].embedding.shape[0]),
        model=ModelOut.of(ready.manifest),
    )
