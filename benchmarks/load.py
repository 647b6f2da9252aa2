"""HTTP load for /verify and /identify: req/s and latency p50/p95/p99 at several concurrencies.

Either against a running server (`--url`), or `--spawn`: start the server itself on a free
127.0.0.1 port once per batching mode (FACEGATE_BATCHING=true/false), enroll a small gallery for
/identify, run the matrix, stop it. Images are LFW photos (FACEGATE_TEST_DATA) or `--images`.

    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models \\
        .venv/bin/python benchmarks/load.py --spawn --embedder models/facegate-default.json
    .venv/bin/python benchmarks/load.py --url http://127.0.0.1:8000 --concurrency 8 --requests 400

Without `--embedder` and with no default model, `--spawn` builds the tests' tiny embedder: the
figures then measure decode + detection + the HTTP stack, not a real recognition network.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent


def load_images(folder: Path | None, count: int) -> list[bytes]:
    if folder is None:
        data = os.environ.get("FACEGATE_TEST_DATA")
        if not data:
            sys.exit("give --images DIR or set FACEGATE_TEST_DATA")
        folder = Path(data) / "lfw"
    paths = sorted(folder.rglob("*.jpg"))[:count]
    if not paths:
        sys.exit(f"no .jpg images under {folder}")
    return [p.read_bytes() for p in paths]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def spawned(batching: bool, embedder: str, extra_env: dict[str, str]):
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="facegate-load-")
    env = {**os.environ, "FACEGATE_DATA_DIR": data_dir, "FACEGATE_EMBEDDER": embedder, "FACEGATE_BATCHING": str(batching).lower(), **extra_env}
    command = [sys.executable, "-m", "uvicorn", "service.api.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            sys.exit("the server did not become ready")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


async def enroll_gallery(client: httpx.AsyncClient, images: list[bytes], subjects: int) -> None:
    for i, image in enumerate(images[:subjects]):
        await client.post("/subjects", json={"id": f"load-{i}", "name": f"load {i}"})
        await client.post(f"/subjects/load-{i}/faces", files={"image": image})


async def run(client: httpx.AsyncClient, route: str, images: list[bytes], concurrency: int, requests: int) -> dict:
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
    return {"rps": requests / wall, "p50": p50, "p95": p95, "p99": p99, "statuses": statuses}


async def matrix(url: str, args, images: list[bytes], label: str) -> None:
    headers = {"X-API-Key": args.api_key} if args.api_key else {}
    limits = httpx.Limits(max_connections=max(args.concurrency))
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        if "identify" in args.routes and args.enroll:
            await enroll_gallery(client, images, args.enroll)
        await run(client, "/verify", images, 2, 4)  # warm-up
        for route in args.routes:
            for concurrency in args.concurrency:
                r = await run(client, f"/{route}", images, concurrency, args.requests)
                statuses = ",".join(f"{k}:{v}" for k, v in sorted(r["statuses"].items()))
                print(f"{label:>9} {route:>9} {concurrency:>5} {r['rps']:>8.1f} {r['p50']:>8.1f} {r['p95']:>8.1f} {r['p99']:>8.1f}  {statuses}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="A running server.")
    target.add_argument("--spawn", action="store_true", help="Start a server per batching mode.")
    parser.add_argument("--routes", nargs="+", choices=["verify", "identify"], default=["verify", "identify"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=200, help="Requests per (route, concurrency).")
    parser.add_argument("--batching", nargs="+", choices=["on", "off"], default=["on", "off"], help="With --spawn: modes to run.")
    parser.add_argument("--embedder", help="With --spawn: FACEGATE_EMBEDDER (default: the environment's, else the tests' tiny embedder).")
    parser.add_argument("--images", type=Path, help="Folder of .jpg photos (default FACEGATE_TEST_DATA/lfw).")
    parser.add_argument("--enroll", type=int, default=20, help="Subjects to enroll before /identify (0: use the gallery as is).")
    parser.add_argument("--api-key", default=os.environ.get("FACEGATE_LOAD_API_KEY"))
    args = parser.parse_args()
    images = load_images(args.images, 64)
    print(f"{'batching':>9} {'route':>9} {'conc':>5} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  statuses")
    if args.url:
        asyncio.run(matrix(args.url, args, images, "server"))
        return
    embedder = args.embedder or os.environ.get("FACEGATE_EMBEDDER")
    if not embedder and not (REPO / "models" / "facegate-default.json").is_file():
        sys.path.insert(0, str(REPO))
        from tests.onnx_models import write_test_embedder

        embedder = str(write_test_embedder(Path(tempfile.mkdtemp(prefix="facegate-embedder-"))))
        print(f"# no default embedder: using the tests' tiny embedder {embedder}", flush=True)
    for mode in args.batching:
        with spawned(mode == "on", embedder or "facegate-default", {}) as url:
            asyncio.run(matrix(url, args, images, mode))


if __name__ == "__main__":
    main()
