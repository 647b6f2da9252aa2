"""The compatibility layer's overhead (issue 24's target: ≤ 5 %): the same photo recognized through
CompreFace's POST /api/v1/recognition/recognize and through facegate's own POST /identify, on one
server with the same small gallery. Requests are sequential and alternate between the two routes
(so drift in the machine's load falls on both); prints p50/p99/mean per route, the overhead, and
the machine.

    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models \\
        PYTHONPATH=. .venv/bin/python benchmarks/compat_latency.py [--requests 200] [--url URL --key K]

Without --url it starts a server of this checkout (benchmarks.loadtest.spawned) on a fresh gallery.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from pathlib import Path

import httpx

from benchmarks.loadtest import spawned

ROUTES = {
    "/identify (native)": ("/identify", "image", {"top_k": "1"}),
    "/api/v1/recognition/recognize": ("/api/v1/recognition/recognize", "file", {}),
}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    return (
        f"{platform.node()}: {cpu} ({platform.machine()}), {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}"
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(url: str, key: str | None, lfw: Path, subjects: int, requests: int) -> None:
    people = [d for d in sorted(lfw.iterdir()) if len(list(d.glob("*.jpg"))) >= 2][:subjects]
    headers = {"X-API-Key": key} if key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for person in people:  # the gallery: each person's first photo
            client.post("/subjects", json={"id": person.name, "name": person.name}).raise_for_status()
            client.post(f"/subjects/{person.name}/faces", files={"image": sorted(person.glob("*.jpg"))[0].read_bytes()}).raise_for_status()
        photo = sorted(people[0].glob("*.jpg"))[1].read_bytes()  # the first person's second photo

        def timed(name: str) -> float:
            path, field, data = ROUTES[name]
            start = time.perf_counter()
            client.post(path, files={field: photo}, data=data).raise_for_status()
            return (time.perf_counter() - start) * 1000

        for name in ROUTES:  # warm-up
            for _ in range(10):
                timed(name)
        times: dict[str, list[float]] = {name: [] for name in ROUTES}
        for i in range(requests):
            for name in ROUTES if i % 2 else reversed(ROUTES):
                times[name].append(timed(name))

    print(machine())
    print(f"{url}: {len(people)} subjects enrolled, {requests} sequential requests per route, one {len(photo) // 1024} KB LFW photo")
    print(f"{'route':<32} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, values in times.items():
        print(f"{name:<32} {statistics.median(values):8.1f} {percentile(values, 0.99):8.1f} {statistics.fmean(values):8.1f}")
    native, compat = times.values()
    for label, stat in (("p50", statistics.median), ("mean", statistics.fmean)):
        print(f"overhead at {label}: {(stat(compat) / stat(native) - 1) * 100:+.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one of this checkout)")
    parser.add_argument("--key", help="its API key, if it has keys")
    parser.add_argument("--lfw", type=Path, default=Path(os.environ.get("FACEGATE_TEST_DATA", "../shared/data")) / "lfw")
    parser.add_argument("--subjects", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    with contextlib.nullcontext(args.url) if args.url else spawned({}) as url:
        run(url, args.key, args.lfw, args.subjects, args.requests)


if __name__ == "__main__":
    main()
