"""Shared fixtures. Real data and the detector come from environment variables; tests that need
them skip with the reason when they are unset (CI sets both in .ci/run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.onnx_models import write_test_embedder

REPO = Path(__file__).resolve().parent.parent


def _env_dir(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).resolve() if value else None


@pytest.fixture(scope="session")
def test_data() -> Path:
    path = _env_dir("FACEGATE_TEST_DATA")
    if path is None or not (path / "lfw" / "pairs.txt").is_file():
        pytest.skip("FACEGATE_TEST_DATA is unset or has no lfw/pairs.txt (set it to ../shared/data)")
    return path


@pytest.fixture(scope="session")
def model_cache() -> Path:
    path = _env_dir("FACEGATE_MODEL_CACHE")
    if path is None or not (path / "face_detection_yunet_2023mar.onnx").is_file():
        pytest.skip("FACEGATE_MODEL_CACHE is unset or lacks the YuNet detector (set it to ../shared/models)")
    return path


@pytest.fixture(scope="session")
def embedder_manifest(tmp_path_factory) -> Path:
    """A small deterministic ONNX embedder (pooling + fixed projection) with its manifest."""
    return write_test_embedder(tmp_path_factory.mktemp("embedder"))


@pytest.fixture
def settings(model_cache, embedder_manifest):
    from service.settings import Settings

    return Settings(models_dir=REPO / "models", model_cache=model_cache, embedder=str(embedder_manifest), device="cpu")


@pytest.fixture
def pipeline(settings):
    from service.pipeline import FacePipeline

    return FacePipeline.from_settings(settings)
