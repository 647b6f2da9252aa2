"""Keeps the model host of `facegate serve --workers N` alive, as uvicorn and gunicorn keep their
workers: it starts the host, pings it every `ping_every` seconds, and kills one that exited, that
did not listen within `start_timeout`, or that left a ping unanswered `ping_timeout` seconds (hung:
a deadlocked provider, a stopped process). It restarts it after a backoff that doubles with each
failure up to `backoff_cap` and starts again from `backoff_first` once a host stayed up
(answering pings) `stable_after` seconds: a host that cannot start (a GPU gone) is not respawned
in a tight loop.
Nothing is started once `close` began. Each cycle it also removes the shared-memory arenas of
workers that died (`shm_arena.sweep`): uvicorn restarts a crashed worker under a new pid, and the
crashed one could not remove its own.

The workers see an outage through their own connection (`hosted_models`): they answer 503
`model_unavailable` with Retry-After at once while it lasts, and /readyz says why."""

from __future__ import annotations

import fcntl
import itertools
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from service.runtime import heap, shm_arena
from service.runtime.preload import name_process
from service.runtime.wire import PING_TIMEOUT, SOCKET, SUPERVISED

log = logging.getLogger("facegate.supervisor")
HOST_NAME = b"facegate-models"  # the model host's process name (/proc/PID/comm)


@dataclass(frozen=True)
class Timing:
    """Seconds."""

    ping_every: float = 1.0
    ping_timeout: float = PING_TIMEOUT  # a host answers a ping from its connection thread: that long a silence is a hang, not load
    start_timeout: float = 180.0  # loading the models (a GPU provider's first session) before it listens
    backoff_first: float = 0.5
    backoff_cap: float = 30.0
    stable_after: float = 60.0

    def backoff(self, failures: int) -> float:
        """The wait before the restart that follows `failures` failures in a row (the first: 1)."""
        return min(self.backoff_cap, self.backoff_first * 2 ** max(0, failures - 1))


def run_host(folder: str) -> None:
    """The host's entry: `model_host` (onnxruntime, the models, the pipeline) is imported there, not
    in `facegate serve`, whose process only supervises (docs/benchmarks.md, "A worker's memory").
    Its threads share two malloc arenas (`heap.fewer_arenas`, before any starts); it is named
    facegate-models (ps, top: forked from the workers' forkserver, it shares its command line)."""
    heap.fewer_arenas()
    name_process(HOST_NAME)
    from service.runtime import model_host

    model_host.run_host(folder)


class Supervisor:
    def __init__(
        self, folder: Path, target: Callable[[str], None] = run_host, timing: Timing | None = None, context: ForkServerContext | None = None
    ):
        """A model host `target(folder)` listening on `folder`/SOCKET, started by `context`: the
        workers' preloaded forkserver (`preload.fork_workers`: it imported no onnxruntime, so no CUDA
        state or thread is inherited, and the host shares the pages of what it imported), else spawned
        (a fresh interpreter). While it supervises it holds the lock on `folder`/SUPERVISED, which a
        host takes to learn that `facegate serve` is gone (`model_host.exit_with_supervisor`)."""
        self.folder = folder
        self.socket = folder / SOCKET
        self.timing = timing or Timing()
        self._target = target
        self._context: ForkServerContext | SpawnContext = context or multiprocessing.get_context("spawn")
        self._supervising = open(folder / SUPERVISED, "wb")  # noqa: SIM115  (closed by close(): the lock goes with it)
        fcntl.flock(self._supervising, fcntl.LOCK_EX)
        self._lock = threading.Lock()  # a start and the stopping flag: no start once close() began
        self._stopping = threading.Event()
        self._pings = itertools.count()
        self.process: BaseProcess | None = None
        self.starts: list[float] = []  # time.monotonic() of each start: the restarts' history (logs, tests)
        self.answered: float | None = None  # when the current host first answered a ping (it is up since)
        self._watcher = threading.Thread(target=self._watch, name="facegate-model-host-supervisor", daemon=True)

    def start(self) -> None:
        self._start_host()
        self._watcher.start()

    def close(self) -> None:
        """Stop supervising, then the host (SIGTERM, SIGKILL after 10 s); nothing starts after this began."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is not None:
            process.terminate()  # also ends the watcher's wait on a ping at once
        if self._watcher.is_alive():
            self._watcher.join()
        if process is not None:
            _stop(process, grace=10.0)
        self._supervising.close()

    def _start_host(self) -> BaseProcess | None:
        with self._lock:
            if self._stopping.is_set():
                return None
            self.socket.unlink(missing_ok=True)  # the last host's: a worker connects to the new one only
            process = self._context.Process(target=self._target, args=(str(self.folder),), name="facegate-model-host", daemon=True)
            process.start()
            self.process = process
            self.starts.append(time.monotonic())
            return process

    def _watch(self) -> None:
        failures = 0
        process = self.process
        while process is not None:
            self.answered = None
            why = self._until_unhealthy(process)
            if why is None or self._stopping.is_set():
                return
            _stop(process, grace=0.0)
            stayed_up = self.answered is not None and time.monotonic() - self.answered >= self.timing.stable_after
            failures = 1 if stayed_up else failures + 1
            delay = self.timing.backoff(failures)
            log.error("the model host (pid %s) %s; restarting it in %.1f s (failure %d in a row)", process.pid, why, delay, failures)
            shm_arena.sweep(self.folder)
            if self._stopping.wait(delay):
                return
            process = self._start_host()

    def _until_unhealthy(self, process: BaseProcess) -> str | None:
        """Watch `process` until it exits, never listens or hangs (why, in words); None once stopping."""
        timing = self.timing
        listen_by = time.monotonic() + timing.start_timeout
        link: Connection | None = None
        try:
            while not self._stopping.is_set():
                process.join(timing.ping_every)  # back at once when it exits
                if self._stopping.is_set():
                    return None
                if not process.is_alive():
                    return f"exited with code {process.exitcode}"
                shm_arena.sweep(self.folder)
                if link is None:
                    try:
                        link = Client(str(self.socket), family="AF_UNIX")
                    except (FileNotFoundError, ConnectionRefusedError):
                        if time.monotonic() > listen_by:
                            return f"did not listen within {timing.start_timeout:g} s"
                        continue
                if not self._answers_ping(link):
                    return "exited" if not process.is_alive() else f"left a ping unanswered for {timing.ping_timeout:g} s (hung)"
                self.answered = self.answered or time.monotonic()
            return None
        finally:
            if link is not None:
                link.close()

    def _answers_ping(self, link: Connection) -> bool:
        number = next(self._pings)
        try:
            link.send(("ping", number))
            while link.poll(self.timing.ping_timeout):
                if link.recv()[:2] == ("ping", number):
                    return True
        except (OSError, EOFError):
            pass
        return False


def _stop(process: BaseProcess, grace: float) -> None:
    """SIGTERM and `grace` seconds to exit (0: SIGKILL at once: a hung host may ignore SIGTERM)."""
    if grace > 0:
        process.terminate()
        process.join(grace)
    if process.is_alive():
        process.kill()
    process.join()


@contextmanager
def model_host(timing: Timing | None = None, context: ForkServerContext | None = None) -> Iterator[Path]:
    """A supervised model host for the duration of the block, in a private folder (under /dev/shm
    where it can be: the workers' arenas go there too); yields its socket, which the workers find in
    FACEGATE_MODEL_HOST (set here before the host starts: a forkserver it starts takes the environment
    as it is then). The folder, whatever is left in it, goes at the end."""
    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="facegate-models-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
    os.environ["FACEGATE_MODEL_HOST"] = str(folder / SOCKET)
    supervisor = Supervisor(folder, timing=timing, context=context)
    try:
        supervisor.start()
        yield supervisor.socket
    finally:
        supervisor.close()
        shutil.rmtree(folder, ignore_errors=True)
