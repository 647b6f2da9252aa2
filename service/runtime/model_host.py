"""The model host: one process that runs the detector and the embedder for every HTTP worker process
of a host (`facegate serve --workers N`). HTTP parsing, decoding, letterboxing and alignment spread
over the workers; the models run once, here, through one set of sessions and micro-batchers fed by
all of them — cross-process dynamic batching, the shape Triton gives a model — so a GPU sees large
batches on one CUDA context instead of N processes' small ones on N contexts that take turns.

Workers reach it over a Unix socket in a private folder (mode 0700, the only access control it
needs); the pixels go through memory each worker shares with it (`service.runtime.shm_arena`), the socket
carries only small messages (`service.runtime.hosted_models` is the other side). It answers a
`ping` at once, from a connection's own thread whatever its models are doing: its supervisor
(`service.runtime.supervisor`) and each worker ping it to tell a hung host from a busy one.

It also keeps the per-client counts every worker must share (`Tally`: a client's pixels in flight,
`service.budget.CostLanes`, and the requests whose key is not yet known, host-wide and per address,
`service.api.admission`): the one process they all reach, and one that learns at once when a
worker goes away (its socket closes) and gives back what that worker held.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections import Counter
from contextlib import suppress
from dataclasses import asdict
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path

from service.core.models.files import LoadedModel
from service.core.models.model_set import load_models
from service.core.pipeline import FacePipeline
from service.core.settings import Settings
from service.metrics import Metrics
from service.runtime import wire
from service.runtime.heap import IdleTrim
from service.runtime.local_models import LocalModels
from service.runtime.shm_arena import Arena
from service.runtime.wire import SOCKET, SUPERVISED

log = logging.getLogger("facegate.model_host")


def session_info(loaded: LoadedModel | None) -> dict | None:
    """What a worker needs to know of a session that runs here: its inputs and outputs as
    onnxruntime reports them, and its providers with their options (for /readyz)."""
    if loaded is None:
        return None
    session = loaded.session
    return {
        "path": str(loaded.path),
        "inputs": [(i.name, list(i.shape), i.type) for i in session.get_inputs()],
        "outputs": [(o.name, list(o.shape), o.type) for o in session.get_outputs()],
        "providers": session.get_providers(),
        "provider_options": session.get_provider_options(),
    }


class Tally:
    """Amounts held per client across every worker, checked against a cap; each worker's share kept
    apart (`mine`) so that a worker that goes away gives back exactly its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # each worker is served on its own thread
        self.held: Counter[str] = Counter()

    def take(self, client: str, amount: int, cap: int, mine: Counter[str]) -> bool:
        """Whether `amount` more fits under `cap` (one amount always fits), taken if so."""
        with self._lock:
            if self.held[client] and self.held[client] + amount > cap:
                return False
            self.held[client] += amount
            mine[client] += amount
            return True

    def give(self, client: str, amount: int, mine: Counter[str]) -> None:
        with self._lock:
            amount = min(amount, mine[client])  # after a restart of this host, nothing of before is held here
            for counts in (self.held, mine):
                counts[client] -= amount
                if counts[client] <= 0:
                    del counts[client]

    def give_all(self, mine: Counter[str]) -> None:
        for client, amount in list(mine.items()):
            self.give(client, amount, mine)


class ModelHost:
    def __init__(self, settings: Settings, folder: Path):
        self.models = load_models(settings)
        for problem in self.models.problems:
            log.error("%s %r is unavailable: %s", problem.model, problem.name, problem.error)
        self.metrics = Metrics()
        self.warmed = threading.Event()
        self.warmup_error: str | None = None
        self.tally = Tally()
        self.local: LocalModels | None = None
        if self.models.detector is not None and self.models.embedder is not None:
            self.local = LocalModels(settings, FacePipeline(settings, self.models), self.metrics, executor=None)
            self.local.start_warm_up(self._warmed)
        self._workers: set[_Worker] = set()
        self.idle = IdleTrim(settings.idle_trim_seconds)  # the batches' buffers given back once the workers stop sending
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.listener = Listener(str(folder / SOCKET), family="AF_UNIX")

    def _warmed(self, error: str | None) -> None:
        self.warmup_error = error
        self.warmed.set()

    def state(self) -> dict:
        """What a ping is answered with."""
        return {"warmed": self.warmed.is_set(), "warmup_error": self.warmup_error}

    def description(self) -> dict:
        return {
            "pid": os.getpid(),
            "detector": session_info(self.models.detector),
            "embedder": session_info(self.models.embedder),
            "problems": [asdict(p) for p in self.models.problems if p.model != "cohort"],  # a worker loads its cohort itself
            "serving": self.local.describe() if self.local else {},
        }

    def serve_forever(self) -> None:
        """Serve each worker that connects, until `close`."""
        self.idle.start()
        while True:
            try:
                connection = self.listener.accept()
            except OSError:  # closed
                return
            if self._closing.is_set():  # close()'s own connection, made to end the accept
                connection.close()
                return
            worker = _Worker(self, connection)
            with self._lock:
                self._workers.add(worker)
            threading.Thread(target=worker.serve, name="facegate-model-host-conn", daemon=True).start()

    def close(self) -> None:
        """Stop listening and drop every worker, as the host's death would: their runs fail now (again: nothing)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self.idle.stop()
        with suppress(OSError):  # an accept() is not woken by closing its socket: a connection ends it
            Client(self.listener.address, family="AF_UNIX").close()
        self.listener.close()
        with self._lock:
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            with suppress(OSError), socket.socket(fileno=os.dup(worker.connection.fileno())) as end:
                end.shutdown(socket.SHUT_RDWR)  # wakes its reader, blocked on the socket, with an EOF
        if self.local is not None:
            self.local.close()


class _Worker:
    """One connected worker process: a thread reads its requests, another writes the answers in
    the order their runs finish (a batcher thread never waits on a socket)."""

    def __init__(self, host: ModelHost, connection: Connection):
        self.host = host
        self.connection = connection
        self.arena: Arena | None = None
        self.answers: queue.SimpleQueue = queue.SimpleQueue()
        self.held: Counter[str] = Counter()  # its share of the host's tally

    def serve(self) -> None:
        writer = threading.Thread(target=self._write, name="facegate-model-host-answers", daemon=True)
        writer.start()
        try:
            while True:
                for message in wire.messages(self.connection.recv_bytes()):
                    self._handle(message)
        except (EOFError, OSError):
            pass  # the worker went away: its arena is its own to remove
        finally:
            self.host.tally.give_all(self.held)
            self.answers.put(None)
            writer.join()
            with self.host._lock:
                self.host._workers.discard(self)
            self.connection.close()
            if self.arena is not None:
                self.arena.close()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "hello":
            _, path, size = message
            self.arena = Arena(Path(path), size) if path else None
            self.answers.put(("models", self.host.description()))
        elif kind == "ping":  # answered here, never behind a model run
            self.answers.put(("ping", message[1], self.host.state()))
        elif kind == "ready":  # answered once warmed up: every worker of the host is ready at the same moment
            threading.Thread(target=self._answer_ready, args=(message[1],), daemon=True).start()
        elif kind == "take":
            _, number, client, amount, cap = message
            self.answers.put(("taken", number, self.host.tally.take(client, amount, cap, self.held)))
        elif kind == "give":
            _, client, amount = message
            self.host.tally.give(client, amount, self.held)
        elif kind == "metrics":
            self.answers.put(("metrics", message[1], list(self.host.metrics.registry.collect())))
        elif kind == "run":
            self.host.idle.note()
            _, number, role, offset, shape, dtype, inline = message
            rows = inline if offset is None else self._arena().view(offset, shape, dtype)
            local = self.host.local
            if local is None:
                self.answers.put(("error", number, "RuntimeError: the model host has no models loaded"))
                return
            future = local.detect(rows) if role == "detect" else local.embed(rows)
            room = 0 if offset is None else rows.nbytes
            future.add_done_callback(lambda f: self.answers.put((number, offset, room, f)))

    def _answer_ready(self, number: int) -> None:
        self.host.warmed.wait()
        self.answers.put(("ready", number, self.host.state()))

    def _arena(self) -> Arena:
        if self.arena is None:
            raise OSError("a run in shared memory before the worker shared any")
        return self.arena

    def _write(self) -> None:
        """Send the answers as their runs finish: every answer waiting when this wakes goes out at
        once, the records of runs answered in place as one message (one wake-up of the worker's reader)."""
        ending = False
        while not ending:
            items = [self.answers.get()]
            with suppress(queue.Empty):
                while items[-1] is not None:
                    items.append(self.answers.get_nowait())
            ending = items[-1] is None
            records = []
            for item in items[:-1] if ending else items:
                answer = self._answer(item)
                if wire.is_record(answer):
                    records.append(answer)
                else:
                    self._send(answer)
            if records:
                self._send(wire.joined(records))

    def _answer(self, item: tuple) -> bytes:
        """An answer as the bytes sent: a record for a run answered in place, pickled otherwise."""
        if isinstance(item[0], str):  # an answer already made
            return wire.pickled(item)
        number, offset, room, future = item
        try:
            out = future.result()
        except Exception as exc:  # the model run failed: the worker's request gets it as its error
            return wire.pickled(("error", number, f"{type(exc).__name__}: {exc}"))
        if offset is not None and out.nbytes <= room:  # written back over its input, in place
            self._arena().view(offset, out.shape, out.dtype.str)[...] = out
            if (done := wire.record("done", number, offset, out.shape, out.dtype.str)) is not None:
                return done
            return wire.pickled(("done", number, offset, out.shape, out.dtype.str, None))
        return wire.pickled(("done", number, None, out.shape, out.dtype.str, out))

    def _send(self, message: bytes) -> None:
        with suppress(OSError):  # the worker went away; its reader ends this connection
            self.connection.send_bytes(message)


def run_host(folder: str) -> None:
    """The model host process's main: the settings from the environment, as each worker reads them."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops this one last
    threading.Thread(target=exit_with_supervisor, args=(Path(folder),), name="facegate-model-host-supervised", daemon=True).start()
    ModelHost(Settings(), Path(folder)).serve_forever()


def exit_with_supervisor(folder: Path) -> None:
    """A `facegate serve` killed outright (kill -9, the OOM killer) cannot stop its model host: the
    host stops itself once it can take the lock its supervisor held (the kernel drops it with the
    process), rather than hold the GPU for nobody. Not its parent's pid: forked from the workers'
    forkserver, the host's parent is that forkserver, which outlives `facegate serve` while any
    worker does."""
    try:
        supervised = open(folder / SUPERVISED, "rb")  # noqa: SIM115  (held until the process exits)
    except FileNotFoundError:  # started without a supervisor (a test's host)
        return
    fcntl.flock(supervised, fcntl.LOCK_SH)  # waits while the supervisor holds its exclusive lock
    os._exit(0)


def connect(path: Path, timeout: float) -> Connection:
    """A connection to the model host at `path`, waiting up to `timeout` seconds for it to listen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return Client(str(path), family="AF_UNIX")
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
