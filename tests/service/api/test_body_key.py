"""A DeepStack key in the body's first fields counts before admission (issue 45, N4): 16 anonymous
slow uploads filled the slots kept for requests whose key is unknown, and a DeepStack client with a
valid key in its form field got 503 the whole time. The body is read only that far and replayed
unchanged to the route."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.api.admission import AUTHENTICATED
from service.api.auth import ApiKeys
from service.api.body_key import PEEK_BYTES, peek_key
from service.api.middleware import ApiKeyAuth
from service.budget import CLIENT

KEY = "body-key"
PATH = "/v1/vision/face/recognize"


def _form(data: dict, files: dict | None = None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """A body as a DeepStack client's HTTP library sends it (httpx, like requests, puts fields before files)."""
    request = httpx.Request("POST", "http://x" + PATH, data=data, files=files)
    return request.read(), [(name.lower().encode(), value.encode()) for name, value in request.headers.items()]


def _pieces(body: bytes, size: int = 1000) -> list[dict]:
    chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    return [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]


async def _through_auth(body: bytes, headers: list) -> tuple[bool, bytes]:
    """(whether ApiKeyAuth marked the request keyed, the body the app read)."""
    queue = _pieces(body)
    seen: dict = {}

    async def receive():
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def app(scope, receive, send):
        read, more = b"", True
        while more:
            message = await receive()
            read, more = read + message.get("body", b""), message.get("more_body", False)
        seen.update(keyed=scope[AUTHENTICATED], body=read)

    auth = ApiKeyAuth(app, ApiKeys([KEY]), body_key_paths=frozenset({PATH}))
    await auth({"type": "http", "path": PATH, "headers": headers}, receive, None)
    return seen["keyed"], seen["body"]


PHOTO = bytes(range(256)) * 200  # 51 KB: far past what is peeked


@pytest.mark.parametrize(
    "data, files, keyed",
    [
        ({"api_key": KEY}, {"image": ("a.jpg", PHOTO, "image/jpeg")}, True),
        ({"api_key": KEY, "userid": "Ada"}, None, True),  # no file: url-encoded
        ({"api_key": "wrong"}, {"image": ("a.jpg", PHOTO, "image/jpeg")}, False),
        ({}, {"image": ("a.jpg", PHOTO, "image/jpeg")}, False),
        ({"api_key": [KEY, KEY]}, {"image": ("a.jpg", PHOTO, "image/jpeg")}, False),  # two keys are none, as the route says
    ],
)
def test_a_key_among_the_first_fields_admits_the_request_as_keyed_and_the_body_is_replayed(data, files, keyed):
    body, headers = _form(data, files)
    assert asyncio.run(_through_auth(body, headers)) == (keyed, body)


def test_a_key_past_the_peeked_bytes_is_left_to_the_route():
    body, headers = _form({"filler": "x" * 2 * PEEK_BYTES, "api_key": KEY}, {"image": ("a.jpg", PHOTO, "image/jpeg")})

    async def scenario():
        queue = _pieces(body)

        async def receive():
            return queue.pop(0)

        key, replay = await peek_key({"headers": headers}, receive)
        read = b""
        while True:
            message = await replay()
            read += message["body"]
            if not message["more_body"]:
                return key, read

    assert asyncio.run(scenario()) == (None, body)


def test_a_body_that_does_not_come_is_waited_for_briefly(monkeypatch):
    monkeypatch.setattr("service.api.body_key.PEEK_SECONDS", 0.1)
    _, headers = _form({"api_key": KEY})

    async def scenario():
        async def never():
            await asyncio.sleep(60)

        return await asyncio.wait_for(peek_key({"headers": headers}, never), 5)

    assert asyncio.run(scenario())[0] is None


@pytest.mark.parametrize(
    "keys, headers, body, who",
    [
        ([KEY], [(b"x-api-key", KEY.encode())], None, "key"),
        ([KEY], [], {"api_key": KEY}, "key"),  # found among the first fields
        ([], [(b"x-api-key", b"made-up")], None, "address"),  # no keys configured: a header proves nothing
        ([KEY], [(b"x-api-key", b"wrong")], None, "address"),
    ],
)
def test_a_request_is_its_key_for_fairness_only_where_the_key_checked_out(keys, headers, body, who):
    """The per-client pixel cap (service.budget.CostLanes) counts by key: a key nobody checked would
    let a client without one take a fresh share with every made-up value."""
    seen = {}

    async def app(scope, receive, send):
        seen["client"] = CLIENT.get()

    form_body, form_headers = _form(body) if body else (b"", [])
    queue = _pieces(form_body)

    async def receive():
        return queue.pop(0)

    scope = {"type": "http", "path": PATH, "headers": headers + form_headers, "client": ("10.1.2.3", 5000)}
    asyncio.run(ApiKeyAuth(app, ApiKeys(keys), body_key_paths=frozenset({PATH}))(scope, receive, None))
    assert seen["client"].split()[0] == who
    assert seen["client"] == "address 10.1.2.3" or KEY not in seen["client"]  # a digest, never the key itself
