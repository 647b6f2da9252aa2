"""HTTP load for /verify and /identify: req/s and latency p50/p95/p99 at several concurrencies,
against a running server or one started here (`spawned`). Used by `facegate bench all` and
`benchmarks/load.py`. httpx (the dev extra) is imported only when a load runs."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LoadResult:
    route: str
    concurrency: int
    rps: float
    p50: float
    p95: float
    p99: float
    statuses: dict[int, int]

    def status_text(self) -> str:
        return ",".join(f"{k}:{v}" for k, v in sorted(self.statuses.items()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def spawned(env: dict[str, str], ready_timeout: float = 120.0):
    """A `uvicorn` server of this checkout on a free 127.0.0.1 port with a fresh gallery and `env`
    on top of this process's environment; yields its URL once /readyz answers 200, then stops it."""
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="facegate-load-")
    env = {**os.environ, "FACEGATE_DATA_DIR": data_dir, **env}
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "service.api.app:create_app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("the server did not become ready")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


async def enroll_gallery(client, images: list[bytes], subjects: int) -> None:
    for i, image in enumerate(images[:subjects]):
        await client.post("/subjects", json={"id": f"load-{i}", "name": f"load {i}"})
        await client.post(f"/subjects/load-{i}/faces", files={"image": image})


async def run(client, route: str, images: list[bytes], concurrency: int, requests: int) -> LoadResult:
    """`requests` POSTs to `route` from `concurrency` workers; /verify sends two images."""
    import httpx

    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = iter(range(requests))

    async def worker() -> None:
        for i in counter:
            image = images[i % len(images)]
            files = {"image1": image, "image2": images[(i + 1) % len(images)]} if route == "/verify" else {"image": image}
            started = time.perf_counter()
            try:
                response = await client.post(route, files=files)
                status = response.status_code
            except httpx.HTTPError:
                status = 0
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    p50, p95, p99 = np.percentile(np.array(latencies) * 1000, [50, 95, 99])
    return LoadResult(route, concurrency, requests / wall, p50, p95, p99, statuses)


async def matrix(
    url: str,
    images: list[bytes],
    routes: list[str],
    concurrency: list[int],
    requests: int,
    enroll: int = 20,
    api_key: str | None = None,
    report=None,
) -> list[LoadResult]:
    """Every (route, concurrency) in turn after a warm-up; `report(result)` is called as each ends."""
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    headers = {"X-API-Key": api_key} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrency))
    results = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        if "identify" in routes and enroll:
            await enroll_gallery(client, images, enroll)
        await run(client, "/verify", images, 2, 4)  # warm-up
        for route in routes:
            for c in concurrency:
                results.append(await run(client, f"/{route}", images, c, requests))
                if report:
                    report(results[-1])
    return results
