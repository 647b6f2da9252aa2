"""Hostile connections against the real `facegate serve` process on a free 127.0.0.1 port (issue
23, defect 1): idle and trickling sockets neither make /healthz answer 503 nor stay open past their
deadline, a trickled body gets 408, and admission control refuses excess work with a JSON 503 and
Retry-After while /healthz still answers. Every loop and wait is bounded; nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest

from tests.chaos.server import facegate_serve, without_models

pytestmark = pytest.mark.slow
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
IDLE_SOCKETS = 600  # above uvicorn's old limit_concurrency (512), which idle sockets used to exhaust


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos-connections")
    env = without_models(
        tmp, FACEGATE_HEADER_TIMEOUT=str(HEADER_TIMEOUT), FACEGATE_BODY_TIMEOUT=str(BODY_TIMEOUT), FACEGATE_MAX_INFLIGHT_REQUESTS="2"
    )
    with facegate_serve(env, tmp / "server.log") as (url, port, _):
        yield port, url


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def _closed(s: socket.socket) -> bool:
    """Whether the server closed the socket (EOF or reset), waiting at most the socket's timeout."""
    try:
        while data := s.recv(65536):
            if not data:
                break
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


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
        time.sleep(HEADER_TIMEOUT + 0.5)
        for s in trickling:
            s.sendall(b"X: y\r\n")  # still trickling: too late
        assert all(_closed(s) for s in idle + trickling)
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
        time.sleep(0.3)
        r = httpx.get(f"{url}/subjects", timeout=5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
        assert int(r.headers["retry-after"]) >= 1
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{url}/metrics", timeout=5).status_code == 200
    finally:
        for s in holders:
            s.close()
    time.sleep(BODY_TIMEOUT + 0.5)  # the holders' slots are released when their deadline passes
    assert httpx.get(f"{url}/subjects", timeout=5).status_code == 200


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


@pytest.fixture(scope="module")
def patient_body_server(tmp_path_factory):
    """A short header deadline and a long body deadline, so that which of them applies shows."""
    tmp = tmp_path_factory.mktemp("chaos-pipelining")
    env = without_models(tmp, FACEGATE_HEADER_TIMEOUT="1", FACEGATE_BODY_TIMEOUT="10")
    with facegate_serve(env, tmp / "server.log") as (_, port, _):
        yield port


def test_a_pipelined_request_gets_the_body_deadline_for_its_body(patient_body_server):
    """`GET /healthz` then, in the same write, a POST whose body trickles: the header deadline was
    re-armed on the POST when the GET's answer ended, and cut its connection (issue 34, defect 7)."""
    body = json.dumps({"id": "pipelined", "name": "P"}).encode()
    s = _connect(patient_body_server)
    try:
        s.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            + b"POST /subjects HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:1]
        )
        for i in range(1, len(body)):  # 3 s of trickling: past the header deadline, within the body's
            time.sleep(3.0 / len(body))
            s.sendall(body[i : i + 1])
        s.settimeout(10)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1 ") == 2, answer[:400]
    assert b"HTTP/1.1 201" in answer and b'"pipelined"' in answer, answer[-400:]
