"""The API key a DeepStack client sends in its body (the `api_key` form field), read from the body's
first bytes before admission, so that such a client is admitted as keyed instead of waiting among
the few slots kept for requests whose key is unknown (which anonymous uploads can fill).

DeepStack's clients send their form fields before their files (requests and httpx both put `data`
before `files`), so the key is within the first few hundred bytes. At most PEEK_BYTES are read,
within PEEK_SECONDS; what was read is replayed to the app unchanged, and the route still checks the
key on the whole form (`service.api.compat.deepstack`). A key not found that early is no error: the
request is admitted as not yet keyed, as before."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header
from starlette.types import Message, Receive, Scope

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FIELD = b"api_key"
PEEK_BYTES = 8192
PEEK_SECONDS = 2.0
FORMS = (b"multipart/form-data", b"application/x-www-form-urlencoded")


class _FirstFields:
    """Callbacks for python-multipart's streaming parser: the text fields completed so far."""

    def __init__(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self._header = b""
        self._value = b""
        self._name: bytes | None = None
        self._data = b""

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._begin,
            "on_header_field": lambda data, start, end: setattr(self, "_header", self._header + data[start:end]),
            "on_header_value": lambda data, start, end: setattr(self, "_value", self._value + data[start:end]),
            "on_header_end": self._header_end,
            "on_part_data": lambda data, start, end: setattr(self, "_data", self._data + data[start:end]),
            "on_part_end": self._end,
        }

    def _begin(self) -> None:
        self._name, self._data = None, b""

    def _header_end(self) -> None:
        if self._header.lower() == b"content-disposition":
            _, options = parse_options_header(self._value)
            self._name = None if b"filename" in options else options.get(b"name")
        self._header, self._value = b"", b""

    def _end(self) -> None:
        if self._name is not None:
            self.fields.append((self._name, self._data))


def _key_in(content_type: bytes, prefix: bytes, complete: bool) -> str | None:
    """The one `api_key` field among the fields wholly within `prefix` (the whole body when `complete`)."""
    kind, options = parse_options_header(content_type)
    found: list[bytes]
    if kind == b"multipart/form-data" and options.get(b"boundary"):
        fields = _FirstFields()
        try:
            MultipartParser(options[b"boundary"], fields.callbacks()).write(prefix)
        except Exception:  # a malformed body: the route's own parser answers it
            return None
        found = [value for name, value in fields.fields if name == FIELD]
    elif kind == b"application/x-www-form-urlencoded":
        text = prefix if complete else prefix[: prefix.rfind(b"&") + 1]
        found = [value.encode() for name, value in parse_qsl(text.decode("latin-1")) if name.encode() == FIELD]
    else:
        return None
    if len(found) != 1:  # two keys are none, as the route decides
        return None
    try:
        return found[0].decode()
    except UnicodeDecodeError:
        return None


async def peek_key(scope: Scope, receive: Receive) -> tuple[str | None, Receive]:
    """The `api_key` form field near the start of the request's body (or None), and a `receive` that
    replays what was read before reading on."""
    content_type = dict(scope["headers"]).get(b"content-type", b"")
    if parse_options_header(content_type)[0] not in FORMS:  # no form, no field: nothing is read
        return None, receive
    read: list[Message] = []
    prefix, complete = b"", False
    deadline = time.monotonic() + PEEK_SECONDS
    while not complete and len(prefix) < PEEK_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            break
        read.append(message)
        complete = message["type"] != "http.request" or not message.get("more_body", False)
        prefix += message.get("body", b"")
    key = _key_in(content_type, prefix, complete)

    async def replay() -> Message:
        return read.pop(0) if read else await receive()

    return key, replay
