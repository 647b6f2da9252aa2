"""Replicas on one PostgreSQL gallery (FACEGATE_DATABASE_URL): cold start, propagation, throughput.

1. Cold start: faces bulk-loaded with COPY (synthetic unit vectors), then the time a replica's
   gallery takes to open (migrations checked, every face read from one snapshot into the FAISS
   index, the listener started) and the memory it grew by, per gallery size and dimension.
2. Propagation: two `facegate serve` replicas; enroll on A, then ask B's /identify until it finds
   the face: p50/p99 of the delay from A's 201 (it includes one /identify round trip on B).
3. Identify throughput (req/s) through one replica, then spread over two.

Parts 2 and 3 use the tests' tiny ONNX embedder on aligned crops (so the figures are the gallery's
and the HTTP stack's, not a recognition network's) and need the detector for readiness
(FACEGATE_MODEL_CACHE). Without --database-url a throw-away PostgreSQL server is started from
Debian's binaries (tests/postgres.py).

    FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/replicas.py
    .venv/bin/python benchmarks/replicas.py --cold-sizes 100000 1000000 --skip-http
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import numpy as np
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.loadtest import spawned  # noqa: E402
from benchmarks.search import rss_mib  # noqa: E402
from service.core.models.manifest import EmbedderKey  # noqa: E402
from service.gallery.postgres import PostgresGallery, migrate  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402

FACES_PER_SUBJECT = 10


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    memory = next(int(line.split()[1]) // 2**20 for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    with psycopg.connect(ARGS.url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory} GiB RAM, load {os.getloadavg()[0]:.1f}; "
        f"PostgreSQL {server}, psycopg {psycopg.__version__}"
    )


@contextmanager
def database(url: str | None):
    """The URL given, or a throw-away server's."""
    if url:
        yield url
        return
    root = Path(tempfile.mkdtemp(prefix="facegate-bench-pg-"))
    server = PostgresServer(root)
    try:
        yield server.start().url()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def bulk_load(url: str, key: EmbedderKey, faces: int) -> tuple[float, float]:
    """COPY `faces` synthetic faces (10 per subject) into a migrated database: seconds taken, and
    the faces table's size on disk (MiB, with its indexes and TOAST)."""
    rng = np.random.default_rng(faces)
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        migrate(conn)
        with conn.cursor() as cursor:
            with cursor.copy("COPY subjects (id, name, metadata, created, updated) FROM STDIN") as copy:
                for s in range(faces // FACES_PER_SUBJECT):
                    copy.write_row((f"s{s}", f"subject {s}", "{}", 0.0, 0.0))
            chunk = 100_000
            with cursor.copy("COPY faces (subject_id, embedding, model_name, model_sha256, created) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["text", "bytea", "text", "text", "float8"])
                for start in range(0, faces, chunk):
                    n = min(chunk, faces - start)
                    x = rng.standard_normal((n, key.dim), dtype=np.float32)
                    x /= np.linalg.norm(x, axis=1, keepdims=True)
                    blobs = x.astype("<f4")
                    for i in range(n):
                        copy.write_row((f"s{(start + i) // FACES_PER_SUBJECT}", blobs[i].tobytes(), key.name, key.sha256, 0.0))
        conn.execute("ANALYZE faces")
        conn.commit()
        table = conn.execute("SELECT pg_total_relation_size('faces')").fetchone()[0] / 2**20
    return time.perf_counter() - started, table


def cold_start(admin_url: str, sizes: list[int], dims: list[int]) -> None:
    print("\n1. cold start of a replica's gallery (open: migrations checked, snapshot read into FAISS, listener started)")
    print(f"{'faces':>9} {'dim':>4} {'COPY s':>7} {'table MiB':>10} {'open s':>7} {'faces/s':>9} {'RSS +MiB':>9} {'index MiB':>10}")
    for dim in dims:
        for size in sizes:
            key = EmbedderKey("bench", f"{dim:064d}", dim)
            url = fresh_database(admin_url, f"bench_cold_{size}_{dim}")
            copied, table = bulk_load(url, key, size)
            before = rss_mib()
            started = time.perf_counter()
            gallery = PostgresGallery(url, key)
            opened = time.perf_counter() - started
            grown = rss_mib() - before
            assert gallery.index.size == size, gallery.index.size
            gallery.close()
            del gallery
            print(
                f"{size:>9} {dim:>4} {copied:>7.1f} {table:>10.0f} {opened:>7.1f} {size / opened:>9.0f} {grown:>9.0f} "
                f"{size * (dim * 4 + 8) / 2**20:>10.0f}"
            )


def replica(url: str, embedder: Path):
    """A `facegate` server of this checkout on the shared database (no keys: loopback only)."""
    return spawned({"FACEGATE_DATABASE_URL": url, "FACEGATE_EMBEDDER": str(embedder), "FACEGATE_DEVICE": "cpu", "FACEGATE_API_KEYS": ""})


def crop(seed: int) -> str:
    from tests.conftest import aligned_crop_png

    return base64.b64encode(aligned_crop_png(seed)).decode()


def propagation(a: str, b: str, count: int) -> None:
    delays = []
    with httpx.Client(base_url=a, timeout=30) as ca, httpx.Client(base_url=b, timeout=30) as cb:
        for i in range(count):
            subject, image = f"p{i}", crop(10_000 + i)
            ca.post("/subjects", json={"id": subject, "name": subject}).raise_for_status()
            ca.post(f"/subjects/{subject}/faces", json={"image": image, "aligned": True}).raise_for_status()
            acknowledged = time.perf_counter()
            while True:
                found = cb.post("/identify", json={"image": image, "aligned": True, "top_k": 1}).json()
                if (found["match"] or {}).get("subject_id") == subject:
                    break
                if time.perf_counter() - acknowledged > 10:
                    sys.exit(f"{subject} never reached B")
            delays.append((time.perf_counter() - acknowledged) * 1000)
    p50, p99 = np.percentile(delays, [50, 99])
    print(
        f"\n2. propagation, enroll on A → found by /identify on B: {count} enrollments, "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(delays):.1f} ms"
    )


async def throughput(urls: list[str], requests: int, concurrency: int, images: list[str]) -> float:
    clients = [httpx.AsyncClient(base_url=u, timeout=60) for u in urls]
    counter = iter(range(requests))

    async def worker() -> None:
        for n in counter:
            response = await clients[n % len(clients)].post(
                "/identify", json={"image": images[n % len(images)], "aligned": True, "top_k": 5}
            )
            response.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    for client in clients:
        await client.aclose()
    return requests / elapsed


def http_parts(admin_url: str, args) -> None:
    from tests.onnx_models import write_test_embedder

    if not os.environ.get("FACEGATE_MODEL_CACHE"):
        sys.exit("set FACEGATE_MODEL_CACHE (the detector, for readiness) or pass --skip-http")
    url = fresh_database(admin_url, "bench_http")
    work = Path(tempfile.mkdtemp(prefix="facegate-bench-"))
    embedder = write_test_embedder(work / "embedder")
    with ExitStack() as stack:
        a = stack.enter_context(replica(url, embedder))
        b = stack.enter_context(replica(url, embedder))
        propagation(a, b, args.enrollments)
        images = [crop(10_000 + i) for i in range(min(args.enrollments, 50))]
        print(f"\n3. /identify throughput, concurrency {args.concurrency}, {args.requests} requests, gallery of {args.enrollments} faces")
        for label, urls in (("1 replica ", [a]), ("2 replicas", [a, b])):
            asyncio.run(throughput(urls, 20, args.concurrency, images))  # warm-up
            rate = asyncio.run(throughput(urls, args.requests, args.concurrency, images))
            print(f"   {label}: {rate:.0f} req/s")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", help="An existing server's admin URL (databases bench_* are created there); default: a throw-away server."
    )
    parser.add_argument("--cold-sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--dims", type=int, nargs="+", default=[128])
    parser.add_argument("--enrollments", type=int, default=200, help="Propagation samples (and the throughput gallery).")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--skip-http", action="store_true", help="Cold start only (no detector needed).")
    ARGS = parser.parse_args()
    with database(ARGS.database_url) as admin_url:
        ARGS.url = admin_url
        print(machine())
        if ARGS.cold_sizes:
            cold_start(admin_url, ARGS.cold_sizes, ARGS.dims)
        if not ARGS.skip_http:
            http_parts(admin_url, ARGS)


if __name__ == "__main__":
    main()
