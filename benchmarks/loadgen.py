"""A load generator that can offer thousands of requests per second to one server: several
processes, each an asyncio loop (uvloop where installed) over raw keep-alive HTTP/1.1 connections
that send requests built once, byte for byte. A Python HTTP client (httpx) tops out near 100
requests/s a process, below what a GPU host serves, so its figures would measure the client.

Latency is from a request's first byte sent to its response's last byte read; the rate is the
requests answered over the wall time from the first send to the last answer of any process.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import queue
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np


@dataclass(frozen=True)
class LoadResult:
    route: str
    concurrency: int
    rps: float
    p50: float
    p95: float
    p99: float
    statuses: dict[int, int]
    processes: int = 1

    def status_text(self) -> str:
        """`200:400` and the like; status 0 counts requests that got no HTTP answer (a connection error)."""
        return ",".join(f"{k}:{v}" for k, v in sorted(self.statuses.items()))


def multipart_request(url: str, path: str, files: dict[str, bytes], headers: dict[str, str] | None = None) -> bytes:
    """A whole POST with a multipart/form-data body, as bytes on the wire."""
    boundary = uuid.uuid4().hex
    body = (
        b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{name}.jpg"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n".encode()
            + data
            + b"\r\n"
            for name, data in files.items()
        )
        + f"--{boundary}--\r\n".encode()
    )
    host = urlsplit(url).netloc
    head = {
        "Host": host,
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "Content-Length": str(len(body)),
        **(headers or {}),
    }
    return f"POST {path} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n" + body


def route_requests(url: str, route: str, images: list[bytes], headers: dict[str, str] | None = None) -> list[bytes]:
    """One request per image for `route`: /verify sends it with the next image, others send it
    alone; /healthz is a bare GET (what the generator itself can offer)."""
    if route == "/healthz":
        head = {"Host": urlsplit(url).netloc, **(headers or {})}
        return [f"GET {route} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n"]
    if route == "/verify":
        files = [{"image1": image, "image2": images[(i + 1) % len(images)]} for i, image in enumerate(images)]
    else:
        files = [{"image": image} for image in images]
    return [multipart_request(url, route, f, headers) for f in files]


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response: (status, whether the server closes the connection after it)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if fields.get("transfer-encoding", "").lower() == "chunked":
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
    else:
        await reader.readexactly(int(fields.get("content-length", "0")))
    return status, fields.get("connection", "").lower() == "close"


async def _client(host: str, port: int, requests: list[bytes], turns, until: float, latencies: list[float], statuses: Counter) -> None:
    """One connection sending request after request (until `turns` runs out or the clock reaches
    `until`), reconnecting when the server closes it."""
    reader = writer = None
    for turn in turns:
        if time.perf_counter() >= until:
            break
        started = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(requests[turn % len(requests)])
            status, close = await _answer(reader)  # type: ignore[arg-type]
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            status, close = 0, True
        latencies.append(time.perf_counter() - started)
        statuses[status] += 1
        if close and writer is not None:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


def _worker(url: str, requests: list[bytes], connections: int, count: int | None, seconds: float, offset: int, start, out) -> None:
    """A process: `connections` clients sharing `count` requests (None: as many as `seconds` allow);
    its latencies and statuses to `out`."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    parts = urlsplit(url)
    latencies: list[float] = []
    statuses: Counter = Counter()

    async def main() -> tuple[float, float]:
        turns = iter(range(offset, offset + count) if count is not None else itertools.count(offset))  # each client takes the next
        start.wait(timeout=120)  # every process imported and ready: they start together
        began = time.perf_counter()
        until = began + seconds if count is None else math.inf
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        await asyncio.gather(*(_client(host, port, requests, turns, until, latencies, statuses) for _ in range(connections)))
        return began, time.perf_counter()

    began, ended = asyncio.run(main())
    out.put((np.array(latencies), dict(statuses), began, ended))


def offer(
    url: str, route: str, requests: list[bytes], concurrency: int, total: int = 0, processes: int = 0, seconds: float = 0
) -> LoadResult:
    """`total` requests (or as many as `seconds` allow) to `url` from `concurrency` connections spread
    over `processes` processes (0: a quarter of this machine's cores, at least one, at most the concurrency)."""
    if bool(total) == bool(seconds):
        raise ValueError("give either a number of requests or a number of seconds")
    processes = max(1, min(processes or (os.cpu_count() or 1) // 4, concurrency, total or concurrency))
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    start, out = ctx.Barrier(processes), ctx.Queue()
    share = [total // processes + (i < total % processes) if total else None for i in range(processes)]
    conns = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    workers = [
        ctx.Process(
            target=_worker, args=(url, requests, conns[i], share[i], seconds, i * len(requests) // processes, start, out), daemon=True
        )
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    parts = []
    while len(parts) < len(workers):
        try:
            parts.append(out.get(timeout=1))
        except queue.Empty:
            if dead := [w.exitcode for w in workers if w.exitcode not in (None, 0)]:
                raise RuntimeError(f"a load process failed (exit codes {dead})") from None
    for w in workers:
        w.join()
    latencies = np.concatenate([p[0] for p in parts]) * 1000
    statuses: Counter = Counter()
    for p in parts:
        statuses.update(p[1])
    wall = max(p[3] for p in parts) - min(p[2] for p in parts)
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    return LoadResult(route, concurrency, len(latencies) / wall, p50, p95, p99, dict(statuses), processes)
