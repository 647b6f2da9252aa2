"""/console without a browser: the static shell loads without a key and carries its
Content-Security-Policy, while everything that shows data (the API it calls, face chips, the model
route) still needs the key; no path under /console reaches the API around the key check; the files
hold no inline code, no HTML sink and no outside URL. The chip route and /models on both stores.
The browser end of it: test_console_browser.py."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import anyio
import cv2
import numpy as np
import pytest
from pydantic import SecretStr

from service.api.admission import AUTHENTICATED
from service.api.auth import ApiKeys
from service.api.console import CSP, STATIC
from service.api.middleware import ApiKeyAuth
from tests.conftest import aligned_crop_png

KEY = "console-test-key"
JS = sorted((STATIC / "js").glob("*.js"))


@pytest.fixture
def keyed(api_settings, make_client):
    return make_client(api_settings.model_copy(update={"api_keys": SecretStr(KEY)}))


def test_the_shell_loads_without_a_key_with_a_strict_policy(keyed):
    page = keyed.get("/console/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert "script-src 'self';" in CSP and "unsafe-inline" not in CSP and "unsafe-eval" not in CSP and "frame-ancestors 'none'" in CSP
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["referrer-policy"] == "no-referrer"
    assert '<script type="module" src="js/main.js">' in page.text
    for asset in ["console.css", "favicon.svg", *(f"js/{p.name}" for p in JS)]:
        answer = keyed.get(f"/console/{asset}")
        assert answer.status_code == 200 and answer.headers["content-security-policy"] == CSP, asset
    assert keyed.get("/console/js/main.js").headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript")
    redirect = keyed.get("/console", follow_redirects=False)
    assert redirect.status_code == 307 and redirect.headers["location"].endswith("/console/")
    missing = keyed.get("/console/nothing-here.js")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def raw_get(client, raw_path: str) -> tuple[int, dict]:
    """GET a path as uvicorn hands it to the app (percent-decoded, dot segments kept): httpx would
    resolve `..` before sending, and a client need not."""
    sent: list[dict] = []

    async def run() -> None:
        requested, answered = False, anyio.Event()

        async def receive() -> dict:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await answered.wait()  # a response listening for the client's disconnect gets it once it is sent
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered.set()

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": unquote(raw_path), "raw_path": raw_path.encode(), "root_path": "", "query_string": b"",
            "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
        }  # fmt: skip
        await client.app(scope, receive, send)

    client.portal.call(run)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body.startswith(b"{") else {"text": body.decode(errors="replace")}


AROUND = ["/console/../models", "/console/%2e%2e/subjects", "/console/..%2fsubjects", "/console//subjects", "/console/../../models"]


@pytest.mark.parametrize("path", ["/models", "/subjects", "/faces/1/chip", "/consolex/subjects", *AROUND])
def test_data_needs_the_key_whatever_the_path(keyed, path):
    status, body = raw_get(keyed, path)
    if path.startswith("/console/"):  # served by the static files, which refuse to leave their folder
        assert status == 404 and body["error"]["code"] == "not_found", (path, status, body)
    else:
        assert status == 401 and body["error"]["code"] == "unauthorized", (path, status, body)
    assert raw_get(keyed, "/console/js/main.js")[0] == 200


def test_the_files_hold_no_inline_code_html_sink_or_outside_url():
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline <script>"
    assert not re.search(r"<style|\sstyle=|\son[a-z]+=", html, re.I), "an inline style or event handler"
    for path in [STATIC / "index.html", STATIC / "console.css", *JS]:
        text = path.read_text()
        # The only absolute URL is SVG's namespace name (chart.js), which is never fetched.
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, (path.name, urls)
        assert "@import" not in text and "url(" not in text, path.name
    for path in JS:
        text = path.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "localStorage"):
            assert sink not in text, (path.name, sink)
        assert not re.search(r"setAttribute\(\s*[\"']style", text), path.name


def test_models_names_the_served_manifests(keyed, api_settings):
    assert keyed.get("/models").status_code == 401
    models = keyed.get("/models", headers={"X-API-Key": KEY}).json()
    assert models["detector"]["name"] == "face_detection_yunet_2023mar" and models["detector"]["license"]["name"] == "MIT"
    assert models["embedder"]["task"] == "embedder" and models["embedder"]["license"]["name"]
    assert models["default_far"] == api_settings.default_far and models["default_fpir"] == api_settings.default_fpir
    assert keyed.get("/models?x=1", headers={"X-API-Key": KEY}).json()["error"]["code"] == "invalid_parameters"


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_face_chip_is_served_with_the_key_only_where_it_was_kept(store, request, api_settings, make_client):
    update = {"api_keys": SecretStr(KEY), "store_crops": True}
    if store == "postgres":
        update["database_url"] = SecretStr(request.getfixturevalue("database_url"))
    settings = api_settings.model_copy(update=update)
    headers = {"X-API-Key": KEY}
    api = make_client(settings)
    assert api.post("/subjects", json={"id": "ada", "name": "Ada"}, headers=headers).status_code == 201
    kept = api.post("/subjects/ada/faces", files={"image": aligned_crop_png(3)}, data={"aligned": "true"}, headers=headers).json()
    chip = api.get(f"/faces/{kept['face_id']}/chip", headers=headers)
    assert chip.status_code == 200 and chip.headers["content-type"] == "image/png" and chip.headers["cache-control"] == "no-store"
    sent = cv2.imdecode(np.frombuffer(aligned_crop_png(3), np.uint8), cv2.IMREAD_COLOR)
    assert np.array_equal(cv2.imdecode(np.frombuffer(chip.content, np.uint8), cv2.IMREAD_COLOR), sent)
    assert api.get(f"/faces/{kept['face_id']}/chip").status_code == 401

    api.__exit__(None, None, None)  # the same gallery, served now without keeping chips
    api = make_client(settings.model_copy(update={"store_crops": False}))
    bare = api.post("/subjects/ada/faces", files={"image": aligned_crop_png(4)}, data={"aligned": "true"}, headers=headers).json()
    missing = api.get(f"/faces/{bare['face_id']}/chip", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "face_chip_not_stored"
    assert "FACEGATE_STORE_CROPS" in missing.json()["error"]["message"]
    assert api.get(f"/faces/{kept['face_id']}/chip", headers=headers).status_code == 200  # kept before: still served
    unknown = api.get("/faces/999999/chip", headers=headers)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "face_not_found"
    assert api.get("/faces/0/chip", headers=headers).json()["error"]["code"] == "invalid_parameters"


def test_every_console_file_ships_in_the_package():
    """pyproject.toml names the console's files as package data by pattern: a file no pattern matches
    would be missing from a plain install (the Docker image) while every test of a checkout passes."""
    from setuptools.config.pyprojecttoml import read_configuration

    from tests.conftest import REPO

    patterns = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]["package-data"]["service.api.console"]
    shipped = {path for pattern in patterns for path in STATIC.parent.glob(pattern)}  # globbed as setuptools globs them
    files = {path for path in STATIC.rglob("*") if path.is_file()}
    assert len(files) > 10 and sorted(files - shipped) == []


def test_the_console_files_need_no_key():
    """A browser fetches the console's modules several at once: they need no key, so they must never
    count among the few FACEGATE_MAX_UNAUTHENTICATED_PER_CLIENT requests whose key is still unknown
    (a DeepStack form field), which would refuse some of them (admission holds no slot for them at all:
    test_admission)."""
    marked: dict[str, bool] = {}

    async def app(scope, receive, send):
        marked[scope["path"]] = scope[AUTHENTICATED]

    auth = ApiKeyAuth(app, ApiKeys([KEY]), body_key_paths=frozenset({"/v1/vision/face/recognize"}))
    for path in ("/console/", "/console/js/main.js", "/v1/vision/face/recognize"):
        anyio.run(auth, {"type": "http", "path": path, "headers": []}, None, None)
    assert marked == {"/console/": True, "/console/js/main.js": True, "/v1/vision/face/recognize": False}
