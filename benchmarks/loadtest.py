"""HTTP load for /verify and /identify: req/s and latency p50/p95/p99 at several concurrencies,
offered by `benchmarks.loadgen` against a running server or one started here (`spawned`: one
uvicorn process, or `facegate serve --workers N`). Used by `facegate bench all`, `facegate bench
load` and `benchmarks/load.py`. httpx (the dev extra) only enrolls the gallery and polls readiness."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.loadgen import LoadResult, offer, route_requests
from service.core.models.manifest import EmbedderKey

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Serving:
    """How a spawned server runs: one uvicorn process, or `facegate serve --workers N` with or
    without its model host."""

    workers: int = 1
    model_host: bool = True

    def __str__(self) -> str:
        if self.workers == 1:
            return "1 process"
        return f"{self.workers} workers" + (" + model host" if self.model_host else ", models in each")


@contextmanager
def spawned(env: dict[str, str], ready_timeout: float = 300.0, serving: Serving = Serving(), prepare=None):
    """A server of this checkout on a free 127.0.0.1 port with a fresh gallery (`prepare(data_dir)`
    fills it first, if given) and `env` on top of this process's environment. Yields its URL once
    /readyz answers 200, then stops it."""
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="facegate-load-")
    if prepare is not None:
        prepare(Path(data_dir))
    env = {**os.environ, "FACEGATE_DATA_DIR": data_dir, **env}
    if serving.workers > 1:
        command = [sys.executable, "-c", "from service.cli import main; main()", "serve", "--port", str(port)]
        command += ["--workers", str(serving.workers), "--model-host" if serving.model_host else "--no-model-host"]
    else:
        command = [sys.executable, "-m", "uvicorn", "service.api.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--log-level", "warning"]
    log = open(Path(data_dir) / "server.log", "wb")  # noqa: SIM115  (closed below; a request's line each would drown the figures)
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
            raise RuntimeError(f"the server did not become ready: {(Path(data_dir) / 'server.log').read_text()[-3000:]}")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        with suppress(ProcessLookupError):  # stopped as a group: its workers and model host too
            os.killpg(process.pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


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
    seconds: float = 0,
) -> list[LoadResult]:
    """Every (route, concurrency) in turn after a warm-up, `requests` each (or for `seconds` each);
    `report(result)` is called as each ends. `processes`: load processes (0: a quarter of the cores,
    at most the concurrency)."""
    headers = {"X-API-Key": api_key} if api_key else {}
    if "identify" in routes and enroll:
        enroll_gallery(url, images, enroll, headers)
    offer(url, "/verify", route_requests(url, "/verify", images, headers), 2, 4, 1)  # warm-up
    results = []
    for route in routes:
        built = route_requests(url, f"/{route}", images, headers)
        for c in concurrency:
            results.append(offer(url, f"/{route}", built, c, 0 if seconds else requests, processes, seconds))
            if report:
                report(results[-1])
    return results


def synthetic_faces(embedder: EmbedderKey, faces: int, seed: int = 0) -> np.ndarray:
    """`faces` random unit vectors of the embedder's size: a large gallery's faces, one subject each."""
    vectors = np.random.default_rng(seed).standard_normal((faces, embedder.dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def fill_gallery(data_dir: Path, embedder: EmbedderKey, faces: int, seed: int = 0) -> None:
    """`faces` random unit vectors of the embedder, one subject each, written in one transaction:
    a large gallery for /identify to search, without enrolling it photo by photo."""
    from service.gallery.sqlite import SqliteGallery, embedding_blob

    SqliteGallery.open(data_dir, embedder, searchable=False).close()  # the schema, migrated
    vectors = synthetic_faces(embedder, faces, seed)
    db = sqlite3.connect(data_dir / "gallery.sqlite3")
    with db:
        db.executemany(
            "INSERT INTO subjects (collection, id, name, metadata, created, updated) VALUES ('default', ?, ?, '{}', 0, 0)",
            ((f"fill-{i}", f"fill {i}") for i in range(faces)),
        )
        db.executemany(
            "INSERT INTO faces (collection, subject_id, embedding, model_name, model_sha256, created) VALUES ('default', ?, ?, ?, ?, 0)",
            ((f"fill-{i}", embedding_blob(v), embedder.name, embedder.sha256) for i, v in enumerate(vectors)),
        )
    db.close()


def fill_postgres(url: str, embedder: EmbedderKey, faces: int, seed: int = 0) -> None:
    """As `fill_gallery`, into the PostgreSQL database `url` names (COPY, one transaction)."""
    import psycopg

    from service.gallery.postgres import PostgresGallery
    from service.gallery.sqlite import embedding_blob

    PostgresGallery(url, embedder, searchable=False).close()  # the schema, migrated
    vectors = synthetic_faces(embedder, faces, seed)
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy("COPY subjects (collection, id, name, metadata, created, updated) FROM STDIN") as copy:
            for i in range(faces):
                copy.write_row(("default", f"fill-{i}", f"fill {i}", "{}", 0, 0))
        with cursor.copy("COPY faces (collection, subject_id, embedding, model_name, model_sha256, created) FROM STDIN") as copy:
            for i, v in enumerate(vectors):
                copy.write_row(("default", f"fill-{i}", embedding_blob(v), embedder.name, embedder.sha256, 0))


def load_rows(
    settings_env: dict[str, str],
    images: list[bytes],
    servings: list[Serving],
    routes: list[str],
    concurrency: list[int],
    requests: int,
    processes: int = 0,
    prepare=None,
    report: Callable[[Serving, LoadResult], None] | None = None,
    seconds: float = 0,
) -> list[tuple[Serving, LoadResult]]:
    """The load matrix against a server spawned for each way of serving, in turn."""
    rows = []
    for serving in servings:
        with spawned(settings_env, serving=serving, prepare=prepare) as url:
            for result in matrix(url, images, routes, concurrency, requests, processes=processes, seconds=seconds):
                rows.append((serving, result))
                if report:
                    report(serving, result)
    return rows
