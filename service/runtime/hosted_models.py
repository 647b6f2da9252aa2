"""A worker process's side of the model host (`service.runtime.model_host`): the engine's model runs
sent there, the pixels through an arena of shared memory (`service.runtime.shm_arena`), the answers
matched to their futures by a reader thread (the messages: `service.runtime.wire`); and the
per-client counts every worker shares (`take` / `give`: `service.budget.SharedTally`), which the
host's `Tally` keeps. The worker loads no session: its pipeline's detector
and embedder hold a `HostedSession`, the host's session described (the shapes FaceDetector and
FaceEmbedder read, the providers /readyz reports); it has no `run`.

The link to the host is kept by a thread of its own, never by a request: it pings the host every
`PING_EVERY` seconds and, when the host went away, reconnects once its supervisor restarted it.
Meanwhile `problem()` says why the host cannot take runs (down, hung, warming up), which /readyz
reports, and a run is refused at once (503 `model_unavailable` with Retry-After) rather than sent
to a host known to be down. Every call here may block on the socket: the engine makes them off the
event loop."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path

import numpy as np

from service.core.errors import ModelUnavailable
from service.core.models.files import LoadedModel, manifest_path
from service.core.models.manifest import Manifest
from service.core.models.model_set import ModelSet, Problem, with_cohort
from service.core.settings import Settings
from service.runtime import wire
from service.runtime.model_host import connect
from service.runtime.shm_arena import Arena, arena_path
from service.runtime.wire import PING_TIMEOUT

log = logging.getLogger("facegate.hosted_models")

CONNECT_TIMEOUT = 60.0  # seconds a worker waits at start-up for the model host to listen
HELLO_TIMEOUT = 10.0  # seconds a listening host may take to describe its models
PING_EVERY = 0.5  # seconds between the link thread's pings (and reconnection attempts)
RETRY_AFTER = 1  # seconds a refused run's client is told to wait: a restart takes about that


@dataclass(frozen=True)
class NodeInfo:
    """onnxruntime's NodeArg, as far as FaceDetector and FaceEmbedder read it."""

    name: str
    shape: list
    type: str


class HostedSession:
    """A session that runs in the model host, described here (it has no `run`: runs go through HostedModels)."""

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


class HostedModels:
    """The engine's `ModelRuns` through the model host at `socket`."""

    def __init__(
        self, settings: Settings, socket: Path, arena_bytes: int, ping_every: float = PING_EVERY, ping_timeout: float = PING_TIMEOUT
    ):
        self.socket = socket
        self.ping_every, self.ping_timeout = ping_every, ping_timeout
        self.arena = Arena.reserve(arena_path(socket.parent, os.getpid()), arena_bytes)
        if self.arena is None:
            log.warning("no shared memory could be reserved next to %s: pixels go to the model host through its socket", socket)
        self._numbers = itertools.count()
        self._pending: dict[int, tuple[Future, int | None, int]] = {}
        self._lock = threading.Lock()  # the pending table and the connection's send side
        self._connection: Connection | None = None
        self._down_since = time.monotonic()
        self._unanswered_since: float | None = None  # the oldest ping still unanswered
        self._host_state: dict = {"warmed": False, "warmup_error": None}  # the host's last answer to a ping
        self._closed = threading.Event()
        self.description: dict = {}
        self._connect(connect(self.socket, CONNECT_TIMEOUT))
        self._link = threading.Thread(target=self._keep_linked, name="facegate-model-host-link", daemon=True)
        self._link.start()

    def _connect(self, connection: Connection) -> None:
        """Share the arena and read what the host runs; a reader thread then takes the answers."""
        try:
            connection.send(("hello", str(self.arena.path) if self.arena else None, self.arena.size if self.arena else 0))
            if not connection.poll(HELLO_TIMEOUT):
                raise TimeoutError("the model host did not answer its hello")
            _, description = connection.recv()
        except BaseException:
            connection.close()
            raise
        self.description = description
        self._unanswered_since = None
        with self._lock:
            if self._closed.is_set():  # closed while this connected
                connection.close()
                return
            self._connection = connection
            self._host_state = {"warmed": False, "warmup_error": None}  # a new host: warm once it says so
        threading.Thread(target=self._read, args=(connection,), name="facegate-hosted-models", daemon=True).start()

    def _keep_linked(self) -> None:
        """The link thread: reconnect to a restarted host, ping a connected one."""
        while not self._closed.wait(self.ping_every):
            if self._connection is None:
                try:
                    self._connect(Client(str(self.socket), family="AF_UNIX"))
                except (OSError, EOFError):  # not listening yet: the supervisor's backoff
                    continue
                log.info("reconnected to the model host (pid %s)", self.description["pid"])
            self._ping()

    def _observe(self, connection: Connection | None, state: dict) -> None:
        """The state a host answered on `connection`, unless that is no longer the link or the answer
        is older than one already seen (a ping answered just before the host's `ready`)."""
        with self._lock:
            if connection is self._connection and not (self._host_state["warmed"] and not state["warmed"]):
                self._host_state = state

    def _ping(self) -> None:
        asked, connection = time.monotonic(), self._connection
        try:
            self._observe(connection, self.ask("ping").result(self.ping_timeout))
            self._unanswered_since = None
        except ModelUnavailable:  # went away meanwhile: the reader saw it
            pass
        except TimeoutError:
            if self._unanswered_since is None:
                self._unanswered_since = asked
                log.error("the model host (pid %s) left a ping unanswered for %g s", self.description.get("pid"), self.ping_timeout)

    def problem(self) -> str | None:
        """Why the host cannot take runs now (down, hung, warming up), or None: for /readyz and every
        image route's 503. Reads only what the link thread saw: never waits."""
        now = time.monotonic()
        if self._closed.is_set():
            return "this worker is shutting down"
        if self._connection is None:
            return f"the model host is down ({now - self._down_since:.1f} s); its supervisor restarts it"
        if self._unanswered_since is not None:
            return f"the model host has not answered a ping for {now - self._unanswered_since:.1f} s (hung); its supervisor restarts it"
        if self._host_state["warmup_error"]:
            return f"the model host's warm-up failed: {self._host_state['warmup_error']}"
        if not self._host_state["warmed"]:
            return "the model host is warming up its models"
        return None

    def _refusal(self) -> ModelUnavailable | None:
        """A run's 503 while the host is known down or hung: at once, never a wait on it."""
        if self._connection is None or self._unanswered_since is not None:
            return ModelUnavailable(f"{self.problem() or 'the model host is not answering'}; retry shortly", retry_after=RETRY_AFTER)
        return None

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

    def _refused(self) -> Future | None:
        """A future already failed with the 503 of a host known down or hung; None when it may answer."""
        if (refused := self._refusal()) is None:
            return None
        future: Future = Future()
        future.set_exception(refused)
        return future

    def _submit(self, role: str, rows: np.ndarray) -> Future:
        if (refused := self._refused()) is not None:
            return refused
        offset = self.arena.put(rows) if self.arena else None
        number = next(self._numbers)
        message = None if offset is None else wire.record(role, number, offset, rows.shape, rows.dtype.str)
        if message is None:  # the pixels inline
            message = wire.pickled(("run", number, role, offset, rows.shape, rows.dtype.str, rows if offset is None else None))
        return self._send(number, message, offset, rows.nbytes)

    def ask(self, kind: str, *args) -> Future:
        """A question to the host whose answer is its value: `metrics` (its metric families), `ping`
        (its state: warmed, warmup_error), `ready` (that state, once it has warmed up), `take`
        (whether a client's share fit)."""
        number = next(self._numbers)
        return self._send(number, wire.pickled((kind, number, *args)), None, 0)

    def take(self, client: str, amount: int, cap: int) -> Future:
        """`amount` more of `client`'s share of the host, if it stays under `cap` (its future: whether it
        did); refused at once, like a run, while the host is known down or hung."""
        return self._refused() or self.ask("take", client, amount, cap)

    def give(self, client: str, amount: int) -> None:
        """Give back what `take` took (nothing to wait for; a host gone has forgotten it anyway)."""
        with self._lock, suppress(OSError):
            if self._connection is not None:
                self._connection.send_bytes(wire.pickled(("give", client, amount)))

    def _send(self, number: int, message: bytes, offset: int | None, nbytes: int) -> Future:
        """Send `message` on the connection; its future fails at once (503) when there is none."""
        future: Future = Future()
        try:
            with self._lock:
                if self._connection is None:
                    raise ConnectionError("not connected")
                self._pending[number] = (future, offset, nbytes)
                self._connection.send_bytes(message)
        except (OSError, EOFError) as exc:
            with self._lock:
                self._pending.pop(number, None)
            self._release(offset, nbytes)
            future.set_exception(ModelUnavailable(f"the model host is not answering ({exc}); retry shortly", retry_after=RETRY_AFTER))
        return future

    def _release(self, offset: int | None, nbytes: int) -> None:
        if offset is not None and self.arena is not None:
            self.arena.release(offset, nbytes)

    def _read(self, connection: Connection) -> None:
        """Hand each answer to its future (all those a message holds); when the host goes away, fail
        every run still pending."""
        try:
            while True:
                for message in wire.messages(connection.recv_bytes()):
                    self._answer(message)
        except (EOFError, OSError):
            pass
        with self._lock:
            if self._connection is connection:
                self._connection = None
                self._down_since = time.monotonic()
                self._host_state = {"warmed": False, "warmup_error": None}
            pending, self._pending = self._pending, {}
        connection.close()
        for future, offset, nbytes in pending.values():
            self._release(offset, nbytes)
            if future.set_running_or_notify_cancel():
                future.set_exception(ModelUnavailable("the model host went away while running this request; retry shortly", RETRY_AFTER))

    def _answer(self, message: tuple) -> None:
        kind, number = message[0], message[1]
        with self._lock:
            entry = self._pending.pop(number, None)
        if entry is None:  # a run failed when its connection was lost, answered afterwards
            return
        future, offset, nbytes = entry
        try:
            if kind == "done":
                _, _, out_offset, shape, dtype, inline = message
                result = inline if out_offset is None or self.arena is None else self.arena.view(out_offset, shape, dtype).copy()
            else:  # an error's message; ready, metrics, ping: the value itself
                result = message[2]
        finally:
            self._release(offset, nbytes)
        if future.set_running_or_notify_cancel():  # a request that went away dropped its future
            if kind == "error":
                future.set_exception(RuntimeError(f"the model host: {result}"))
            else:
                future.set_result(result)

    def start_warm_up(self, done: Callable[[str | None], None]) -> None:
        """The host warms its models up once for every worker: wait for it in the background."""
        threading.Thread(target=self.warm_up, args=(done,), name="facegate-warmup", daemon=True).start()

    def warm_up(self, done: Callable[[str | None], None]) -> None:
        """`done` once the host's warm-up is over (its error, or None). The host answers `ready` at
        that moment, so every worker of a host turns ready at once (not a ping later); a host that
        went away meanwhile is asked again once the link thread reconnected."""
        while not self._closed.is_set():
            connection = self._connection
            try:
                state = self.ask("ready").result()
            except ModelUnavailable:
                self._closed.wait(self.ping_every)
                continue
            self._observe(connection, state)
            done(state["warmup_error"])
            return

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
        if self.arena is not None:
            self.arena.close(unlink=True)
