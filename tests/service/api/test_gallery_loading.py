"""Listening at once (issue 45, N8; PostgreSQL's in issue 44): the port answers while the gallery's
index and open-set guard are built at start-up on its follower's thread, on either store. /healthz is 200, /readyz 503 naming the gallery
loading, and the routes that search the gallery 503 gallery_loading with Retry-After; a write is
accepted meanwhile and is searched once the index is built. The build is held here (the roster's
build, which every build runs), not timed."""

from __future__ import annotations

import base64
import importlib
import threading
import warnings

from tests.conftest import aligned_crop_png


def test_the_port_answers_while_the_gallery_loads(store_settings, monkeypatch):
    store = importlib.import_module(
        "service.gallery.postgres" if store_settings.database_url.get_secret_value() else "service.gallery.sqlite"
    )
    release, building = threading.Event(), threading.Event()
    build = store.follow

    def held(*args, **kwargs):
        building.set()
        release.wait(60)
        return build(*args, **kwargs)

    monkeypatch.setattr(store, "follow", held)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
        from fastapi.testclient import TestClient
    from service.api.app import create_app

    try:
        with TestClient(create_app(store_settings)) as api:  # the lifespan is done: the port would be open
            service = api.app.state.service
            assert service.readiness.warmed.wait(120) and building.wait(30)
            assert api.get("/healthz").status_code == 200
            ready = api.get("/readyz")
            assert ready.status_code == 503 and not ready.json()["ready"] and ready.json()["gallery"]["loading"]
            assert any(p["name"] == "loading" for p in ready.json()["problems"])
            crop = base64.b64encode(aligned_crop_png(7)).decode()
            refused = api.post("/identify", json={"image": crop, "aligned": True})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "gallery_loading"
            assert refused.headers["retry-after"] == "2"
            assert api.get("/gallery/duplicates").json()["error"]["code"] == "gallery_loading"
            assert api.post("/subjects", json={"id": "crop", "name": "Crop"}).status_code == 201  # writes go on
            enrolled = api.post("/subjects/crop/faces", files={"image": aligned_crop_png(7)}, data={"aligned": "true"})
            assert enrolled.status_code == 201, enrolled.text
            release.set()
            assert service.gallery.wait_loaded(60)
            assert api.get("/readyz").status_code == 200
            assert api.post("/identify", json={"image": crop, "aligned": True}).json()["match"]["subject_id"] == "crop"
    finally:
        release.set()
