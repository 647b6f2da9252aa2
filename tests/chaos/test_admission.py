"""Admission against a real `facegate serve` (issue 34, defects 4 and 8): unauthenticated DeepStack
uploads that trickle from many addresses (127.0.0.2…, all loopback on Linux) leave keyed clients
their slots, and request bodies are held against their budget, so many large JSON bodies at once
stay within the memory it allows. Bounded in count and time; 127.0.0.1/8 only."""

from __future__ import annotations

import base64
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.chaos.server import PeakMemory, ProcessTree, facegate_serve, without_models
from tests.polling import wait_until
from tests.requirements import need

pytestmark = pytest.mark.slow
KEY = "chaos-key"
INFLIGHT = 8
BODIES = 24


def _trickle(port: int, source: str) -> socket.socket:
    """A DeepStack upload without a header key, whose body never finishes (its key would be in it)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    s.sendall(
        b"POST /v1/vision/face/recognize HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: 100000\r\n\r\n--b\r\n"
    )
    return s


def _answer(s: socket.socket) -> bytes:
    s.settimeout(0.01)
    try:
        return s.recv(65536)
    except TimeoutError:
        return b""  # still being served: no answer yet


def test_trickling_unauthenticated_uploads_leave_keyed_clients_their_slots(tmp_path):
    """70 unauthenticated slow uploads to /v1/vision/face/recognize made every keyed request 503."""
    env = without_models(
        tmp_path,
        FACEGATE_API_KEYS=KEY,
        FACEGATE_MAX_INFLIGHT_REQUESTS=str(INFLIGHT),
        FACEGATE_BODY_TIMEOUT="60",
        FACEGATE_BODY_MIN_RATE="0",  # the slots are under test: the trickles are not ended at a minimum rate here
    )
    with facegate_serve(env, tmp_path / "server.log") as (url, port, _):
        sockets = [_trickle(port, f"127.0.0.{2 + i % 10}") for i in range(40)]  # 10 addresses, 4 each
        sockets += [_trickle(port, "127.0.0.2") for _ in range(5)]  # one address, past its share
        try:
            answers = {}  # admitted after their first fields were looked at for a key (body_key.PEEK_SECONDS)

            def refusals() -> bool:
                answers.update({s: _answer(s) for s in sockets if not answers.get(s)})
                return sum(a.startswith(b"HTTP/1.1 503") for a in answers.values()) == len(sockets) - 16

            wait_until(refusals, "all but FACEGATE_MAX_UNAUTHENTICATED_REQUESTS refused", timeout=30, step=0.2)
            refused = [a for a in answers.values() if a.startswith(b"HTTP/1.1 503")]
            assert all(b"overloaded" in a for a in refused)
            keyed = httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=10)
            for _ in range(3 * INFLIGHT):
                assert keyed.get("/subjects").status_code == 200
            assert keyed.post("/v1/vision/face/list").json()["success"] is True  # DeepStack with a header key: a keyed request
            with ThreadPoolExecutor(INFLIGHT) as pool:  # the keyed slots, all at once
                assert set(pool.map(lambda _: keyed.get("/subjects").status_code, range(INFLIGHT))) == {200}
            assert httpx.post(f"{url}/v1/vision/face/list", timeout=10).status_code == 503  # no anonymous slot left
            # a key among the form's first fields counts before admission (issue 45, N4): served all the same
            assert httpx.post(f"{url}/v1/vision/face/list", data={"api_key": KEY}, timeout=10).json()["success"] is True
        finally:
            for s in sockets:
                s.close()
        time.sleep(0.5)
        assert httpx.post(f"{url}/v1/vision/face/list", data={"api_key": KEY}, timeout=10).json()["success"] is True


def test_large_json_bodies_at_once_stay_within_the_body_budget(tmp_path):
    """32 × 24 MB base64 bodies added 1.44 GB: each is parsed into several copies of itself. With a
    50 MB body budget two are held at a time; the rest wait their turn."""
    if not Path("/proc/self/smaps_rollup").is_file():
        need("LINUX_ROOT", "memory is read from /proc (Linux)")
    body = json.dumps({"image": base64.b64encode(b"\x00" * 18_000_000).decode()}).encode()
    env = without_models(tmp_path, FACEGATE_MAX_BODY_MEGABYTES="50", FACEGATE_DECODE_WAIT="120")
    with facegate_serve(env, tmp_path / "server.log") as (url, _, process):

        def send(_: int) -> int:
            return httpx.post(f"{url}/embed", content=body, headers={"content-type": "application/json"}, timeout=180).status_code

        with PeakMemory(ProcessTree(process.pid), interval=0.02) as memory, ThreadPoolExecutor(BODIES) as pool:
            statuses = list(pool.map(send, range(BODIES)))
        print(f"{BODIES} × {len(body) / 1e6:.0f} MB JSON bodies: PSS base {memory.base / 1e6:.0f} MB, peak +{memory.growth / 1e6:.0f} MB")
        assert set(statuses) == {503}, statuses  # parsed, then: no model loaded (the body is what is measured)
        assert memory.growth < 350e6, f"the server grew by {memory.growth / 1e6:.0f} MB"  # 2 bodies' copies, and slack


def test_unauthenticated_uploads_from_one_address_are_counted_across_the_workers(tmp_path):
    """Issue 45 (N4): with 4 workers, 7 of 10 anonymous uploads from one address were admitted,
    FACEGATE_MAX_UNAUTHENTICATED_PER_CLIENT (4) counted by each worker. With two workers the host's
    model host counts them: 4 admitted, whichever worker each reached."""
    env = without_models(tmp_path, FACEGATE_API_KEYS=KEY, FACEGATE_WORKERS="2", FACEGATE_BODY_MIN_RATE="0")
    with facegate_serve(env, tmp_path / "server.log") as (url, port, _):
        sockets = [_trickle(port, "127.0.0.2") for _ in range(10)]
        try:
            answers: dict = {}

            def refused() -> bool:  # each upload is admitted or refused once its first fields were looked at for a key
                answers.update({s: _answer(s) for s in sockets if not answers.get(s)})
                return sum(a.startswith(b"HTTP/1.1 503") for a in answers.values()) >= 6

            wait_until(refused, "6 of the 10 uploads refused, whichever worker each reached", timeout=30, step=0.2)
            same_address = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=10)
            assert same_address.post(f"{url}/v1/vision/face/list").status_code == 503  # its 4 are taken on the host
            assert httpx.post(f"{url}/v1/vision/face/list", timeout=10).status_code == 401  # another address: admitted, no key
        finally:
            for s in sockets:
                s.close()
