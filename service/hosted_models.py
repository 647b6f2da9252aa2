"""A worker process's side of the model host (`service.model_host`): the engine's model runs sent
there, the pixels through an arena of shared memory (`service.shm_arena`), the answers matched to
their futures by a reader thread. The worker loads no session: its pipeline's detector and
embedder hold a `HostedSession`, which describes the host's session (the shapes FaceDetector and
FaceEmbedder read, the providers /readyz reports) and never runs."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from service.core.errors import ModelUnavailable
from service.core.models.files import LoadedModel, manifest_path
from service.core.models.manifest import Manifest
from service.core.models.model_set import ModelSet, Problem, with_cohort
from service.core.settings import Settings
from service.model_host import connect
from service.shm_arena import Arena

log = logging.getLogger("facegate.hosted_models")

CONNECT_TIMEOUT = 60.0  # seconds a worker waits at start-up for the model host to listen


@dataclass(frozen=True)
class NodeInfo:
    """onnxruntime's NodeArg, as far as FaceDetector and FaceEmbedder read it."""

    name: str
    shape: list
    type: str


class HostedSession:
    """A session that runs in the model host, described here."""

    def __init__(self, info: dict):
        self.info = info

    def get_inputs(self) -> list[NodeInfo]:
        return [NodeInfo(*i) for i in self.info["inputs"]]

    def get_outputs(self) -> list[NodeInfo]:
        return [NodeInfo(*o) for o in self.info["outputs"]]

    def get_providers(self) -> list[str]:
        return self.info["providers"]

    def get_provider_options(self) -> dict:
        return self.info["provider_options"]

    def run(self, *args, **kwargs):
        raise RuntimeError("this session runs in the model host: send runs through HostedModels")


class HostedModels:
    """The engine's `ModelRuns` through the model host at `socket`."""

    def __init__(self, settings: Settings, socket: Path, arena_bytes: int):
        self.socket = socket
        self.arena = Arena.reserve(socket.parent / f"arena-{os.getpid()}", arena_bytes)
        if self.arena is None:
            log.warning("no shared memory could be reserved next to %s: pixels go to the model host through its socket", socket)
        self._numbers = itertools.count()
        self._pending: dict[int, tuple[Future, int | None, int]] = {}
        self._lock = threading.Lock()  # the pending table and the connection's send side
        self._connection: Connection | None = None
        self.description: dict = {}
        self._connect(CONNECT_TIMEOUT)

    def _connect(self, timeout: float) -> None:
        """Connect, share the arena and read what the host runs; a reader thread then takes the answers."""
        connection = connect(self.socket, timeout)
        connection.send(("hello", str(self.arena.path) if self.arena else None, self.arena.size if self.arena else 0))
        kind, self.description = connection.recv()
        self._connection = connection
        threading.Thread(target=self._read, args=(connection,), name="facegate-hosted-models", daemon=True).start()

    def model_set(self, settings: Settings) -> ModelSet:
        """The host's detector and embedder as this worker's ModelSet (their sessions described, run
        there), with the problems the host met and this worker's cohort."""
        loaded = {}
        for role, name in (("detector", settings.detector), ("embedder", settings.embedder)):
            info = self.description[role]
            loaded[role] = (
                None
                if info is None
                else LoadedModel(Manifest.load(manifest_path(name, settings.models_dir)), Path(info["path"]), HostedSession(info))
            )
        problems = [Problem(**p) for p in self.description["problems"]]
        return with_cohort(settings, loaded["detector"], loaded["embedder"], problems)

    def describe(self) -> dict:
        return {
            **self.description["serving"],
            "model_host": {"pid": self.description["pid"], "shared_memory_bytes": self.arena.size if self.arena else 0},
        }

    def detect(self, canvas: np.ndarray) -> Future:
        return self._submit("detect", canvas)

    def embed(self, crops: np.ndarray) -> Future:
        return self._submit("embed", np.ascontiguousarray(crops))

    def _submit(self, role: str, rows: np.ndarray) -> Future:
        future: Future = Future()
        offset = self.arena.put(rows) if self.arena else None
        number = next(self._numbers)
        message = ("run", number, role, offset, rows.shape, rows.dtype.str, rows if offset is None else None)
        try:
            with self._lock:
                connection = self._connection or self._reconnect()
                self._pending[number] = (future, offset, rows.nbytes)
                connection.send(message)
        except (OSError, EOFError) as exc:
            self._pending.pop(number, None)
            self._release(offset, rows.nbytes)
            future.set_exception(ModelUnavailable(f"the model host is not answering ({exc}); retry shortly"))
        return future

    def _reconnect(self) -> Connection:
        """After the host went away (its watchdog restarts it), once a request needs it again."""
        self._connect(timeout=1.0)
        assert self._connection is not None
        log.info("reconnected to the model host (pid %s)", self.description["pid"])
        return self._connection

    def _release(self, offset: int | None, nbytes: int) -> None:
        if offset is not None and self.arena is not None:
            self.arena.release(offset, nbytes)

    def _read(self, connection: Connection) -> None:
        """Hand each answer to its future; when the host goes away, fail every run still pending."""
        try:
            while True:
                self._answer(connection.recv())
        except (EOFError, OSError):
            pass
        with self._lock:
            if self._connection is connection:
                self._connection = None
            pending, self._pending = self._pending, {}
        for future, offset, nbytes in pending.values():
            self._release(offset, nbytes)
            if future.set_running_or_notify_cancel():
                future.set_exception(ModelUnavailable("the model host went away while running this request; retry shortly"))

    def _answer(self, message: tuple) -> None:
        kind, number = message[0], message[1]
        with self._lock:
            future, offset, nbytes = self._pending.pop(number)
        try:
            if kind == "done":
                _, _, out_offset, shape, dtype, inline = message
                result = inline if out_offset is None or self.arena is None else self.arena.view(out_offset, shape, dtype).copy()
            else:  # an error's message; ready, metrics: the value itself
                result = message[2]
        finally:
            self._release(offset, nbytes)
        if future.set_running_or_notify_cancel():  # a request that went away dropped its future
            if kind == "error":
                future.set_exception(RuntimeError(f"the model host: {result}"))
            else:
                future.set_result(result)

    def ask(self, kind: str, *args) -> Future:
        """A question to the host whose answer is its value: `ready` (once warmed up: the warm-up's
        error or None), `metrics` (its metric families), `take` (whether a client's share fit)."""
        future: Future = Future()
        number = next(self._numbers)
        with self._lock:
            connection = self._connection or self._reconnect()
            self._pending[number] = (future, None, 0)
            connection.send((kind, number, *args))
        return future

    def take(self, client: str, amount: int, cap: int) -> Future:
        """`amount` more of `client`'s share of the host, if it stays under `cap` (its future: whether it did)."""
        return self.ask("take", client, amount, cap)

    def give(self, client: str, amount: int) -> None:
        """Give back what `take` took (nothing to wait for; a host gone has forgotten it anyway)."""
        with self._lock, suppress(OSError):
            if self._connection is not None:
                self._connection.send(("give", client, amount))

    def start_warm_up(self, done: Callable[[str | None], None]) -> None:
        """The host warms its models up once for every worker: wait for it in the background."""
        threading.Thread(target=self.warm_up, args=(done,), name="facegate-warmup", daemon=True).start()

    def warm_up(self, done: Callable[[str | None], None]) -> None:
        try:
            done(self.ask("ready").result())
        except (ModelUnavailable, OSError, EOFError) as exc:
            done(f"the model host is not answering: {exc}")

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
        if self.arena is not None:
            self.arena.close(unlink=True)
