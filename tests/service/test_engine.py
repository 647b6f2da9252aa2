"""The engine: models run only at their warmed-up batch shapes, and batched detection finds exactly
the faces the per-image path finds."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import cv2
import numpy as np
import pytest

from service.core.errors import ModelUnavailable
from service.core.pipeline import FacePipeline
from service.engine import Engine
from service.metrics import Metrics


class SpySession:
    """An onnxruntime session that records the shape of every input it is handed."""

    def __init__(self, session):
        self._session = session
        self.shapes: list[tuple[int, ...]] = []
        self._lock = threading.Lock()

    def run(self, output_names, feed, *args, **kwargs):
        with self._lock:
            self.shapes.extend(tuple(v.shape) for v in feed.values())
        return self._session.run(output_names, feed, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)


def _warm(engine: Engine) -> None:
    result = []
    engine.warm_up(result.append)
    assert result == [None]


def _spied(settings) -> FacePipeline:
    """A pipeline whose sessions record every input shape they are run at."""
    pipeline = FacePipeline.from_settings(settings)
    pipeline.embedder.session = SpySession(pipeline.embedder.session)
    pipeline.detector.session = SpySession(pipeline.detector.session)
    return pipeline


@pytest.mark.parametrize("batching", [True, False])
def test_after_warm_up_no_new_input_shape_reaches_a_session(settings, lfw_faces, two_faces_jpeg, batching):
    settings = settings.model_copy(update={"batch_sizes": [1, 2, 4, 8], "batching": batching, "batch_wait_ms": 5.0})
    spied = _spied(settings)
    engine = Engine(settings, spied, Metrics())
    try:
        _warm(engine)
        embedder, detector = spied.embedder.session, spied.detector.session
        warmed = {"embedder": set(embedder.shapes), "detector": set(detector.shapes)}
        assert {s[0] for s in warmed["embedder"]} == {1, 2, 4, 8}
        assert {s[2] for s in warmed["detector"]} == set(spied.detector.sizes) == {320, 480, 640}  # each batch at each image size
        embedder.shapes.clear()
        detector.shapes.clear()

        async def load():
            images = [photo for photos in lfw_faces.values() for photo in photos] + [two_faces_jpeg] * 3
            crops = [np.full((n, *spied.embedder.size, 3), n, np.uint8) for n in (3, 5, 7, 9, 13, 1, 2)]
            await asyncio.gather(
                *(engine.faces(image, policy="all") for image in images),
                *(engine.embed_crops(c) for c in crops),
            )

        asyncio.run(load())
        assert embedder.shapes and detector.shapes
        assert set(embedder.shapes) <= warmed["embedder"], set(embedder.shapes) - warmed["embedder"]
        assert set(detector.shapes) <= warmed["detector"], set(detector.shapes) - warmed["detector"]
    finally:
        engine.close()


def test_batched_detection_finds_what_the_per_image_path_finds(pipeline, settings, lfw_faces, two_faces_jpeg):
    """Images of concurrent requests share detector runs; boxes, landmarks (mapped back through each
    image's letterbox) and scores equal detecting each image alone."""
    engine = Engine(settings.model_copy(update={"batch_wait_ms": 20.0}), pipeline, Metrics())
    images = [photo for photos in lfw_faces.values() for photo in photos] + [two_faces_jpeg]
    try:
        _warm(engine)

        async def all_faces():
            return await asyncio.gather(*(engine.faces(image, policy="all") for image in images))

        batched = asyncio.run(all_faces())
        runs = engine.metrics.registry.get_sample_value("facegate_detect_batch_size_count")
        assert runs < len(images), "the images were never batched"
        for image, found in zip(images, batched, strict=True):
            alone = pipeline.detect(pipeline.decode(image))
            assert len(found) == len(alone) > 0
            for got, want in zip(found, alone, strict=True):
                np.testing.assert_allclose(got.face.box, want.box, atol=1e-4)
                np.testing.assert_allclose(got.face.landmarks, want.landmarks, atol=1e-4)
                assert got.face.score == pytest.approx(want.score, abs=1e-5)
                np.testing.assert_array_equal(got.crop, pipeline.align(pipeline.decode(image), [want])[0])
    finally:
        engine.close()


def test_the_engine_and_the_sync_driver_run_one_orchestration(pipeline, settings, lfw_faces, two_faces_jpeg):
    """The engine drives the pipeline's steps through its micro-batchers; the CLI and training drive
    the same steps in place: the same faces, crops and embeddings, and the same error for a photo
    without a face."""
    from service.core.errors import NoFace

    engine = Engine(settings, pipeline, Metrics())
    images = [lfw_faces["Tony_Blair"][0], two_faces_jpeg]
    try:
        _warm(engine)
        for image in images:
            served = asyncio.run(engine.faces(image, policy="all"))
            direct = pipeline.embed_image(pipeline.decode(image))
            assert len(served) == len(direct) == (2 if image is two_faces_jpeg else 1)
            for a, b in zip(served, direct, strict=True):
                np.testing.assert_array_equal(a.crop, b.crop)
                np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-5)
                np.testing.assert_allclose(a.face.landmarks, b.face.landmarks, atol=1e-4)
        blank = cv2.imencode(".png", np.full((200, 200, 3), 127, np.uint8))[1].tobytes()
        with pytest.raises(NoFace):
            asyncio.run(engine.faces(blank))
        with pytest.raises(NoFace):
            pipeline.embed_image(pipeline.decode(blank))
    finally:
        engine.close()


def test_readiness_waits_for_the_warm_up(pipeline, settings):
    from service.core.errors import ModelUnavailable
    from service.core.models.model_set import load_models
    from service.readiness import Readiness

    readiness = Readiness(load_models(settings))
    assert readiness.loaded and not readiness.ready and readiness.report()["warmup"] == "running"
    with pytest.raises(ModelUnavailable, match="warming up"):
        readiness.require()
    engine = Engine(settings, pipeline, Metrics())
    try:
        engine.warm_up(readiness.warmup_done)
    finally:
        engine.close()
    assert readiness.ready and readiness.report()["warmup"] == "done"
    readiness.require()
    readiness.warmup_done("CUDA out of memory")
    assert not readiness.ready and readiness.report()["problems"][-1]["error"] == "CUDA out of memory"


def test_close_waits_for_the_warm_up(pipeline, settings):
    """A model still running in the warm-up thread when the interpreter exits aborts the process
    ("terminate called without an active exception"): close() stops the warm-up and waits for it."""
    from service.engine import Engine
    from service.metrics import Metrics

    engine = Engine(settings, pipeline, Metrics())
    results = []
    engine.start_warm_up(results.append)
    engine.close()
    assert not engine.models._warm_up_thread.is_alive()


def test_an_uncalibrated_embedder_is_a_readiness_problem(settings, embedder_manifest, tmp_path):
    """A freshly exported model has no thresholds: it loads and serves explicit thresholds, but
    /readyz must say that default decisions will fail and how to fix it."""
    import json
    import shutil

    from service.core.models.model_set import load_models
    from service.readiness import Readiness

    bare = tmp_path / embedder_manifest.name
    shutil.copy(embedder_manifest.with_suffix(".onnx"), tmp_path)
    bare.write_text(json.dumps({**json.loads(embedder_manifest.read_text()), "thresholds": {}}))
    calibrated = Readiness(load_models(settings)).report()["problems"]
    uncalibrated = Readiness(load_models(settings.model_copy(update={"embedder": str(bare)}))).report()["problems"]
    assert calibrated == []
    (problem,) = uncalibrated
    assert problem["model"] == "embedder" and "unknown_far" in problem["error"] and "facegate calibrate" in problem["fix"]


def test_warm_up_before_listening_makes_start_up_wait(api_settings):
    """With FACEGATE_WARM_UP_BEFORE_LISTENING the app's start-up (before uvicorn binds the port)
    returns only once every shape is warm: the first request a replica accepts is served."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
        from fastapi.testclient import TestClient
    from service.api.app import create_app

    settings = api_settings.model_copy(update={"warm_up_before_listening": True})
    with TestClient(create_app(settings)) as client:  # no waiting here, unlike make_client
        assert client.app.state.service.readiness.ready
        assert client.get("/readyz").status_code == 200


class NeverAnswering:
    """Model runs that never finish: a model host hung, a provider deadlocked."""

    def __init__(self):
        self.runs: list[Future] = []

    def detect(self, canvas: np.ndarray) -> Future:
        self.runs.append(Future())
        return self.runs[-1]

    embed = detect


def test_a_model_run_is_waited_for_model_run_timeout_at_most_then_503_and_dropped(settings, pipeline):
    settings = settings.model_copy(update={"model_run_timeout": 0.2})
    engine = Engine(settings, pipeline, Metrics())
    local, never = engine.models, NeverAnswering()
    engine.models = never  # type: ignore[assignment]
    crop = np.zeros((1, *pipeline.require_embedder().size, 3), np.uint8)
    try:
        with pytest.raises(ModelUnavailable, match="FACEGATE_MODEL_RUN_TIMEOUT") as error:
            asyncio.run(engine.embed_crops(crop))
        assert error.value.retry_after == 1
        assert [run.cancelled() for run in never.runs] == [True]  # a batcher drops it rather than run it for nobody
    finally:
        engine.models = local
        engine.close()
