"""The bad-input corpus (issue 17): one table of hostile or malformed requests, each with the status and
error code it must get. Every case runs against one started app (API keys on, the test embedder) whose
gallery holds a subject with a face, and must leave the gallery exactly as it was."""

from __future__ import annotations

import base64
import json
import struct
import zlib

import cv2
import numpy as np
import pytest
from pydantic import SecretStr

from tests.conftest import REPO, aligned_crop_png, settings_for, started_client

KEY = "corpus-key"
AUTH = {"X-API-Key": KEY}
MAX_REQUEST_BYTES = 1_000_000


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width × height, with one tiny (wrong) data chunk."""
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + _png_chunk(b"IEND", b"")


def jpeg(width: int, height: int, value: int = 128) -> bytes:
    return cv2.imencode(".jpg", np.full((height, width, 3), value, np.uint8))[1].tobytes()


FACELESS = jpeg(200, 200)  # a flat grey photo: decodes, holds no face
CROP = aligned_crop_png(1)  # 112×112: the test embedder's aligned size
TRUNCATED = jpeg(200, 200)[:300]
FORGED_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 200
HUGE_PNG = png_header(100_000, 100_000)
HEIC = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 200
TEXT = (REPO / "README.md").read_bytes()
DEEP = "[" * 100_000 + "]" * 100_000


def nested(depth: int) -> dict:
    return json.loads('{"a":' * depth + "1" + "}" * depth)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def req(method: str, path: str, *, key: str | None = KEY, **kwargs):
    """A request: TestClient.request keyword arguments, with the API key unless `key` says otherwise."""
    return method, path, key, kwargs


def raw(method: str, path: str, body: str | bytes, content_type: str | None = "application/json", **kw):
    return req(method, path, content=body, headers={"content-type": content_type} if content_type else {}, **kw)


def verify(**fields):
    return req("POST", "/verify", files={"image1": CROP, "image2": CROP}, data={"aligned": "true", **fields})


def identify(**fields):
    return req("POST", "/identify", files={"image": CROP}, data={"aligned": "true", **fields})


# (id, request, status, error code)
CORPUS = [
    # content types and bodies
    ("text-plain-body", raw("POST", "/verify", b"image1=a", "text/plain"), 415, "unsupported_media_type"),
    ("xml-body", raw("POST", "/identify", b"<image/>", "application/xml"), 415, "unsupported_media_type"),
    ("no-content-type", raw("POST", "/embed", b"\x00\x01", None), 415, "unsupported_media_type"),
    ("empty-json-body", raw("POST", "/verify", b""), 400, "invalid_json"),
    ("empty-json-subjects", raw("POST", "/subjects", b""), 400, "invalid_json"),
    ("json-array-body", raw("POST", "/verify", "[]"), 422, "invalid_parameters"),
    ("json-string-body", raw("POST", "/subjects", '"emp-1"'), 422, "invalid_parameters"),
    ("malformed-json", raw("POST", "/identify", '{"image": '), 400, "invalid_json"),
    ("non-utf8-json", raw("POST", "/subjects", b'{"name": "\xff\xfe"}'), 400, "invalid_json"),
    ("json-nested-100k-verify", raw("POST", "/verify", DEEP), 400, "invalid_json"),
    ("json-nested-100k-enroll", raw("POST", "/subjects/known/faces", '{"image": ' + DEEP[:100_000]), 400, "invalid_json"),
    ("json-nested-100k-patch", raw("PATCH", "/subjects/known", '{"metadata": ' + DEEP), 400, "invalid_json"),
    ("empty-multipart", req("POST", "/verify", files={"x": ("", b"")}), 422, "invalid_parameters"),
    ("multipart-without-boundary", raw("POST", "/embed", b"--x\r\n", "multipart/form-data"), 400, "bad_request"),
    ("too-many-file-parts", req("POST", "/embed", files=[("images", b"x")] * 100), 400, "bad_request"),
    ("body-over-the-limit", raw("POST", "/embed", b"x" * (MAX_REQUEST_BYTES + 1), "application/octet-stream"), 413, "body_too_large"),
    # images
    ("non-image-bytes", req("POST", "/verify", files={"image1": TEXT, "image2": FACELESS}), 400, "invalid_image"),
    # found by this corpus: both images failing gave whichever error came first (image2's fast one here)
    ("both-images-bad-image1-wins", req("POST", "/verify", files={"image1": FACELESS, "image2": TEXT}), 422, "no_face"),
    ("empty-image", req("POST", "/embed", files={"image": b""}), 400, "invalid_image"),
    ("truncated-jpeg", req("POST", "/embed", files={"image": TRUNCATED}), 400, "invalid_image"),
    ("forged-png", req("POST", "/identify", files={"image": FORGED_PNG}), 400, "invalid_image"),
    ("png-claiming-100000x100000", req("POST", "/embed", files={"image": HUGE_PNG}), 413, "image_too_large"),
    ("huge-png-enroll", req("POST", "/subjects/known/faces", files={"image": HUGE_PNG}), 413, "image_too_large"),
    ("heic", req("POST", "/embed", files={"image": HEIC}), 415, "unsupported_media_type"),
    ("image-too-small", req("POST", "/embed", files={"image": jpeg(8, 8)}), 422, "image_too_small"),
    ("aligned-crop-wrong-size", req("POST", "/embed", files={"image": FACELESS}, data={"aligned": "true"}), 422, "invalid_aligned_crop"),
    ("no-face", req("POST", "/identify", files={"image": FACELESS}), 422, "no_face"),
    ("enroll-no-face", req("POST", "/subjects/known/faces", files={"image": FACELESS}), 422, "no_face"),
    ("bulk-enroll-all-bad", req("POST", "/subjects/known/faces", files=[("images", TEXT), ("images", FACELESS)]), 422, "enrollment_failed"),
    # base64 in JSON bodies
    ("base64-garbage", req("POST", "/embed", json={"image": "!!not base64!!"}), 422, "invalid_base64"),
    (
        "base64-data-url-garbage",
        req("POST", "/verify", json={"image1": "data:image/png;base64,@@@", "image2": b64(CROP)}),
        422,
        "invalid_base64",
    ),
    ("base64-of-text", req("POST", "/embed", json={"image": b64(TEXT)}), 400, "invalid_image"),
    ("image-as-number", req("POST", "/embed", json={"image": 12}), 422, "invalid_parameters"),
    # parameters
    ("missing-image2", req("POST", "/verify", files={"image1": CROP}), 422, "invalid_parameters"),
    ("unknown-multipart-field", verify(colour="blue"), 422, "invalid_parameters"),
    ("unknown-json-field", req("POST", "/embed", json={"image": b64(CROP), "aligned": True, "extra": 1}), 422, "invalid_parameters"),
    ("repeated-multipart-field", verify(threshold=["0.1", "0.9"]), 422, "invalid_parameters"),
    (
        "repeated-image-part",
        req("POST", "/verify", files=[("image1", CROP), ("image1", CROP), ("image2", CROP)]),
        422,
        "invalid_parameters",
    ),
    ("repeated-json-member", raw("POST", "/subjects", '{"name": "a", "name": "b"}'), 422, "invalid_parameters"),
    ("top-k-zero", identify(top_k="0"), 422, "invalid_parameters"),
    ("top-k-101", identify(top_k="101"), 422, "invalid_parameters"),
    ("top-k-not-a-number", identify(top_k="five"), 422, "invalid_parameters"),
    ("threshold-above-1", verify(threshold="1.5"), 422, "invalid_parameters"),
    ("threshold-nan", verify(threshold="nan"), 422, "invalid_parameters"),
    ("far-not-in-manifest", verify(far="0.5"), 422, "unknown_far"),
    ("far-and-threshold", verify(far="1e-3", threshold="0.5"), 422, "invalid_parameters"),
    ("faces-bogus", identify(faces="some"), 422, "invalid_parameters"),
    ("face-policy-bogus", verify(face_policy="any"), 422, "invalid_parameters"),
    ("limit-zero", req("GET", "/subjects", params={"limit": 0}), 422, "invalid_parameters"),
    ("offset-negative", req("GET", "/subjects", params={"offset": -1}), 422, "invalid_parameters"),
    ("face-id-not-int", req("DELETE", "/faces/abc"), 422, "invalid_parameters"),
    # subjects and ids
    (
        "verify-unknown-subject",
        req("POST", "/verify", files={"image1": CROP}, data={"aligned": "true", "subject_id": "nobody"}),
        404,
        "subject_not_found",
    ),
    ("get-unknown-subject", req("GET", "/subjects/nobody"), 404, "subject_not_found"),
    ("patch-unknown-subject", req("PATCH", "/subjects/nobody", json={"name": "x"}), 404, "subject_not_found"),
    ("delete-unknown-subject", req("DELETE", "/subjects/nobody"), 404, "subject_not_found"),
    (
        "enroll-unknown-subject",
        req("POST", "/subjects/nobody/faces", files={"image": CROP}, data={"aligned": "true"}),
        404,
        "subject_not_found",
    ),
    ("delete-unknown-face", req("DELETE", "/faces/999999"), 404, "face_not_found"),
    ("id-with-encoded-slashes", req("GET", "/subjects/..%2F..%2Fetc%2Fpasswd"), 404, "not_found"),  # %2F decodes to /: no route
    ("id-quotes-and-spaces", req("GET", "/subjects/a%20b'%22;--"), 404, "subject_not_found"),
    ("id-unicode", req("DELETE", "/subjects/%E2%80%AEknown"), 404, "subject_not_found"),
    ("id-nul-byte", req("GET", "/subjects/known%00"), 404, "subject_not_found"),
    ("id-10k-chars", req("GET", "/subjects/" + "x" * 10_000), 404, "subject_not_found"),
    ("create-existing-subject", req("POST", "/subjects", json={"id": "known", "name": "again"}), 409, "subject_exists"),
    ("create-id-with-slash", req("POST", "/subjects", json={"id": "a/b", "name": "x"}), 422, "invalid_parameters"),
    ("create-id-empty", req("POST", "/subjects", json={"id": "", "name": "x"}), 422, "invalid_parameters"),
    ("create-without-name", req("POST", "/subjects", json={"id": "new"}), 422, "invalid_parameters"),
    ("metadata-not-an-object", req("POST", "/subjects", json={"id": "new", "name": "x", "metadata": [1, 2]}), 422, "invalid_parameters"),
    ("metadata-too-deep", req("POST", "/subjects", json={"id": "new", "name": "x", "metadata": nested(300)}), 422, "invalid_parameters"),
    ("metadata-too-big", req("PATCH", "/subjects/known", json={"metadata": {"blob": "x" * 20_000}}), 422, "invalid_parameters"),
    ("patch-unknown-field", req("PATCH", "/subjects/known", json={"nickname": "x"}), 422, "invalid_parameters"),
    # routes, methods, keys
    ("unknown-route", req("GET", "/admin"), 404, "not_found"),
    ("unknown-route-post", req("POST", "/subjects/known/faces/1/extra", json={}), 404, "not_found"),
    ("method-not-allowed", req("PUT", "/subjects/known", json={"name": "x"}), 405, "method_not_allowed"),
    ("post-healthz", req("POST", "/healthz"), 405, "method_not_allowed"),
    ("missing-key", req("DELETE", "/subjects/known", key=None), 401, "unauthorized"),
    ("wrong-key", req("POST", "/subjects/known/faces", key="guess", files={"image": CROP}, data={"aligned": "true"}), 401, "unauthorized"),
    ("key-in-query-string", req("DELETE", "/subjects/known", key=None, params={"api_key": KEY}), 401, "unauthorized"),
    ("missing-key-openapi", req("GET", "/openapi.json", key=None), 401, "unauthorized"),
]


@pytest.fixture(scope="module")
def corpus_api(tmp_path_factory, model_cache, embedder_manifest):
    """One started app for the whole corpus, with a subject holding one face."""
    data_dir = tmp_path_factory.mktemp("corpus") / "gallery"
    settings = settings_for(model_cache, embedder_manifest, data_dir=data_dir, api_keys=SecretStr(KEY), max_request_bytes=MAX_REQUEST_BYTES)
    with started_client(settings) as client:
        assert client.post("/subjects", json={"id": "known", "name": "Known", "metadata": {"badge": 7}}, headers=AUTH).status_code == 201
        response = client.post("/subjects/known/faces", files={"image": CROP}, data={"aligned": "true"}, headers=AUTH)
        assert response.status_code == 201, response.text
        yield client


def gallery_state(client) -> dict:
    counts = client.get("/readyz", headers=AUTH).json()["gallery"]
    return {
        "counts": {k: counts[k] for k in ("subjects", "faces", "searchable_faces")},
        "subjects": client.get("/subjects", params={"limit": 1000}, headers=AUTH).json(),
        "faces": client.get("/subjects/known/faces", headers=AUTH).json(),
    }


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 40 and len({case[0] for case in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("request_, status, code", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_bad_input_gets_its_error_and_changes_nothing(corpus_api, request_, status, code):
    before = gallery_state(corpus_api)
    assert before["counts"] == {"subjects": 1, "faces": 1, "searchable_faces": 1}
    method, path, key, kwargs = request_
    kwargs = dict(kwargs)
    headers = {**({"X-API-Key": key} if key else {}), **kwargs.pop("headers", {})}
    response = corpus_api.request(method, path, headers=headers, **kwargs)
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert gallery_state(corpus_api) == before
