"""Start-up of `facegate serve --workers N` on a large SQLite or PostgreSQL gallery (issue 44): the time until
/readyz first answers 200 (a worker answers 200 only once all N are ready), and the memory of the whole process tree then, as the sum of
each process's PSS (/proc/PID/smaps_rollup: a page shared by k processes counts 1/k there, where
RSS would count it k times). With the host's snapshot (service/gallery/snapshot.py) the guard and a
flat index's faces are built once and mapped by every worker: the PSS of the mapped snapshot files
summed over the tree is what the host pays for them, once.

The gallery: `--faces` synthetic unit vectors (128-d, one subject each, the open-set guard on) made
by the tests' small ONNX embedder (`--embedder NAME`: a shipped one's, e.g. the default model),
inserted straight into SQLite; once every worker is ready, one `/identify` through each (its index
and guard in use, as when serving), then the memory at rest (each process's idle trim run,
`heap.IdleTrim`, FACEGATE_IDLE_TRIM_SECONDS after the last request: 30 unless set). `--checkout DIR`
runs the server of another source tree (e.g. `git archive` of the commit before) on the same
gallery, for a paired comparison on the same machine. The server starts through the `facegate`
script, as the image's does. `--store postgres` fills a database of a PostgreSQL server started for
the run from Debian's `postgresql` binaries (tests/postgres.py), which the workers share.

    FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/startup_workers.py --faces 100000 --workers 1 3

`--index HNSW32` (any FACEGATE_INDEX) serves an approximate index, built by the first worker and
saved; every worker maps the saved file (the last column: its PSS summed over the tree). `--photos A B`
sends a burst of /verify of two real photos before the memory is read, as a camera's event would:

    FACEGATE_MODEL_CACHE=../shared/models .venv/bin/python benchmarks/startup_workers.py --faces 100000 --workers 1 3 \
        --photos ../shared/data/tests/compreface/000_5.jpg ../shared/data/tests/compreface/001_A.jpg
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from benchmarks.chaos import free_port  # noqa: E402
from benchmarks.loadtest import fill_gallery, fill_postgres  # noqa: E402
from service.core.models.manifest import EmbedderKey, Manifest  # noqa: E402
from service.runtime.heap import QUIET  # noqa: E402
from tests.conftest import aligned_crop_png  # noqa: E402
from tests.onnx_models import write_test_embedder  # noqa: E402

DIM = 128
NAMED = {"facegate-decode": "decoder", "facegate-models": "model host"}  # the processes forked from the workers' forkserver


def tree(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def pss_kib(pid: int, under: Path | None = None, suffix: str = "") -> int:
    """The process's PSS in KiB: all of it, or (`under`) that of the files mapped from that folder
    (`suffix`: those whose name ends so)."""
    with suppress(OSError):
        if under is None:
            return next(int(line.split()[1]) for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Pss:"))
        total, inside = 0, False
        for line in open(f"/proc/{pid}/smaps"):
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line: its path last, when it has one
                inside = len(fields) >= 6 and fields[5].startswith(str(under)) and fields[5].endswith(suffix)
            elif inside and fields[0] == "Pss:":
                total += int(fields[1])
        return total
    return 0


def private_kib(pid: int) -> int:
    """The process's pages no other process maps (KiB): what ending it would free."""
    with suppress(OSError):
        rollup = dict(line.split(":", 1) for line in open(f"/proc/{pid}/smaps_rollup") if ":" in line)
        return sum(int(rollup[field].split()[0]) for field in ("Private_Clean", "Private_Dirty"))
    return 0


def first_ready(url: str, deadline: float) -> None:
    """Returns once /readyz answers 200: with N workers any worker's 200 means all N are ready
    (service/runtime/ready_workers.py), whichever worker the kernel gave the connection to."""
    while time.monotonic() < deadline:
        with suppress(httpx.TransportError):
            if httpx.get(f"{url}/readyz", timeout=60).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("not ready in time")


def ready_workers(url: str, workers: int, deadline: float) -> dict[int, httpx.Client]:
    """A keep-alive connection to each of `workers` worker processes once it answers /readyz 200
    (a new connection goes to any worker: the kernel picks, often the same one many times), by
    the pid /readyz reports."""
    clients: dict[int, httpx.Client] = {}
    while len(clients) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(clients)} of {workers} workers ready in time")
        client = httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=1))
        with suppress(httpx.TransportError, KeyError, ValueError):
            response = client.get("/readyz")
            if response.status_code == 200 and response.json()["serving"]["pid"] not in clients:
                clients[response.json()["serving"]["pid"]] = client
                continue
        client.close()
        time.sleep(0.01)
    return clients


def role(pid: int, root: int, preloaded: bool) -> str:
    """What a process of the tree is, from its command line and its parent's (`preloaded`: the
    workers come from a forkserver, so the one spawned process is the model host)."""
    with suppress(OSError):
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        parent_command = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if pid == root:
            return "facegate serve"
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if comm in NAMED:
            return NAMED[comm]
        if "resource_tracker" in command:
            return "resource tracker"
        if "spawn_main" in command:
            return "model host" if preloaded else "model host or worker"
        if "forkserver" in command and "decode_workers" in command:
            return "decoder" if "decode_workers" in parent_command else "decoders' forkserver"
        if "forkserver" in command:
            return "worker" if "forkserver" in parent_command else "workers' forkserver"
    return "?"


def console_script(checkout: Path, folder: Path) -> Path:
    """The `facegate` script as pip writes it for `checkout`'s pyproject (its `[project.scripts]` entry),
    in `folder`: the server starts as the image's `facegate serve` does, and multiprocessing runs that
    script again in every process it starts (a `python -c` start has no script, and hid that cost)."""
    found = re.search(r'^facegate = "([\w.]+):(\w+)"', (checkout / "pyproject.toml").read_text(), re.MULTILINE)
    assert found is not None, f"no facegate script in {checkout}/pyproject.toml"
    module, function = found.groups()
    script = folder / "facegate"
    script.write_text(f"import sys\nfrom {module} import {function}\nif __name__ == '__main__':\n    sys.exit({function}())\n")
    return script


def start(
    checkout: Path,
    data: Path,
    embedder: Path,
    crop: int,
    workers: int,
    by_process: bool,
    database: str = "",
    index: str = "Flat",
    photos: list[Path] | None = None,
) -> tuple[float, int, int, int, int]:
    """Seconds until every worker is ready, PSS of the tree, of the files mapped from the index
    folder in it (the snapshot's and a saved HNSW or IVF index's), of the index's own (KiB),
    processes; `crop`: the side of the aligned crops the embedder takes; `by_process`: each
    process's PSS printed too. `index`: FACEGATE_INDEX. `photos`: two, sent in 30 /verify (3 at a
    time) before the memory is read."""
    port = free_port()
    env = {
        **os.environ,
        "FACEGATE_DATABASE_URL": database,
        "PYTHONPATH": str(checkout),
        "FACEGATE_DATA_DIR": str(data),
        "FACEGATE_EMBEDDER": str(embedder),
        "FACEGATE_DEVICE": "cpu",
        "FACEGATE_API_KEYS": "",
        "FACEGATE_INDEX": index,
    }
    command = [sys.executable, str(console_script(checkout, data)), "serve", "--port", str(port), "--workers", str(workers)]
    log = open(data / f"server-{workers}.log", "wb")  # noqa: SIM115  (closed below)
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        first_ready(f"http://127.0.0.1:{port}", started + 900)
        seconds = time.monotonic() - started
        clients = ready_workers(f"http://127.0.0.1:{port}", workers, time.monotonic() + 900)
        image, other = (base64.b64encode(aligned_crop(seed, crop)).decode() for seed in (1, 2))
        for client in clients.values():  # one search each: the index's and the guard's pages in use, as when serving;
            # and a pair of images, decoded at once: a worker's decoders all started, as under load (FACEGATE_WORKER_THREADS)
            for path, body in (("/identify", {"image": image}), ("/verify", {"image1": image, "image2": other})):
                response = client.post(path, json={**body, "aligned": True})
                if response.status_code != 200:
                    raise RuntimeError(f"{path} answered {response.status_code}: {response.text}")
            client.close()
        if photos:
            burst(f"http://127.0.0.1:{port}", photos)
        # the decoders' start after readiness settles; at rest: each process's idle trim has run
        time.sleep(2 * float(os.environ.get("FACEGATE_IDLE_TRIM_SECONDS", QUIET)) + 1)
        pids = tree(process.pid)
        if by_process:
            preloaded = any(role(pid, process.pid, False) == "workers' forkserver" for pid in pids)
            for pid in sorted(pids, key=lambda p: role(p, process.pid, preloaded)):
                name, index_mib = role(pid, process.pid, preloaded), pss_kib(pid, data / "index", ".faiss") / 1024
                print(
                    f"  {name:>22} {pid:>8} PSS {pss_kib(pid) / 1024:7.1f} MiB, its own {private_kib(pid) / 1024:6.1f} "
                    f"(of it the mapped index {index_mib:.1f})"
                )
        mapped, own = (sum(pss_kib(p, data / "index", suffix) for p in pids) for suffix in ("", ".faiss"))
        return seconds, sum(pss_kib(p) for p in pids), mapped, own, len(pids)
    finally:
        process.terminate()
        with suppress(subprocess.TimeoutExpired):
            process.wait(60)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def aligned_crop(seed: int, side: int) -> bytes:
    """The tests' aligned crop at the embedder's input side (112 for the tests' embedder)."""
    import cv2
    import numpy as np

    image = cv2.imdecode(np.frombuffer(aligned_crop_png(seed), np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return bytes(cv2.imencode(".png", cv2.resize(image, (side, side), interpolation=cv2.INTER_NEAREST))[1])


def burst(url: str, photos: list[Path], rounds: int = 10, at_once: int = 3) -> None:
    """`rounds` × `at_once` /verify of the two photos, `at_once` at a time (as a camera's burst)."""
    files = {"image1": photos[0].read_bytes(), "image2": photos[1].read_bytes()}
    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(at_once) as pool:
        for _ in range(rounds):
            for response in pool.map(lambda _: client.post("/verify", files=files), range(at_once)):
                if response.status_code != 200:
                    raise RuntimeError(f"/verify answered {response.status_code}: {response.text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faces", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--checkout", type=Path, default=REPO, help="the source tree whose server is started")
    parser.add_argument("--by-process", action="store_true", help="print each process's PSS and what it is")
    parser.add_argument(
        "--embedder",
        help="a shipped embedder's manifest (dlib-resnet-v1: the default model, from FACEGATE_MODEL_CACHE) instead of the tests' small one",
    )
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--index", default="Flat", help="FACEGATE_INDEX: Flat, HNSW32, IVF1024,Flat…")
    parser.add_argument(
        "--photos",
        type=Path,
        nargs=2,
        help="two photos: 30 /verify of them, 3 at a time, before the memory is read (a burst of real images at rest)",
    )
    args = parser.parse_args()
    if not os.environ.get("FACEGATE_MODEL_CACHE"):
        sys.exit("set FACEGATE_MODEL_CACHE (the detector, for readiness)")
    work = Path(tempfile.mkdtemp(prefix="facegate-startup-"))
    server = None
    try:
        embedder = REPO / "models" / f"{args.embedder}.json" if args.embedder else write_test_embedder(work / "embedder", dim=DIM)
        manifest = Manifest.load(embedder)
        key = EmbedderKey.of(manifest)
        gallery = work / "gallery"
        gallery.mkdir()
        database = ""
        if args.store == "postgres":
            from tests.postgres import PostgresServer, check_available

            check_available()
            work.chmod(0o755)  # the server's user (nobody, as root) enters it
            (work / "postgres").mkdir()
            server = PostgresServer(work / "postgres").start()
            database = server.create_database("facegate")
            fill_postgres(database, key, args.faces)
        else:
            fill_gallery(gallery, key, args.faces)
        print("\n".join(machine_lines()))
        load = os.getloadavg()[0]
        print(
            f"server of {args.checkout}; {args.store}; embedder {manifest.name}; {args.faces} synthetic {key.dim}-d faces, "
            f"one per subject, the open-set guard on; index {args.index}; load {load:.1f}"
        )
        print(f"{'workers':>7} {'ready s':>8} {'processes':>9} {'PSS MiB':>8} {'mapped PSS MiB':>14} {'of it the index':>15}")
        for workers in args.workers:
            for stale in (gallery / "index").glob("*"):  # each start from the store alone: nothing saved by the last
                stale.unlink()
            seconds, pss, mapped, own, processes = start(
                args.checkout, gallery, embedder, manifest.input.height, workers, args.by_process, database, args.index, args.photos
            )
            print(f"{workers:>7} {seconds:>8.1f} {processes:>9} {pss / 1024:>8.0f} {mapped / 1024:>14.0f} {own / 1024:>15.0f}", flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
