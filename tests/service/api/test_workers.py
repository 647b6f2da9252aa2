"""`facegate serve --workers N`, as a many-core host runs it: several HTTP worker processes on one
SQLite gallery, with the models in one model host process (the default) or in each worker. A
subject enrolled through any worker is found by every worker's next search, and deleted, by none;
a model host that dies is restarted and the workers go on through it; a worker killed is forked
again from the preloaded forkserver, its decoders gone with it; on PostgreSQL they share one
snapshot of the gallery's derived state as on SQLite. Every wait is bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO
from tests.polling import wait_until
from tests.requirements import need
from tests.service.api.test_server_process import REQUEST_TIMEOUT, Server, crop_b64, enroll

pytestmark = pytest.mark.slow
WORKERS = 3
# A sitecustomize for every process of a server: the first uvicorn worker to build its gallery's
# open-set roster (every build does) waits there until the file `release` appears beside it.
HOLD_ONE_WARM_UP = """
import importlib.abc
import importlib.util
import multiprocessing
import os
import sys
import time
from pathlib import Path

FOLDER = Path(os.environ["FACEGATE_TEST_HOLD"])


def held(run):
    def holding(*args, **kwargs):
        if multiprocessing.current_process().name.startswith("ForkServerProcess"):  # a uvicorn worker
            try:
                os.close(os.open(FOLDER / "held", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                while not (FOLDER / "release").exists():
                    time.sleep(0.05)
        return run(*args, **kwargs)

    return holding


class HoldOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "service.readiness":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.Readiness.warmup_done = held(module.Readiness.warmup_done)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, HoldOnImport())
"""

# A sitecustomize for every process of a server: what the snapshot's builder and mappers log goes to its log.
LOG_SNAPSHOTS = """
import logging

logging.getLogger("facegate.gallery.snapshot").setLevel(logging.INFO)
logging.getLogger("facegate.gallery.snapshot").addHandler(logging.StreamHandler())
"""


class WorkersServer(Server):
    def __init__(self, *args, model_host: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_host = model_host
        self.new_session = True

    def command(self) -> list[str]:
        host = "--model-host" if self.model_host else "--no-model-host"
        return [
            sys.executable,
            "-c",
            "from service.cli import main; main()",
            "serve",
            "--port",
            str(self.port),
            "--workers",
            str(WORKERS),
            host,
        ]

    def stop(self) -> None:
        """`facegate serve` stops its workers and its model host; whatever is left of the group goes too."""
        super().stop()
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)


@pytest.fixture
def workers_server(tmp_path, embedder_manifest, model_cache, request):
    server = WorkersServer(tmp_path / "gallery", embedder_manifest, model_cache, tmp_path / "server.log", model_host=request.param)
    server.start()
    yield server
    server.stop()


def ready_pid(client: httpx.Client) -> int:
    """The pid of the worker behind this connection, once that worker is ready (each warms up on its
    own without a model host)."""
    ready = wait_until(lambda: (r := client.get("/readyz")).status_code == 200 and r, "the worker is ready", timeout=120)
    return ready.json()["serving"]["pid"]


def one_client_per_worker(url: str) -> dict[int, httpx.Client]:
    """A keep-alive connection to each worker process (a connection stays with the worker that
    accepted it), told apart by the pid /readyz reports."""
    clients: dict[int, httpx.Client] = {}
    for _ in range(200):
        client = httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT, limits=httpx.Limits(max_connections=1))
        pid = ready_pid(client)
        if pid in clients:
            client.close()
        else:
            clients[pid] = client
        if len(clients) == WORKERS:
            return clients
    raise AssertionError(f"reached {len(clients)} of {WORKERS} workers in 200 connections")


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def assert_forked_from_preload(pids: list[int]) -> None:
    """Every worker is a child of one multiprocessing forkserver that imported the app before it
    forked them (service/runtime/preload.py), not a fresh interpreter started by `facegate serve`."""
    parents = {parent(pid) for pid in pids}
    assert len(parents) == 1, f"the workers {pids} have several parents: {parents}"
    command = Path(f"/proc/{parents.pop()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "multiprocessing.forkserver" in command and "service.api.app" in command, command


def candidates(client: httpx.Client, seed: int) -> list[str]:
    response = client.post("/identify", json={"image": crop_b64(seed), "aligned": True, "top_k": 100})
    assert response.status_code == 200, response.text
    return [c["subject_id"] for c in response.json()["candidates"]]


@pytest.mark.parametrize("workers_server", [True, False], ids=["model-host", "no-model-host"], indirect=True)
def test_every_worker_sees_every_enrollment_and_deletion(workers_server):
    by_pid = one_client_per_worker(workers_server.url)
    if sys.platform == "linux":
        assert_forked_from_preload(list(by_pid))
    clients = list(by_pid.values())
    try:
        for i, writer in enumerate(clients):  # enrolled through each worker in turn: found by all
            enroll(writer, f"s{i}", seed=i)
            for reader in clients:
                assert f"s{i}" in candidates(reader, i)
        for i, writer in enumerate(clients):  # deleted through another worker: found by none
            assert writer.delete(f"/subjects/s{(i + 1) % WORKERS}").status_code == 204
            for reader in clients:
                assert f"s{(i + 1) % WORKERS}" not in candidates(reader, (i + 1) % WORKERS)
        face = enroll(clients[0], "again", seed=99)
        assert all("again" in candidates(reader, 99) for reader in clients)
        assert clients[1].delete(f"/faces/{face}").status_code == 204  # one face, through another worker
        assert all("again" not in candidates(reader, 99) for reader in clients)
        assert all(reader.get("/readyz").json()["gallery"]["searchable_faces"] == 0 for reader in clients)
    finally:
        for client in clients:
            client.close()


@pytest.mark.parametrize("workers_server", [True], ids=["model-host"], indirect=True)
def test_a_killed_model_host_is_restarted_and_requests_go_on(workers_server):
    url = workers_server.url
    for ready in one_client_per_worker(url).values():  # every worker past its start-up (its decoders too), not only one
        ready.close()
    with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT) as client:
        enroll(client, "kept", seed=7)
        host = client.get("/readyz").json()["serving"]["model_host"]["pid"]
        os.kill(host, signal.SIGKILL)
        statuses = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            response = client.post("/identify", json={"image": crop_b64(7), "aligned": True})
            statuses.append(response.status_code)
            if response.status_code == 503:
                assert response.json()["error"]["code"] == "model_unavailable", response.text
                assert response.headers.get("retry-after") == "1", response.headers  # it will pass: the supervisor restarts the host
            elif response.status_code == 200 and statuses.count(200) >= 3:
                break
        assert set(statuses) <= {200, 503}, statuses  # never a 500 while the host is down
        assert statuses[-1] == 200 and "kept" in candidates(client, 7)
        assert client.get("/readyz").json()["serving"]["model_host"]["pid"] != host


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def served_tree(url: str) -> tuple[set[int], int, set[int]]:
    """The workers, their forkserver and every process it forked, once each worker has served an image
    (its decoder started): the workers, their decoders, the model host."""
    clients = one_client_per_worker(url)
    try:
        for client in clients.values():
            assert client.post("/identify", json={"image": crop_b64(3), "aligned": True}).status_code == 200
        forkserver = parent(next(iter(clients)))
    finally:
        for client in clients.values():
            client.close()
    return set(clients), forkserver, children(forkserver)


@pytest.mark.parametrize("workers_server", [True], ids=["model-host"], indirect=True)
def test_the_model_host_is_forked_from_the_workers_forkserver_and_the_tree_ends_with_serve(workers_server):
    """The model host comes from the preloaded forkserver (it shares the pages of what it imported with
    every worker instead of importing them again), named facegate-models; `facegate serve` killed
    outright, the forkserver and every process it forked end with it (runtime/lifeline.py: the workers
    went on serving as orphans)."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process tree from /proc")
    with httpx.Client(base_url=workers_server.url, timeout=REQUEST_TIMEOUT) as client:
        host = client.get("/readyz").json()["serving"]["model_host"]["pid"]
    _, forkserver, forked = served_tree(workers_server.url)
    assert host in forked, "the model host does not come from the workers' forkserver"
    assert Path(f"/proc/{host}/comm").read_text().strip() == "facegate-models"
    assert len(forked) >= 1 + 2 * WORKERS  # the host, each worker and its decoder
    assert workers_server.process is not None
    os.kill(workers_server.process.pid, signal.SIGKILL)
    tree = {forkserver} | forked
    wait_until(lambda: not any(running(pid) for pid in tree), "every process below facegate serve ended", timeout=30)


@pytest.mark.parametrize("workers_server", [True], ids=["model-host"], indirect=True)
def test_a_killed_forkserver_takes_its_processes_and_new_ones_serve(workers_server):
    """kill -9 of the workers' forkserver: multiprocessing then reads every worker and the host as
    exited, so uvicorn and the supervisor start others; the old ones end with the forkserver instead of
    serving on as orphans that nothing stops (runtime/lifeline.py), and the new ones serve."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process tree from /proc")
    _, forkserver, forked = served_tree(workers_server.url)
    os.kill(forkserver, signal.SIGKILL)
    wait_until(lambda: not any(running(pid) for pid in forked), "the forkserver's processes ended with it", timeout=30)

    def served_by_new_workers() -> bool:
        clients = one_client_per_worker(workers_server.url)
        try:
            return not set(clients) & forked and all(
                c.post("/identify", json={"image": crop_b64(3), "aligned": True}).status_code == 200 for c in clients.values()
            )
        finally:
            for client in clients.values():
                client.close()

    wait_until(served_by_new_workers, "new workers serve", timeout=120)


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def decoders_of(worker: int) -> set[int]:
    """The decoder processes of a worker: those named facegate-decode that map a shared buffer the
    worker maps (each decoder's memfd, by its inode)."""

    def buffers(pid: int) -> set[str]:
        with contextlib.suppress(OSError):
            return {line.split()[4] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "memfd:facegate-decode" in line}
        return set()

    mapped = buffers(worker)
    named = set()
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError):
            if comm.read_text().strip() == "facegate-decode":
                named.add(int(comm.parent.name))
    return {pid for pid in named if buffers(pid) & mapped}


@pytest.mark.parametrize("workers_server", [True], ids=["model-host"], indirect=True)
def test_decoders_are_forked_from_the_workers_forkserver(workers_server):
    """A worker's decoders come from the forkserver it came from (`preload.children_context`), which
    preloaded decoding with the app: no worker starts a forkserver of its own (17 MiB each)."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process tree from /proc")
    workers, forkserver, forked = served_tree(workers_server.url)
    for pid in workers:
        assert children(pid) == set(), f"worker {pid} started processes of its own: {children(pid)}"
        decoders = decoders_of(pid)
        assert decoders, f"worker {pid} has no decoder"
        assert decoders <= forked and parent(pid) == forkserver


@pytest.mark.parametrize("workers_server", [True], ids=["model-host"], indirect=True)
def test_a_killed_worker_is_forked_again_and_its_decoders_go(workers_server):
    """kill -9 of a worker forked from the preloaded forkserver: uvicorn starts another from the same
    forkserver, the dead one's decoder processes end with it, and every worker serves again."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process tree from /proc")
    url = workers_server.url
    clients = one_client_per_worker(url)
    for client in clients.values():
        assert client.post("/identify", json={"image": crop_b64(3), "aligned": True}).status_code == 200  # its decoder started
        client.close()
    victim = next(iter(clients))
    forkserver, below = parent(victim), decoders_of(victim)
    assert below, "the worker has no decoder processes"
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in below), "the killed worker's decoders ended", timeout=30)

    def replaced() -> dict[int, httpx.Client] | None:
        found = one_client_per_worker(url)
        if victim not in found:
            return found
        for client in found.values():
            client.close()
        return None

    again = wait_until(replaced, "a new worker replaced it", timeout=60)
    assert all(parent(pid) == forkserver for pid in again), "a replacement worker does not come from the preloaded forkserver"
    for client in again.values():
        assert client.post("/identify", json={"image": crop_b64(3), "aligned": True}).status_code == 200
        client.close()


@pytest.mark.parametrize("workers_server", [True], ids=["model-host"], indirect=True)
def test_serves_own_process_loads_no_model_or_gallery_library(workers_server):
    """`facegate serve` beside its workers and model host only supervises: it maps none of NumPy,
    OpenCV, FAISS or onnxruntime (its check of the stores' extras once imported them all, and the
    arenas' sweep NumPy: 70 MiB of private memory it never used), nor pydantic's core: once its
    command line is checked it goes on re-executed without the command line's Typer, Rich and
    settings (service/runtime/serving.py; 28.8 -> 16.3 MiB of its own pages). Its workers, whose models
    run in the host, map neither onnx nor onnxruntime, after a search either (their model loading
    imported both: 34 MiB a process)."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process's mappings from /proc")
    for pid, client in one_client_per_worker(workers_server.url).items():  # every worker ready: the parent's start-up is done
        assert client.post("/identify", json={"image": crop_b64(3), "aligned": True}).status_code == 200
        client.close()
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert sorted(name for name in ("onnx_cpp2py", "onnxruntime") if name in maps) == [], pid
    maps = Path(f"/proc/{workers_server.process.pid}/maps").read_text()
    assert sorted(name for name in ("_multiarray_umath", "_pydantic_core", "cv2", "libfaiss", "onnxruntime") if name in maps) == []
    command = Path(f"/proc/{workers_server.process.pid}/cmdline").read_bytes().split(b"\0")
    assert command[1] == b"-c" and b"service.runtime.serving" in command[2], command  # re-executed


def test_readyz_answers_for_every_worker(tmp_path, embedder_manifest, model_cache):
    """uvicorn's workers accept once their lifespan start-up returns, before their warm-up and their
    gallery's first build are done (the port answers meanwhile). One worker's warm-up is held here
    (not its gallery's build: the host's first build is shared, the others wait for it, snapshot.py):
    another worker, itself ready, answers /readyz 503 naming the workers still starting, and 200
    only once every one is ready; from then on every connection is answered, whichever worker took it."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOLD_ONE_WARM_UP)
    server = WorkersServer(tmp_path / "gallery", embedder_manifest, model_cache, tmp_path / "server.log", model_host=True)
    path = os.pathsep.join(p for p in (str(hooks), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    server.env |= {"PYTHONPATH": path, "FACEGATE_TEST_HOLD": str(hooks)}

    def past_its_own_start() -> httpx.Response | None:
        """A /readyz answer (a new connection each time) from a worker warmed up with its index built."""
        with contextlib.suppress(httpx.TransportError, ValueError):
            answer = httpx.get(f"{server.url}/readyz", timeout=REQUEST_TIMEOUT)
            if answer.json()["warmup"] == "done" and not answer.json()["gallery"]["loading"]:
                return answer
        return None

    server.launch()
    try:
        wait_until(lambda: (hooks / "held").exists(), "a worker's warm-up is held", timeout=120)
        answer = wait_until(past_its_own_start, "a worker past its own start-up answers /readyz", timeout=120)
        assert answer.status_code == 503, f"a worker answered ready for itself alone while another was starting: {answer.text}"
        assert [p["model"] for p in answer.json()["problems"]] == ["workers"], answer.text
        (hooks / "release").touch()
        wait_until(lambda: (r := past_its_own_start()) is not None and r.status_code == 200, "every worker ready", timeout=120)
        for _ in range(3 * WORKERS):  # new connections, each to whichever worker accepts it
            response = httpx.post(f"{server.url}/identify", json={"image": crop_b64(7), "aligned": True}, timeout=REQUEST_TIMEOUT)
            assert response.status_code == 200, response.text
    finally:
        (hooks / "release").touch()
        server.stop()


def test_postgres_workers_share_one_state_and_answer_alike(tmp_path, embedder_manifest, model_cache, database_url):
    """On PostgreSQL the host's workers share one snapshot too (gallery/snapshot.py, sync.py): built
    and saved by one, mapped by every one, each then following the database's change log. A write
    is read back by the worker that made it at once, and by every other within its propagation delay."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(LOG_SNAPSHOTS)
    server = WorkersServer(tmp_path / "gallery", embedder_manifest, model_cache, tmp_path / "server.log", model_host=True)
    path = os.pathsep.join(p for p in (str(hooks), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    server.env |= {"PYTHONPATH": path, "FACEGATE_DATABASE_URL": database_url}
    server.start()
    clients = list(one_client_per_worker(server.url).values())
    try:
        log = (tmp_path / "server.log").read_text()
        assert log.count("faces saved, as of change") == 1, log[-3000:]  # one build for the host, not one per worker
        assert log.count("faces mapped, as of change") == WORKERS, log[-3000:]
        for i, writer in enumerate(clients):
            enroll(writer, f"s{i}", seed=i)
            assert f"s{i}" in candidates(writer, i)  # read-your-writes
            for reader in clients:
                wait_until(lambda r=reader, i=i: f"s{i}" in candidates(r, i), "every worker finds it", timeout=10)
        assert clients[1].delete("/subjects/s0").status_code == 204
        assert "s0" not in candidates(clients[1], 0)
        for reader in clients:
            assert "s0" not in candidates(reader, 0)  # a deleted face is never answered: looked up in the database
            wait_until(lambda r=reader: r.get("/readyz").json()["gallery"]["searchable_faces"] == WORKERS - 1, "every index follows")
    finally:
        for client in clients:
            client.close()
        server.stop()
