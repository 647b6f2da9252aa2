"""Whether the service can answer image requests, and if not why: GET /readyz reports it, and
every image route refuses with 503 model_unavailable until both models are loaded."""

from __future__ import annotations

from dataclasses import asdict

from service.errors import ModelUnavailable
from service.models.model_set import ModelSet


class Readiness:
    def __init__(self, models: ModelSet):
        self.models = models

    @property
    def ready(self) -> bool:
        return self.models.detector is not None and self.models.embedder is not None

    def require(self) -> None:
        if not self.ready:
            missing = ", ".join(f"{p.model} {p.name!r}" for p in self.models.problems)
            raise ModelUnavailable(f"the service has no usable {missing}; see GET /readyz for the fix")

    def report(self) -> dict:
        models = {}
        for role, loaded in (("detector", self.models.detector), ("embedder", self.models.embedder)):
            if loaded:
                models[role] = {
                    "name": loaded.manifest.name,
                    "version": loaded.manifest.version,
                    "sha256": loaded.manifest.file.sha256,
                    "providers": loaded.session.get_providers(),
                }
        return {"ready": self.ready, "models": models, "problems": [asdict(p) for p in self.models.problems]}
