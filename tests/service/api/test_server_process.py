"""The real server process (uvicorn + `service.api.app:create_app`, as `facegate serve` runs it) on a
free 127.0.0.1 port: acknowledged enrollments survive `kill -9`, a restart keeps the gallery, and
concurrent identify + enroll + delete stay consistent. Every loop and wait is bounded."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, aligned_crop_png

pytestmark = pytest.mark.slow
START_TIMEOUT = 60.0
REQUEST_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, data_dir: Path, embedder: Path | str, model_cache: Path, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "FACEGATE_DATA_DIR": str(data_dir),
            "FACEGATE_EMBEDDER": str(embedder),
            "FACEGATE_MODEL_CACHE": str(model_cache),
            "FACEGATE_DEVICE": "cpu",
            "FACEGATE_WORKER_THREADS": "2",
        }
        self.log = log
        self.process: subprocess.Popen | None = None
        self.new_session = False  # its own process group, signalled as one (a server of several processes)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "service.api.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(self.port)]

    def launch(self) -> None:
        """Started, not waited for."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=self.new_session
            )

    def start(self) -> Server:
        """Started, and ready."""
        self.launch()
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"server exited with {self.process.returncode}:\n{self.failure()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready in {START_TIMEOUT}s:\n{self.failure()}")

    def failure(self) -> str:
        """The log from its first error (its cause: a traceback's last lines are uvicorn's shutdown), and its end."""
        text = self.log.read_text()
        first = text.find("ERROR")
        cause = text[first : first + 4000] if first >= 0 else ""
        return f"{cause}\n[...]\n{text[-2000:]}" if cause else text[-3000:]

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def server_factory(tmp_path, embedder_manifest, model_cache):
    servers = []

    def make() -> Server:
        server = Server(tmp_path / "gallery", embedder_manifest, model_cache, tmp_path / "server.log")
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.kill()


def crop_b64(seed: int) -> str:
    return base64.b64encode(aligned_crop_png(seed)).decode()


def enroll(client: httpx.Client, subject: str, seed: int) -> int:
    assert client.post("/subjects", json={"id": subject, "name": subject}).status_code == 201
    response = client.post(f"/subjects/{subject}/faces", json={"image": crop_b64(seed), "aligned": True})
    assert response.status_code == 201, response.text
    return response.json()["face_id"]


def top_subject(client: httpx.Client, seed: int) -> tuple[str | None, list[str]]:
    response = client.post("/identify", json={"image": crop_b64(seed), "aligned": True, "top_k": 100})
    assert response.status_code == 200, response.text
    body = response.json()
    return (body["match"] or {}).get("subject_id"), [c["subject_id"] for c in body["candidates"]]


def test_acknowledged_enrollments_survive_kill_9(server_factory):
    server = server_factory()
    acked: list[tuple[str, int, int]] = []  # (subject, face_id, seed) that got a 2xx
    lock = threading.Lock()

    def client_loop(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
            for i in range(40):
                seed = 1000 * (worker + 1) + i
                subject = f"w{worker}-{i}"
                try:
                    if client.post("/subjects", json={"id": subject, "name": subject}).status_code != 201:
                        return
                    response = client.post(f"/subjects/{subject}/faces", json={"image": crop_b64(seed), "aligned": True})
                except httpx.TransportError:
                    return  # the server was killed under this request: no acknowledgement
                if response.status_code != 201:
                    return
                with lock:
                    acked.append((subject, response.json()["face_id"], seed))

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 12 and time.monotonic() < deadline:
        time.sleep(0.02)
    server.kill()  # mid-way: the clients still have requests in flight
    for t in threads:
        t.join(REQUEST_TIMEOUT + 5)
    assert len(acked) >= 12 and len(acked) < 160, "the kill must land mid-way"

    server.start()
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
        for subject, face_id, seed in acked:
            faces = client.get(f"/subjects/{subject}/faces")
            assert faces.status_code == 200 and face_id in [f["face_id"] for f in faces.json()["faces"]]
            assert top_subject(client, seed)[0] == subject


def test_restart_preserves_the_gallery(server_factory):
    server = server_factory()
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
        faces = {f"s{i}": enroll(client, f"s{i}", i) for i in range(5)}
        client.patch("/subjects/s0", json={"metadata": {"badge": 7}})
        before = client.get("/subjects").json()
    server.stop()
    server.start()
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
        assert client.get("/subjects").json() == before
        for i, (subject, face_id) in enumerate(faces.items()):
            assert [f["face_id"] for f in client.get(f"/subjects/{subject}/faces").json()["faces"]] == [face_id]
            assert top_subject(client, i)[0] == subject
        assert client.get("/readyz").json()["gallery"]["searchable_faces"] == 5


def test_concurrent_identify_enroll_delete_stay_consistent(server_factory):
    server = server_factory()
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
        for i in range(10):
            enroll(client, f"base{i}", i)
    statuses: list[tuple[str, int]] = []
    failures: list[str] = []
    lock = threading.Lock()

    def record(kind: str, status: int) -> None:
        with lock:
            statuses.append((kind, status))

    def enroller(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
            for i in range(6):
                subject = f"new{worker}-{i}"
                record("subject", client.post("/subjects", json={"id": subject, "name": subject}).status_code)
                r = client.post(f"/subjects/{subject}/faces", json={"image": crop_b64(500 + 10 * worker + i), "aligned": True})
                record("enroll", r.status_code)

    def deleter() -> None:
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
            for i in range(5):
                record("delete", client.delete(f"/subjects/base{i}").status_code)
                subject, candidates = top_subject(client, i)  # acknowledged delete: never found again
                if f"base{i}" in candidates:
                    with lock:
                        failures.append(f"deleted base{i} still identified")

    def identifier(worker: int) -> None:
        with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
            for i in range(8):
                seed = 5 + (worker + i) % 5  # subjects base5..base9 are never deleted
                subject, _ = top_subject(client, seed)
                record("identify", 200)
                if subject != f"base{seed}":
                    with lock:
                        failures.append(f"identify base{seed} gave {subject}")

    threads = [threading.Thread(target=enroller, args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=deleter)] + [threading.Thread(target=identifier, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert all(status in (200, 201, 204) for _, status in statuses), statuses
    assert len(statuses) == 2 * 12 + 5 + 16
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT) as client:
        gallery = client.get("/readyz").json()["gallery"]
        assert gallery["subjects"] == 10 - 5 + 12 and gallery["faces"] == gallery["searchable_faces"] == 17
        for i in range(5):
            assert client.get(f"/subjects/base{i}").status_code == 404
        for worker in range(2):
            for i in range(6):
                assert top_subject(client, 500 + 10 * worker + i)[0] == f"new{worker}-{i}"
