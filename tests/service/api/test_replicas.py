"""Two `facegate serve` replicas on one PostgreSQL gallery (FACEGATE_DATABASE_URL) behave as one
service: what is enrolled through one is identified through the other; one new subject id from both
gives one 201 and one 409; after a delete's 204 no replica answers the subject; and when a replica
is killed with SIGKILL during a burst of enrollments, every acknowledged one is searchable on the
survivor and on the restarted replica. Real server processes on 127.0.0.1, the tests' embedder,
aligned crops; every wait is bounded."""

from __future__ import annotations

import sys
import threading
import time

import httpx
import pytest

from tests.service.api.test_server_process import REQUEST_TIMEOUT, Server, crop_b64, top_subject

pytestmark = pytest.mark.slow
PROPAGATION_TIMEOUT = 10.0  # propagation takes milliseconds; this only bounds a failing test


class Replica(Server):
    """`facegate serve` on a free port, its gallery in PostgreSQL."""

    def __init__(self, database_url: str, *args):
        super().__init__(*args)
        self.env["FACEGATE_DATABASE_URL"] = database_url

    def command(self) -> list[str]:
        # app() rather than main(): the service's command without loading training's
        return [sys.executable, "-c", "from service.cli import app; app()", "serve", "--host", "127.0.0.1", "--port", str(self.port)]


@pytest.fixture
def replicas(tmp_path, database_url, embedder_manifest, model_cache):
    started = []

    def make(name: str) -> Replica:
        replica = Replica(database_url, tmp_path / name, embedder_manifest, model_cache, tmp_path / f"{name}.log")
        started.append(replica)
        return replica.start()

    yield make
    for replica in started:
        replica.stop()


def replication(client: httpx.Client) -> dict:
    return client.get("/readyz").json()["gallery"]["replication"]


def wait_in_step(client: httpx.Client) -> dict:
    """The replica's /readyz once it has applied every committed change."""
    deadline = time.monotonic() + PROPAGATION_TIMEOUT
    while (status := replication(client))["lag"] != 0:
        assert time.monotonic() < deadline, status
        time.sleep(0.02)
    return status


def test_two_replicas_act_as_one_service(replicas):
    a, b = replicas("a"), replicas("b")
    with httpx.Client(base_url=a.url, timeout=REQUEST_TIMEOUT) as ca, httpx.Client(base_url=b.url, timeout=REQUEST_TIMEOUT) as cb:
        for i in range(3):
            assert ca.post("/subjects", json={"id": f"p{i}", "name": f"P{i}"}).status_code == 201
            assert ca.post(f"/subjects/p{i}/faces", json={"image": crop_b64(i), "aligned": True}).status_code == 201
            assert top_subject(ca, i)[0] == f"p{i}"  # the writer answers 201 only once it can find it
        wait_in_step(cb)
        for i in range(3):
            assert top_subject(cb, i)[0] == f"p{i}"
            assert cb.get(f"/subjects/p{i}/faces").json()["faces"][0]["face_id"] >= 1
        # one new id through both at once: one 201, one 409
        statuses = []
        barrier = threading.Barrier(2)

        def create(client: httpx.Client) -> None:
            barrier.wait()
            statuses.append(client.post("/subjects", json={"id": "twin", "name": "twin"}).status_code)

        threads = [threading.Thread(target=create, args=(c,)) for c in (ca, cb)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(REQUEST_TIMEOUT)
        assert sorted(statuses) == [201, 409]
        # a delete through b: no replica answers p0 from the 204 on
        assert cb.delete("/subjects/p0").status_code == 204
        for client in (ca, cb):
            assert "p0" not in top_subject(client, 0)[1]
        a_status, b_status = wait_in_step(ca), wait_in_step(cb)
        assert a_status["applied_sequence"] == b_status["applied_sequence"] == b_status["database_sequence"] == 4  # 3 enrollments, 1 delete
        assert a_status["listening"] and b_status["listening"]
        metrics = ca.get("/metrics").text
        assert (
            'facegate_gallery_sync_lag{collection="default"} 0.0' in metrics
            and 'facegate_gallery_applied_sequence{collection="default"} 4.0' in metrics
        )


def test_acknowledged_enrollments_survive_kill_9_of_a_replica(replicas):
    a, b = replicas("a"), replicas("b")
    acked: list[tuple[str, int]] = []  # (subject, seed) whose enrollment got its 201
    lock = threading.Lock()

    def client_loop(replica: Replica, worker: int) -> None:
        with httpx.Client(base_url=replica.url, timeout=REQUEST_TIMEOUT) as client:
            for i in range(30):
                seed, subject = 1000 * (worker + 1) + i, f"w{worker}-{i}"
                try:
                    if client.post("/subjects", json={"id": subject, "name": subject}).status_code != 201:
                        return
                    response = client.post(f"/subjects/{subject}/faces", json={"image": crop_b64(seed), "aligned": True})
                except httpx.TransportError:
                    return  # killed under this request: no acknowledgement
                if response.status_code != 201:
                    return
                with lock:
                    acked.append((subject, seed))

    # three writers through a (the one killed), one through b
    threads = [threading.Thread(target=client_loop, args=(a, w)) for w in range(3)] + [threading.Thread(target=client_loop, args=(b, 3))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 15 and time.monotonic() < deadline:
        time.sleep(0.01)
    a.kill()
    for t in threads:
        t.join(REQUEST_TIMEOUT + 5)
    through_a = [s for s, _ in acked if not s.startswith("w3-")]
    assert 0 < len(through_a) < 90, "the kill must land mid-way through a's enrollments"

    with httpx.Client(base_url=b.url, timeout=REQUEST_TIMEOUT) as cb:
        wait_in_step(cb)
        for subject, seed in acked:
            assert top_subject(cb, seed)[0] == subject, f"{subject} on the survivor"
    a.start()
    with httpx.Client(base_url=a.url, timeout=REQUEST_TIMEOUT) as ca:
        wait_in_step(ca)
        for subject, seed in acked:
            assert top_subject(ca, seed)[0] == subject, f"{subject} on the restarted replica"
