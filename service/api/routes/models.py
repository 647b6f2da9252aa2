"""GET /models: the served detector and embedder as their manifests describe them, so a client
(the console's Model page) can show what decides and on what terms without reading the server's files."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ServiceDep, StrictQuery
from service.api.schemas import ModelsResponse, error_responses

router = APIRouter(tags=["operations"])


@router.get("/models", response_model=ModelsResponse, responses=error_responses(401, 422), dependencies=[StrictQuery])
def models(service: ServiceDep) -> ModelsResponse:
    """The loaded models' manifests: name, version, sha256, license and provenance, the embedder's thresholds
    per FAR and calibrated curve, and the defaults a request without far or fpir is decided at."""
    loaded = service.models
    return ModelsResponse(
        detector=loaded.detector.manifest.model_dump(mode="json") if loaded.detector else None,
        embedder=loaded.embedder.manifest.model_dump(mode="json") if loaded.embedder else None,
        default_far=service.settings.default_far,
        default_fpir=service.settings.default_fpir,
    )
