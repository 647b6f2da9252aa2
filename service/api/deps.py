"""What routes share: the process-wide service objects, built in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from service.auth import ApiKeys
from service.gallery import Gallery
from service.inference import Inference
from service.metrics import Metrics
from service.settings import Settings


@dataclass
class Service:
    settings: Settings
    metrics: Metrics
    keys: ApiKeys
    inference: Inference
    gallery: Gallery


def get_service(request: Request) -> Service:
    return request.app.state.service
