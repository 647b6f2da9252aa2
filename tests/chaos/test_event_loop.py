"""Large JSON bodies against a real `facegate serve` (issue 34, defect 3): a 20 MB metadata list and a
CompreFace bulk delete of 4 million ids are refused with a 4xx, while /healthz, pinged throughout,
never waits on them (a 24 MB list stalled it 18.6 s, 6M ids 11 s and the delete itself took 233 s).
The bound on /healthz is generous: it measures a stalled event loop, not speed. 127.0.0.1 only."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.chaos.server import Background, facegate_serve, without_models

pytestmark = pytest.mark.slow


class HealthPings(Background):
    """Pings /healthz every 0.1 s while the block runs: the slowest answer."""

    interval = 0.1

    def __init__(self, url: str):
        super().__init__()
        self.client = httpx.Client(base_url=url, timeout=60)
        self.slowest, self.count = 0.0, 0

    def sample(self) -> None:
        started = time.monotonic()
        assert self.client.get("/healthz").status_code == 200
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.count += 1

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.client.close()


def test_large_json_bodies_are_refused_without_holding_the_event_loop(tmp_path):
    env = without_models(tmp_path)
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
