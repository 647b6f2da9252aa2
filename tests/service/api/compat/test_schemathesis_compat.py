"""Schemathesis over CompreFace's and DeepStack's routes (issue 34), which stay out of facegate's
OpenAPI schema (their contract is the foreign API's, with its error shape): the schema here describes
what each takes as its clients send it — query parameters, multipart files and fields, JSON bodies —
and every operation gets schema-valid and schema-violating requests, API keys on, in process, with
the tiny test embedder. No request may get a 5xx, and every answer is JSON. The request side only:
the answers' shapes are the foreign APIs', checked by test_compreface.py / test_deepstack.py and the
real clients. A test fails when a compat route is added without an operation here. Examples are
bounded as in test_schemathesis.py (FACEGATE_FUZZ_EXAMPLES raises them)."""

from __future__ import annotations

import os
import re

import pytest

from tests.requirements import importorskip  # noqa: E402

schemathesis = importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from schemathesis import GenerationMode, checks  # noqa: E402

KEY = "fuzz-key"
HEADERS = {"X-API-Key": KEY}
EXAMPLES = int(os.environ.get("FACEGATE_FUZZ_EXAMPLES", "40"))
BINARY = {"type": "string", "format": "binary"}
BASE64 = {"type": "string", "contentEncoding": "base64"}
NUMBER_LIST = {"type": "array", "items": {"type": "number"}}


def _query(*names: str, integers: tuple[str, ...] = ()) -> list[dict]:
    return [{"name": n, "in": "query", "required": False, "schema": {"type": "integer" if n in integers else "string"}} for n in names]


def _path(name: str) -> list[dict]:
    return [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}]


def _images(*names: str) -> dict:
    """CompreFace's image routes: multipart file parts, or base64 strings in a JSON body."""
    return {
        "required": True,
        "content": {
            "multipart/form-data": {"schema": {"type": "object", "properties": dict.fromkeys(names, BINARY), "required": list(names)}},
            "application/json": {"schema": {"type": "object", "properties": dict.fromkeys(names, BASE64), "required": list(names)}},
        },
    }


def _json(schema: dict) -> dict:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _form(properties: dict, required: tuple[str, ...] = ()) -> dict:
    """DeepStack's routes: a multipart form, any field names for images; `api_key` may ride in it."""
    schema = {"type": "object", "properties": {**properties, "api_key": {"type": "string"}}, "required": list(required)}
    return {"required": True, "content": {"multipart/form-data": {"schema": schema}}}


DETECTION = _query("limit", "det_prob_threshold", "face_plugins", "status", "detect_faces")
OPERATIONS: dict[tuple[str, str], dict] = {
    ("post", "/api/v1/recognition/recognize"): {"parameters": DETECTION + _query("prediction_count"), "requestBody": _images("file")},
    ("post", "/api/v1/detection/detect"): {"parameters": DETECTION, "requestBody": _images("file")},
    ("post", "/api/v1/verification/verify"): {"parameters": DETECTION, "requestBody": _images("source_image", "target_image")},
    ("post", "/api/v1/recognition/faces"): {
        "parameters": _query("subject", "det_prob_threshold", "detect_faces"),
        "requestBody": _images("file"),
    },
    ("get", "/api/v1/recognition/faces"): {"parameters": _query("subject", "page", "size")},
    ("delete", "/api/v1/recognition/faces"): {"parameters": _query("subject")},
    ("delete", "/api/v1/recognition/faces/{image_id}"): {"parameters": _path("image_id")},
    ("get", "/api/v1/recognition/faces/{image_id}/img"): {"parameters": _path("image_id")},
    ("post", "/api/v1/recognition/faces/{image_id}/verify"): {"parameters": _path("image_id") + DETECTION, "requestBody": _images("file")},
    ("post", "/api/v1/recognition/faces/delete"): {"requestBody": _json({"type": "array", "items": {"type": "string"}})},
    ("post", "/api/v1/recognition/subjects"): {
        "requestBody": _json({"type": "object", "properties": {"subject": {"type": "string"}}, "required": ["subject"]})
    },
    ("get", "/api/v1/recognition/subjects"): {},
    ("get", "/api/v1/recognition/subjects/"): {},
    ("delete", "/api/v1/recognition/subjects/{subject}"): {"parameters": _path("subject")},
    ("put", "/api/v1/recognition/subjects/{subject}"): {
        "parameters": _path("subject"),
        "requestBody": _json({"type": "object", "properties": {"subject": {"type": "string"}}, "required": ["subject"]}),
    },
    ("delete", "/api/v1/recognition/subjects"): {},
    ("post", "/api/v1/recognition/embeddings/recognize"): {
        "parameters": _query("prediction_count"),
        "requestBody": _json({"type": "object", "properties": {"embeddings": {"type": "array", "items": NUMBER_LIST}}}),
    },
    ("post", "/api/v1/verification/embeddings/verify"): {
        "requestBody": _json({"type": "object", "properties": {"source": NUMBER_LIST, "targets": {"type": "array", "items": NUMBER_LIST}}})
    },
    ("post", "/v1/vision/face"): {"requestBody": _form({"image": BINARY, "min_confidence": {"type": "string"}}, ("image",))},
    ("post", "/v1/vision/face/recognize"): {"requestBody": _form({"image": BINARY, "min_confidence": {"type": "string"}}, ("image",))},
    ("post", "/v1/vision/face/register"): {
        "requestBody": _form({"userid": {"type": "string"}, "image": BINARY, "image2": BINARY}, ("userid", "image"))
    },
    ("post", "/v1/vision/face/delete"): {"requestBody": _form({"userid": {"type": "string"}}, ("userid",))},
    ("post", "/v1/vision/face/list"): {"requestBody": _form({})},
}


def compat_schema() -> dict:
    paths: dict[str, dict] = {}
    for (method, path), operation in OPERATIONS.items():
        responses = {"default": {"description": "the foreign API's answer", "content": {"application/json": {"schema": {}}}}}
        paths.setdefault(path, {})[method] = {**operation, "responses": responses}
    return {"openapi": "3.0.3", "info": {"title": "facegate compat (CompreFace, DeepStack)", "version": "test"}, "paths": paths}


def test_every_compat_route_has_an_operation():
    from fastapi.routing import APIRoute

    from service.api.compat import ROUTERS

    routes = {
        (m.lower(), re.sub(r"\{(\w+):path\}", r"{\1}", r.path))  # a name with "/" in it travels as %2F, the path parameter whole
        for router in ROUTERS
        for r in router.routes
        if isinstance(r, APIRoute)
        for m in r.methods
    }
    assert routes == set(OPERATIONS)


@pytest.fixture(scope="module")
def compat(tmp_path_factory, model_cache, embedder_manifest):
    """One app for every operation (a fresh one each would multiply the start-up): a subject with a
    face so that lookups can hit, as the native fuzzer's `known` subject."""
    from tests.conftest import aligned_crop_png, settings_for, started_client
    from tests.service.api.test_schemathesis import without_lifespan

    settings = settings_for(model_cache, embedder_manifest, data_dir=tmp_path_factory.mktemp("compat-fuzz"), api_keys=SecretStr(KEY))
    with started_client(settings) as client:
        assert client.post("/subjects", json={"id": "known", "name": "Known"}, headers=HEADERS).status_code == 201
        added = client.post("/subjects/known/faces", files={"image": aligned_crop_png(0)}, data={"aligned": "true"}, headers=HEADERS)
        assert added.status_code == 201, added.text
        schema = schemathesis.openapi.from_dict(compat_schema())
        schema.app = without_lifespan(client.app)
        yield schema


@pytest.mark.parametrize("method,path", sorted(OPERATIONS), ids=[f"{m.upper()} {p}" for m, p in sorted(OPERATIONS)])
def test_no_5xx_on_the_compat_routes(compat, method, path):
    operation = compat[path][method]
    strategy = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(headers=HEADERS, checks=[checks.not_a_server_error, checks.content_type_conformance])

    run()
