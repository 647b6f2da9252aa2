"""Hostile connections against the real `facegate serve` process on a free 127.0.0.1 port (issue
23, defect 1): idle and trickling sockets neither make /healthz answer 503 nor stay open past their
deadline, a trickled body gets 408, and admission control refuses excess work with a JSON 503 and
Retry-After while /healthz still answers. Every loop and wait is bounded; nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import select
import socket

import httpx
import pytest

from tests.chaos.server import facegate_serve
from tests.polling import wait_until

pytestmark = pytest.mark.slow
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
IDLE_SOCKETS = 600  # above uvicorn's old limit_concurrency (512), which idle sockets used to exhaust


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos-connections")
    env = {
        "FACEGATE_DATA_DIR": str(tmp / "gallery"),
        "FACEGATE_MODEL_CACHE": str(tmp / "cache"),  # no models: only the HTTP layer is under test
        "FACEGATE_EMBEDDER": "none",
        "FACEGATE_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
        "FACEGATE_BODY_TIMEOUT": str(BODY_TIMEOUT),
        "FACEGATE_MAX_INFLIGHT_REQUESTS": "2",
    }
    with facegate_serve(env, tmp / "server.log") as (url, port, _):
        yield port, url


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def _gone(s: socket.socket, line: bytes = b"") -> bool:
    """Whether the server has closed `s` (EOF or reset), without waiting: what it sent is read off;
    `line` is sent first, as a client still trickling its headers would."""
    try:
        if line:
            s.sendall(line)
        while select.select([s], [], [], 0)[0]:
            if not s.recv(65536):
                return True
        return False
    except (BrokenPipeError, ConnectionResetError):
        return True


def _until_all_gone(sockets: list[socket.socket], what: str, line: bytes = b"") -> None:
    """Poll until the server has closed every socket (sending `line` on each still open, each time)."""
    still = set(sockets)

    def all_gone() -> bool:
        still.difference_update([s for s in still if _gone(s, line)])
        return not still

    wait_until(all_gone, f"{what} ({len(still)} of {len(sockets)} still open)", timeout=HEADER_TIMEOUT + 60, step=0.25)


def test_idle_and_trickling_sockets_do_not_take_healthz_down_and_are_closed_at_the_deadline(server):
    port, url = server
    idle = [_connect(port) for _ in range(IDLE_SOCKETS)]
    trickling = [_connect(port) for _ in range(20)]
    try:
        for s in trickling:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        for _ in range(5):
            r = httpx.get(f"{url}/healthz", timeout=5)
            assert r.status_code == 200, r.text
        assert httpx.head(f"{url}/healthz", timeout=5).status_code == 200  # HEAD as orchestrators send it
        # a header line every 0.25 s does not move the deadline: a trickling socket is closed all the same
        _until_all_gone(trickling, "trickling sockets closed at the header deadline", line=b"X: y\r\n")
        _until_all_gone(idle, "idle sockets closed at the header deadline")
    finally:
        for s in idle + trickling:
            s.close()


def test_a_trickled_body_gets_408_and_the_connection_closes(server):
    port, _ = server
    s = _connect(port)
    try:
        s.sendall(b"POST /subjects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        s.settimeout(BODY_TIMEOUT + 5)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        assert json.loads(body)["error"]["code"] == "request_timeout"
    finally:
        s.close()


def test_admission_control_answers_json_503_with_retry_after_and_health_stays_up(server):
    port, url = server
    holders = [_connect(port) for _ in range(2)]  # MAX_INFLIGHT_REQUESTS=2 requests whose bodies never finish
    try:
        for s in holders:
            s.sendall(b"POST /subjects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        # once both holders are admitted, the next request is refused
        r = wait_until(lambda: (r := httpx.get(f"{url}/subjects", timeout=5)).status_code == 503 and r, "a request past the limit refused")
        assert r.json()["error"]["code"] == "overloaded", r.text
        assert int(r.headers["retry-after"]) >= 1
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 200
    finally:
        for s in holders:
            s.close()
    # the holders' slots are released (at their body deadline at the latest)
    wait_until(lambda: httpx.get(f"{url}/subjects", timeout=5).status_code == 200, "the holders' slots released", timeout=BODY_TIMEOUT + 60)


def _answer(s: socket.socket) -> tuple[bytes, bytes]:
    """The server's whole answer on `s` (it closes the connection): (head, body)."""
    answer = b""
    try:
        while chunk := s.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("at_once", [True, False], ids=["sent-at-once", "in-pieces"])
def test_a_header_block_over_16_kib_gets_431_in_the_json_shape(server, at_once):
    port, _ = server
    block = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70)) + b"\r\n"
    s = _connect(port)
    try:
        if at_once:  # h11 checks its limit only on an incomplete block: a complete one arriving whole passed
            s.sendall(block)
        else:
            for i in range(0, len(block), 4096):
                if select.select([s], [], [], 0.05)[0]:
                    break  # answered before the block was complete: sending on would only reset the socket
                s.sendall(block[i : i + 4096])
        head, body = _answer(s)
    finally:
        s.close()
    assert head.startswith(b"HTTP/1.1 431"), head[:300]
    assert json.loads(body)["error"]["code"] == "headers_too_large"


def test_a_header_block_under_the_limit_is_served(server):
    port, _ = server
    s = _connect(port)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: " + b"a" * 15_000 + b"\r\n\r\n")
        head, _ = _answer(s)
    finally:
        s.close()
    assert head.startswith(b"HTTP/1.1 200"), head[:300]


def test_a_malformed_request_gets_400_in_the_json_shape(server):
    port, _ = server
    s = _connect(port)
    try:
        s.sendall(b"NOT HTTP\r\n\r\n")
        head, body = _answer(s)
    finally:
        s.close()
    assert head.startswith(b"HTTP/1.1 400"), head[:300]
    assert json.loads(body)["error"]["code"] == "bad_request"


def _one_response(s: socket.socket) -> tuple[bytes, bytes]:
    """One response read off a kept-alive connection: (head, body), by its Content-Length."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(65536)
        assert chunk, f"the connection closed before an answer: {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")))
    while len(body) < length:
        body += s.recv(65536)
    return head, body


def test_a_stopping_server_answers_on_an_idle_keep_alive_connection_with_connection_close(tmp_path):
    """Graceful shutdown without losing a proxy's request (issue 37): once stopping, the server refuses
    new connections (a proxy retries those elsewhere, POST included) but keeps an idle keep-alive
    connection open until its keep-alive timeout, answering a request sent on it with `Connection:
    close`. uvicorn closed such a connection at once, losing a request the proxy sent at that moment
    (nginx cannot resend a POST it sent)."""
    env = {"FACEGATE_DATA_DIR": str(tmp_path / "gallery"), "FACEGATE_MODEL_CACHE": str(tmp_path / "cache"), "FACEGATE_EMBEDDER": "none"}
    with facegate_serve(env, tmp_path / "server.log") as (_, port, process):
        pooled = _connect(port)
        try:
            pooled.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _ = _one_response(pooled)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
            process.terminate()

            def refused() -> bool:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except ConnectionRefusedError:
                    return True
                return False

            wait_until(refused, "new connections refused after SIGTERM (the listening socket closes first)", timeout=5)
            pooled.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # the proxy's next request on its pooled connection
            head, body = _one_response(pooled)
            assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), head
            assert json.loads(body) == {"status": "ok"}
            wait_until(lambda: _gone(pooled), "the connection closed after its Connection: close answer", timeout=5)
        finally:
            pooled.close()
        process.wait(15)  # gone once its connections are (uvicorn re-raises the SIGTERM: exit status -15)
