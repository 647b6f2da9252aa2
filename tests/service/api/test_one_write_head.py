"""A response's head and its body leave `facegate serve`'s protocol in one write: written apart, a
replica killed between the two left its proxy holding a 201's headers without the body, which the
proxy passed on torn (tests/test_scale_profile.py's killed replica, a POST /subjects); a 100 Continue
still goes out alone, at once, as its client waits for it."""

from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.server import ServerState

from service.api.server import HeaderDeadlineProtocol


class Transport:
    """What the protocol writes, write by write."""

    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def answer(app, request: bytes) -> Transport:
    config = Config(app, http="h11", lifespan="off", log_level="warning")
    config.load()
    protocol = HeaderDeadlineProtocol(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(request)
    for _ in range(100):
        if any(b"}" in w for w in transport.writes):
            break
        await asyncio.sleep(0.01)
    return transport


async def created(scope, receive, send) -> None:
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"12")]  # as a JSONResponse says
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": b'{"id": "p1"}'})


def test_a_response_s_head_and_body_are_one_write():
    transport = asyncio.run(answer(created, b"POST /subjects HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"))
    (whole,) = [w for w in transport.writes if w]
    assert whole.startswith(b"HTTP/1.1 201 ") and whole.endswith(b'{"id": "p1"}')


def test_a_100_continue_is_written_at_once_and_alone():
    transport = asyncio.run(answer(created, b"POST /subjects HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"))
    assert transport.writes[0].startswith(b"HTTP/1.1 100 ") and b"201" not in transport.writes[0]
