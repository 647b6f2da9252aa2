"""`facegate serve` of this checkout as the chaos tests run it: a free 127.0.0.1 port, the given
settings on top of this environment (API keys and the database unset unless given), its output in
a log file; stopped at the end of the block. `ProcessTree` and `PeakMemory` measure it with its
decoder processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.service.api.test_server_process import free_port

INHERITED_OFF = ("FACEGATE_API_KEYS", "FACEGATE_API_KEYS_FILE", "FACEGATE_DATABASE_URL")


def without_models(folder: Path, **settings: str) -> dict[str, str]:
    """A server's environment with its gallery under `folder` and no models (only the HTTP layer is under test)."""
    return {
        "FACEGATE_DATA_DIR": str(folder / "gallery"),
        "FACEGATE_MODEL_CACHE": str(folder / "cache"),
        "FACEGATE_EMBEDDER": "none",
        **settings,
    }


@contextmanager
def facegate_serve(
    env: dict[str, str], log: Path, ready: str = "/healthz", start_timeout: float = 90.0
) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """Yields (url, port, process) once `ready` answers 200 (a 401 counts where keys are on)."""
    port = free_port()
    full_env = {**{k: v for k, v in os.environ.items() if k not in INHERITED_OFF}, "FACEGATE_DEVICE": "cpu", **env}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", "from service.cli import app; app()", "serve", "--port", str(port)],
            cwd=REPO,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                try:
                    if httpx.get(url + ready, timeout=2).status_code in (200, 401):
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            yield url, port, process
        finally:
            process.terminate()
            process.wait(15)


class ProcessTree:
    """A server process and every process below it (its decoder processes and their forkserver),
    read from /proc (Linux): memory as PSS, which counts a page shared by several processes once
    (the decoders share OpenCV's and Python's pages with their forkserver), and CPU time."""

    def __init__(self, pid: int):
        self.pid = pid

    def pids(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found, queue = [], [self.pid]
        while queue:
            pid = queue.pop()
            found.append(pid)
            queue.extend(parents.get(pid, []))
        return found

    def memory(self) -> int:
        """Bytes of PSS summed over the tree."""
        total = 0
        for pid in self.pids():
            try:
                text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            total += next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("Pss:"))
        return total

    def cpu(self) -> dict[int, float]:
        """CPU seconds (user + system) each process of the tree has used."""
        ticks = os.sysconf("SC_CLK_TCK")
        used = {}
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            used[pid] = (int(fields[11]) + int(fields[12])) / ticks
        return used

    def cpu_between(self, before: dict[int, float], after: dict[int, float]) -> float:
        """CPU seconds the tree used between two `cpu()` readings (a process gone by the second counts nothing after the first)."""
        return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


class Background:
    """Calls `sample()` every `interval` seconds in a thread while the block runs."""

    interval = 0.05

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class PeakMemory(Background):
    """The peak of a ProcessTree's memory while the block runs."""

    def __init__(self, tree: ProcessTree, interval: float = 0.05):
        super().__init__()
        self.tree, self.interval = tree, interval
        self.base = tree.memory()
        self.peak = self.base

    def sample(self) -> None:
        self.peak = max(self.peak, self.tree.memory())

    @property
    def growth(self) -> int:
        return self.peak - self.base
