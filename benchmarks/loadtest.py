"""HTTP load for /verify and /identify: req/s and latency p50/p95/p99 at several concurrencies,
offered by `benchmarks.loadgen` against a running server or one started here (`spawned`: one
uvicorn process, or `facegate serve --workers N`). Used by `facegate bench all`, `facegate bench
load` and `benchmarks/load.py`. httpx (the dev extra) only enrolls the gallery and polls readiness."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from benchmarks.loadgen import LoadResult, offer, route_requests

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def spawned(env: dict[str, str], ready_timeout: float = 300.0, workers: int = 0):
    """A server of this checkout on a free 127.0.0.1 port with a fresh gallery and `env` on top of
    this process's environment: `facegate serve --workers N` when `workers` is given, else one
    uvicorn process. Yields its URL once /readyz answers 200, then stops it."""
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="facegate-load-")
    env = {**os.environ, "FACEGATE_DATA_DIR": data_dir, **env}
    if workers:
        command = [sys.executable, "-c", "from service.cli import main; main()", "serve", "--port", str(port), "--workers", str(workers)]
    else:
        command = [sys.executable, "-m", "uvicorn", "service.api.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--log-level", "warning"]
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
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def enroll_gallery(url: str, images: list[bytes], subjects: int, headers: dict[str, str]) -> None:
    import httpx

    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        for i, image in enumerate(images[:subjects]):
            client.post("/subjects", json={"id": f"load-{i}", "name": f"load {i}"})
            client.post(f"/subjects/load-{i}/faces", files={"image": image})


def matrix(
    url: str,
    images: list[bytes],
    routes: list[str],
    concurrency: list[int],
    requests: int,
    enroll: int = 20,
    api_key: str | None = None,
    report: Callable[[LoadResult], None] | None = None,
    processes: int = 0,
) -> list[LoadResult]:
    """Every (route, concurrency) in turn after a warm-up; `report(result)` is called as each ends.
    `processes`: load processes (0: a quarter of the cores, at most the concurrency)."""
    headers = {"X-API-Key": api_key} if api_key else {}
    if "identify" in routes and enroll:
        enroll_gallery(url, images, enroll, headers)
    offer(url, "/verify", route_requests(url, "/verify", images, headers), 2, 4, 1)  # warm-up
    results = []
    for route in routes:
        built = route_requests(url, f"/{route}", images, headers)
        for c in concurrency:
            results.append(offer(url, f"/{route}", built, c, requests, processes))
            if report:
                report(results[-1])
    return results
