"""Large JSON bodies against a real `facegate serve` (issue 34, defect 3): a 20 MB metadata list and a
CompreFace bulk delete of 4 million ids are refused with a 4xx, while /healthz, pinged throughout,
never waits on them (a 24 MB list stalled it 18.6 s, 6M ids 11 s and the delete itself took 233 s).
The bound on /healthz is generous: it measures a stalled event loop, not speed. 127.0.0.1 only."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.chaos.server import facegate_serve

pytestmark = pytest.mark.slow


class HealthPings:
    """Pings /healthz every 0.1 s from a thread while the block runs: the slowest answer."""

    def __init__(self, url: str):
        self.url, self.slowest, self.count = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ping, daemon=True)

    def _ping(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                assert client.get(f"{self.url}/healthz").status_code == 200
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.count += 1
                self._stop.wait(0.1)

    def __enter__(self) -> HealthPings:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_large_json_bodies_are_refused_without_holding_the_event_loop(tmp_path):
    env = {
        "FACEGATE_DATA_DIR": str(tmp_path / "gallery"),
        "FACEGATE_MODEL_CACHE": str(tmp_path / "cache"),
        "FACEGATE_EMBEDDER": "none",
    }
    metadata = b'{"id": "big", "name": "x", "metadata": {"list": [' + b"0," * 10_000_000 + b"0]}}"
    ids = b"[" + b'"7",' * 4_000_000 + b'"7"]'
    with facegate_serve(env, tmp_path / "server.log") as (url, _, _):

        def post(path: str, body: bytes) -> httpx.Response:
            return httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)

        with HealthPings(url) as pings, ThreadPoolExecutor(2) as pool:
            time.sleep(0.5)
            answers = list(pool.map(post, ["/subjects", "/api/v1/recognition/faces/delete"], [metadata, ids]))
            time.sleep(0.5)
        print(f"large bodies: statuses {[a.status_code for a in answers]}; /healthz slowest of {pings.count}: {pings.slowest:.2f} s")
        assert [a.status_code for a in answers] == [400, 400], [a.text[:200] for a in answers]
        assert pings.slowest < 2.0, f"/healthz waited {pings.slowest:.1f} s"
        assert httpx.get(f"{url}/subjects", timeout=10).json()["total"] == 0
