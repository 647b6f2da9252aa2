"""Schemathesis against the live OpenAPI schema (issue 17): every operation, API keys on, in process
(ASGI, no network), with the tiny test embedder. Every generated request (schema-valid and
schema-violating) must get no 5xx, and every answer must conform to the schema: a listed status code,
the documented content type, a body matching its model. The example count is bounded so the test
stays well under a minute on 2 cores; FACEGATE_FUZZ_EXAMPLES raises it for a longer run.

Schemathesis' own `from_fixture` parametrization does not run under pytest 9, so the operations are
parametrized here and each runs as a Hypothesis test over the operation's strategy."""

from __future__ import annotations

import os

import pytest

from tests.requirements import importorskip

schemathesis = importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from schemathesis import GenerationMode, checks  # noqa: E402

KEY = "fuzz-key"
HEADERS = {"X-API-Key": KEY}
EXAMPLES = int(os.environ.get("FACEGATE_FUZZ_EXAMPLES", "40"))
CHECK_NAMES = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance")


def _operations() -> list[tuple[str, str]]:
    """Every (method, path) the app documents; the schema needs no model, so it is read at collection."""
    from service.api.app import create_app
    from service.core.settings import Settings

    paths = create_app(Settings(api_keys=SecretStr(KEY))).openapi()["paths"]
    return [(method.upper(), path) for path, ops in paths.items() for method in ops]


OPERATIONS = _operations()


@pytest.fixture
def live_schema(api_settings, make_client):
    """The schema the started app serves (fetched with the key), bound to that app. The lifespan is
    make_client's; schemathesis' ASGI client is refused a second one, so both reach one service."""
    client = make_client(api_settings.model_copy(update={"api_keys": SecretStr(KEY)}))
    assert client.post("/subjects", json={"id": "known", "name": "Known"}, headers=HEADERS).status_code == 201
    return schemathesis.openapi.from_asgi("/openapi.json", without_lifespan(client.app), headers=HEADERS)


def without_lifespan(app):
    """`app` for schemathesis' ASGI client, which is refused a second lifespan: the test client ran it."""

    async def serve(scope, receive, send):
        if scope["type"] == "lifespan":
            raise RuntimeError("the lifespan is run by the test client")
        await app(scope, receive, send)

    return serve


# What the app answers that the schema leaves out, so that the fuzzer never sees it; each with why.
LEFT_OUT = {
    "/openapi.json": "the schema itself",
    "/docs": "Swagger UI's page",
    "/docs/assets/{path}": "Swagger UI's static files",
    "/console/{path}": "the web console's static files (tests/service/api/test_console.py)",
}
LEFT_OUT_PREFIXES = {
    "/api/v1/": "CompreFace's API (docs/compat.md): requests in its own shape, tested in tests/service/api/compat/",
    "/v1/vision/": "DeepStack's API (docs/compat.md): requests in its own shape, tested in tests/service/api/compat/",
}


def _app_routes() -> set[tuple[str, str]]:
    """Every (method, path) the app routes, read from its router rather than from its schema (a
    mount, which takes any method, as "*"): what a client can reach."""
    from fastapi.routing import iter_route_contexts

    from service.api.app import create_app
    from service.core.settings import Settings

    app = create_app(Settings(api_keys=SecretStr(KEY)))
    return {(method, route.path_format) for route in iter_route_contexts(app.routes) for method in route.methods or {"*"}}


def test_every_route_the_app_answers_is_fuzzed_or_left_out_with_a_reason(live_schema):
    fuzzed = {(r.ok().method.upper(), r.ok().path) for r in live_schema.get_all_operations()}
    routes = _app_routes()
    assert fuzzed == set(OPERATIONS) and len(fuzzed) >= 14 and fuzzed <= routes

    def why(method: str, path: str) -> str | None:
        if method == "HEAD" and ("GET", path) in fuzzed:
            return "the GET's answer without its body"
        return LEFT_OUT.get(path) or next((why for prefix, why in LEFT_OUT_PREFIXES.items() if path.startswith(prefix)), None)

    assert sorted(route for route in routes - fuzzed if why(*route) is None) == [], "document it in the schema, or name it here"
    assert {path for _, path in routes} >= set(LEFT_OUT)  # no stale entry
    assert all(any(path.startswith(prefix) for _, path in routes - fuzzed) for prefix in LEFT_OUT_PREFIXES)


def test_every_guarded_operation_documents_401():
    """Found by this fuzzer: /metrics answered an undocumented 401 without a key."""
    from service.api.app import create_app
    from service.core.settings import Settings

    paths = create_app(Settings(api_keys=SecretStr(KEY))).openapi()["paths"]
    guarded = [(m, p) for p, ops in paths.items() for m, op in ops.items() if op.get("security")]
    assert ("get", "/metrics") in guarded
    assert [(m, p) for m, p in guarded if "401" not in paths[p][m]["responses"]] == []


@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_no_5xx_and_answers_conform_to_the_schema(live_schema, method, path):
    operation = live_schema[path][method]
    strategy = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))
    response_checks = [getattr(checks, name) for name in CHECK_NAMES]

    @given(case=strategy)
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    def run(case):
        case.call_and_validate(headers=HEADERS, checks=response_checks)

    run()
