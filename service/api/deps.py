"""What routes share: the process-wide service objects, built in the app's lifespan, as one
`ServiceDep` dependency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from fastapi import Depends, Request

from service.api.auth import ApiKeys
from service.engine import Engine
from service.gallery.interface import Candidate, GalleryStore
from service.metrics import Metrics
from service.models.model_set import ModelSet
from service.readiness import Readiness
from service.settings import Settings


@dataclass
class Service:
    settings: Settings
    metrics: Metrics
    keys: ApiKeys
    models: ModelSet
    readiness: Readiness
    engine: Engine | None  # None unless both models loaded: routes reach it only past readiness.require()
    gallery: GalleryStore

    def search(self, embedding: np.ndarray, top_k: int) -> list[Candidate]:
        """The gallery's top_k subjects for one face, timed into facegate_gallery_search_seconds."""
        with self.metrics.gallery_search.time():
            return self.gallery.search(embedding, top_k)


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]
