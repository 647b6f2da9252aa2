"""The HTTP protocol `facegate serve` runs: uvicorn's h11 protocol plus a deadline for the request
line and headers, and their size limit (`FACEGATE_H11_MAX_INCOMPLETE_EVENT_SIZE`) enforced whole.

uvicorn times out idle keep-alive connections but not a client that opens a socket and sends
nothing, or trickles its headers a byte at a time: each such socket would be held forever. Here a
connection whose next request's headers are not complete within `FACEGATE_HEADER_TIMEOUT` seconds
(from the connection, or from the end of its previous response) is closed. The body has its own
deadline (`FACEGATE_BODY_TIMEOUT`, service.api.middleware.BodyLimit). A pipelined request, whose
headers arrived before the previous response ended, is already under way when that response ends:
it gets the body deadline only.

h11 checks its size limit only while a header block is incomplete: a larger block that arrives in
one read was parsed and served. Here a parsed block is measured again before the app sees it, and
both refusals answer 431 `headers_too_large` in the JSON error shape (uvicorn's own answer to a bad
request is a plain-text 400, which this protocol also answers in the JSON shape).

uvicorn writes a response's status line and headers, then its body, in two writes: a process killed
between the two (a replica stopped under load) left a proxy holding a 201's headers and no body,
which it can only pass on torn, where a response never begun is its clean 502. Here the head waits
for the body's first write (`OneWriteHead`): a response whose body is one chunk, as every JSON answer
is, reaches the socket whole or not at all."""

from __future__ import annotations

import asyncio
import sys

import h11
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.error_handlers import error_response
from service.core.errors import BadRequest, FacegateError, HeadersTooLarge
from service.core.settings import get_settings


def header_block_size(scope: dict) -> int:
    """Bytes of the request line and headers as sent, less any whitespace h11 stripped."""
    query = scope["query_string"]
    target = len(scope["raw_path"]) + (len(query) + 1 if query else 0)
    request_line = len(scope["method"]) + 1 + target + len(" HTTP/1.1\r\n")
    return request_line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


class HeaderDeadlineProtocol(H11Protocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.header_limit = get_settings().h11_max_incomplete_event_size  # as `facegate serve` gives h11
        self.app = _HeaderLimit(self.app, self.header_limit)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneWriteHead(transport))  # type: ignore[arg-type]  # a transport in all but its class
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        answered = self.cycle
        super().on_response_complete()  # starts a pipelined request whose headers are already here
        if self.cycle is answered:
            self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        # A new request replaces self.cycle: the deadline fires on the cycle it was armed with.
        waiting_on = self.cycle
        self.loop.call_later(get_settings().header_timeout, self._header_deadline, waiting_on)

    def _header_deadline(self, waiting_on) -> None:
        if self.cycle is waiting_on and not self.transport.is_closing():
            self.transport.close()

    def shutdown(self) -> None:
        """Graceful shutdown that races no proxy: uvicorn closes an idle keep-alive connection at once,
        and a request a proxy sends on it at that moment is lost (nginx cannot resend a POST it sent).
        Here every response from now on says `Connection: close`, so the proxy takes the connection out
        of its pool, and an idle connection is left to its keep-alive timeout, after the proxy's own,
        shorter one (docker/nginx.conf) has closed it. The listening socket is already closed: a new
        connection is refused, which a proxy retries elsewhere for any request."""
        state = self.server_state  # its default headers start every request's response from now on
        if CLOSE_HEADER not in state.default_headers:
            state.default_headers = [*state.default_headers, CLOSE_HEADER]
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            if not cycle.response_started and CLOSE_HEADER not in cycle.default_headers:
                cycle.default_headers = [*cycle.default_headers, CLOSE_HEADER]

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this inside its `except h11.RemoteProtocolError`; h11 hints 431 for a block
        # that outgrew its limit before it was complete.
        hint = getattr(sys.exc_info()[1], "error_status_hint", 400)
        error: FacegateError = HeadersTooLarge(_too_large(self.header_limit)) if hint == 431 else BadRequest(f"invalid HTTP request: {msg}")
        response = error_response(error, headers={"Connection": "close"})
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers.items()]
        for event in (h11.Response(status_code=error.status, headers=headers), h11.Data(data=bytes(response.body)), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


class OneWriteHead:
    """The connection's transport, but a final response's head (not a 100 Continue, which the client
    waits for) is held until the next write, and written with it."""

    def __init__(self, transport: asyncio.Transport):
        self._transport = transport
        self._head = b""

    def write(self, data: bytes) -> None:
        if data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 1"):
            self._head += data
            return
        data, self._head = self._head + data, b""
        if data:
            self._transport.write(data)

    def close(self) -> None:
        if self._head:
            self.write(b"")
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


def _too_large(limit: int) -> str:
    return f"the request line and headers exceed {limit} bytes (FACEGATE_H11_MAX_INCOMPLETE_EVENT_SIZE)"


class _HeaderLimit:
    """Refuses, before the app, a header block that h11 parsed whole although it exceeds `limit`."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and header_block_size(scope) > self.limit:
            response = error_response(HeadersTooLarge(_too_large(self.limit)), headers={"Connection": "close"})
            return await response(scope, receive, send)
        await self.app(scope, receive, send)
