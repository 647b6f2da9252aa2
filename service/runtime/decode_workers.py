"""Probing and decoding in worker processes, so that no image can turn against the service.

The structure checks of `decode` and `jpeg` refuse what can be known from a header; what cannot
(a decoder's own allocations, its time, its bugs) is bounded here, the same way for every format:
the service process never parses an image's bytes itself. Each worker, forked from a forkserver that
preloaded OpenCV and Pillow, probes or decodes one image at a time:

- memory: its heap may grow FACEGATE_DECODE_MEMORY_MB beyond its idle size (RLIMIT_DATA, Linux); an
  image that needs more fails to decode (413 `image_too_large`);
- time: a probe or decode that used FACEGATE_DECODE_TIMEOUT seconds of CPU (read from /proc; where
  it cannot be, of wall-clock time), or WALL_FACTOR times that of wall-clock time, gets its worker
  killed and replaced (422 `image_too_complex`). CPU time, so that a host busy with other requests
  does not fail a large photo that merely waited for a core;
- cancellation: the caller's `cancel` event (set when its request is abandoned, its client gone)
  kills the worker at once and raises `DecodeCancelled`;
- death: a worker that dies mid-job (a decoder crash, or killed from outside: the OOM killer, an
  operator) takes only that job, answered as the server's fault (503 `decoder_failed`, Retry-After),
  or 413 `image_too_large` where its heap had grown past half its memory limit (the image's size is
  then the likely cause); never 400, which would blame a client for a server fault.

An image's bytes go in and its pixels come out through one shared buffer per worker, copied once
each way; the worker keeps KEEP_RESIDENT bytes of it mapped between images, the rest is given back.
Workers start on demand, up to `processes`, and are reused."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import queue
import tempfile
import threading
import time
from contextlib import suppress
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.reduction import recv_handle, send_handle
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from service.core import errors
from service.core.cpus import available_cores
from service.core.decode import Probe, decode_probed, probe
from service.core.errors import DecoderFailed, FacegateError, ImageTooComplex, ImageTooLarge, InvalidImage
from service.runtime.heap import release_freed
from service.runtime.preload import children_context, name_process
from service.runtime.ready_workers import one_of_several

if TYPE_CHECKING:  # not imported at run time: pydantic's settings would add ~13 MB to every decoder (docs/benchmarks.md)
    from service.core.settings import Settings

POLL = 0.05  # seconds between looks at the caller's cancel event and the worker's CPU time while it runs
WALL_FACTOR = 5  # a job's wall-clock limit, in CPU limits: a worker starved of CPU this long is stopped too
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
START_TIMEOUT = 60.0  # seconds a new worker may take to report ready (the forkserver's first start imports OpenCV)
KEEP_RESIDENT = 32 << 20  # bytes of a worker's buffer left mapped between images: a 10-MP image, in or out
DECODER_NAME = b"facegate-decode"  # a decoder process's name (/proc/PID/comm)
MB = 1_000_000  # the settings count memory in MB of 10⁶ bytes, as FACEGATE_MAX_BODY_MEGABYTES
ERRORS = {cls.__name__: cls for cls in errors.all_errors()}
Limits = tuple[int, int, int, int]  # decode_image's max_bytes, max_pixels, min_side, reduce_to_side


class DecodeCancelled(Exception):
    """The caller set its cancel event (its request was abandoned): the worker was stopped."""


def _shared_file() -> int:
    """A file descriptor for memory shared with the parent: an anonymous memfd (Linux), else an
    unlinked temporary file."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("facegate-decode")
    with tempfile.TemporaryFile() as file:
        return os.dup(file.fileno())


def _cpu_seconds(pid: int | None) -> float | None:
    """The CPU time a process has used (user + system), or None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def _data_bytes(pid: int | str = "self") -> int | None:
    """A process's data segment (heap and private mappings) in bytes, as RLIMIT_DATA counts it;
    None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:")), None)
    except OSError:
        return None


def _limit_memory(extra: int) -> None:
    """Let the heap grow `extra` bytes beyond what it holds now (Linux; elsewhere no limit)."""
    import resource

    now = _data_bytes()
    if now is None:
        return
    soft = now + extra
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def serve(conn: Connection, size: int, memory: int) -> None:
    """A worker: creates its shared buffer and hands it to the parent, then answers jobs (op, byte
    count, limits) until the connection closes: ("probe", Probe), ("image", shape) with the pixels
    in the buffer, or ("error", class name, message); and "trim", the pool at rest
    (`DecodeWorkers.give_back`): the heap its last images freed given back (glibc keeps a photo's
    pixels below twice the largest block freed), answered ("trimmed",)."""
    name_process(DECODER_NAME)
    fd = _shared_file()
    os.ftruncate(fd, size)
    buffer = mmap.mmap(fd, size)
    send_handle(conn, fd, 0)
    os.close(fd)
    cv2.setNumThreads(1)  # one image at a time per process: the pool is the parallelism
    _limit_memory(memory)
    while True:
        try:
            op, count, limits = conn.recv()
        except (EOFError, OSError):
            return
        if op == "trim":
            release_freed()
            conn.send(("trimmed",))
        else:
            conn.send(_job(buffer, op, count, limits, memory))


def _job(buffer: mmap.mmap, op: str, count: int, limits: Limits, memory: int) -> tuple[Any, ...]:
    try:
        data = buffer[:count]
        found = probe(data, *limits)
        if op == "probe":
            return ("probe", found)
        needed = 3 * found.budget_pixels  # its pixels and the decoder's buffer: what is known before decoding
        if needed > memory:
            message = f"decoding the image needs at least {needed // MB} MB; FACEGATE_DECODE_MEMORY_MB is {memory // MB}"
            return ("error", ImageTooLarge.__name__, message)
        image = decode_probed(data, found)
        view = np.frombuffer(buffer, np.uint8, image.nbytes)
        view[:] = image.reshape(-1)
        del view  # the buffer must not stay exported
        return ("image", image.shape)
    except FacegateError as exc:
        return ("error", type(exc).__name__, exc.message)
    except (MemoryError, cv2.error) as exc:
        if isinstance(exc, MemoryError) or "alloc" in str(exc).lower() or "memory" in str(exc).lower():
            message = f"decoding the image needs more than FACEGATE_DECODE_MEMORY_MB ({memory // MB} MB)"
            return ("error", ImageTooLarge.__name__, message)
        return ("error", InvalidImage.__name__, "the image could not be decoded")


class _Worker:
    def __init__(self, context: Any, size: int, memory: int):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, size, memory), name="facegate-decode", daemon=True)
        self.process.start()
        child.close()
        self.buffer: mmap.mmap | None = None
        try:
            if not self.conn.poll(START_TIMEOUT):
                raise TimeoutError(f"no answer within {START_TIMEOUT:g} s")
            fd = recv_handle(self.conn)
        except (OSError, EOFError) as exc:  # TimeoutError is an OSError
            self.kill()
            raise RuntimeError(f"a decode worker did not start: {exc}") from exc
        self.buffer = mmap.mmap(fd, size)
        os.close(fd)
        self.used = 0  # bytes of the buffer the last job touched
        self.memory = memory
        self.peak = 0  # the largest heap seen during the current job (sampled at each poll)
        self.idle = _data_bytes(self.process.pid)  # its heap before any job: RLIMIT_DATA is this plus `memory`

    def ask(self, op: str, data: bytes, limits: Limits, timeout: float, cancel: threading.Event | None) -> tuple[Any, ...]:
        """Send a job and wait for its reply; DecodeCancelled, ImageTooComplex (deadline) or
        DecoderFailed / ImageTooLarge (the worker died) leave the worker unusable: the caller kills it."""
        assert self.buffer is not None
        self.buffer[: len(data)] = data
        self.used = len(data)
        self.conn.send((op, len(data), limits))
        sent = time.monotonic()
        deadline = sent + WALL_FACTOR * timeout
        started: float | None = None  # the worker's CPU time at the first poll: most photos are done before it
        self.peak = 0  # the largest heap seen while it runs
        while not self.conn.poll(POLL):
            if cancel is not None and cancel.is_set():
                raise DecodeCancelled()
            self.peak = max(self.peak, _data_bytes(self.process.pid) or 0)
            used = _cpu_seconds(self.process.pid)
            if used is None:  # no /proc: wall-clock time alone, at the CPU limit
                deadline = min(deadline, sent + timeout)
            elif started is None:
                started = used - POLL  # a one-threaded worker used at most one poll's time before
            if time.monotonic() > deadline or (used is not None and started is not None and used - started > timeout):
                raise ImageTooComplex(
                    f"the image did not {op} within {timeout:g} s of CPU time (FACEGATE_DECODE_TIMEOUT); its decoder was stopped"
                )
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            raise self._died(op) from None

    def _died(self, op: str) -> FacegateError:
        """What a job whose worker died answers: the image's fault only where memory ran out."""
        self.process.join(1.0)
        if self.idle is not None and self.peak - self.idle > self.memory // 2:
            return ImageTooLarge(
                f"decoding the image needs more than FACEGATE_DECODE_MEMORY_MB ({self.memory // MB} MB); its decoder process ran out"
            )
        return DecoderFailed(
            f"the decoder process died during the image's {op} (exit code {self.process.exitcode}); retry in {DecoderFailed.retry_after} s"
        )

    def pixels(self, shape: tuple[int, ...]) -> np.ndarray:
        """The image the last job left in the buffer, copied out: the buffer is the next job's."""
        assert self.buffer is not None
        image = np.empty(shape, np.uint8)
        view = np.frombuffer(self.buffer, np.uint8, image.nbytes)
        image.reshape(-1)[:] = view
        del view
        self.used = max(self.used, image.nbytes)
        return image

    def trim(self) -> None:
        """Give back the pages of the buffer beyond KEEP_RESIDENT that the last job touched."""
        if self.buffer is not None and self.used > KEEP_RESIDENT and hasattr(mmap, "MADV_REMOVE"):
            self.buffer.madvise(mmap.MADV_REMOVE, KEEP_RESIDENT, len(self.buffer) - KEEP_RESIDENT)
        self.used = 0

    def rest(self) -> None:
        """An idle worker's memory given back: every page of its buffer (no job reads or writes it) and
        the heap its last images freed (the worker trims, answering within START_TIMEOUT)."""
        if self.buffer is not None and hasattr(mmap, "MADV_REMOVE"):
            self.buffer.madvise(mmap.MADV_REMOVE, 0, len(self.buffer))
        self.conn.send(("trim", 0, None))
        if not self.conn.poll(START_TIMEOUT):
            raise TimeoutError(f"a decode worker did not trim within {START_TIMEOUT:g} s")
        self.conn.recv()

    def kill(self) -> None:
        """Stop the process and free its buffer (again: a no-op)."""
        self.process.kill()
        self.process.join()
        self.conn.close()
        if self.buffer is not None:
            self.buffer.close()


class DecodeWorkers:
    def __init__(self, processes: int, memory_mb: int, timeout: float, max_bytes: int, max_pixels: int, keep_one: bool = True):
        """Up to `processes` workers, each able to take an image of `max_bytes` and decode one of
        `max_pixels` (the limits its jobs are given must not exceed these). `keep_one`: at rest
        (`give_back`) the last used keeps running, else every worker stops."""
        self.timeout = timeout
        self.keep_one = keep_one
        self.memory = memory_mb * MB
        self.size = -(-max(max_bytes, 3 * max_pixels) // mmap.PAGESIZE) * mmap.PAGESIZE
        self._context: ForkServerContext | SpawnContext
        if "forkserver" in multiprocessing.get_all_start_methods():  # preloading this module, unless one runs already
            self._context = children_context([__name__])
        else:
            self._context = multiprocessing.get_context("spawn")
        self._idle: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(processes):
            self._idle.put(None)  # a slot: its worker starts when first needed
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_settings(cls, settings: Settings) -> DecodeWorkers:
        """As many workers as the engine has threads (FACEGATE_WORKER_THREADS, else the usable cores).
        A worker of `facegate serve --workers N` keeps none at rest: N workers would keep N (8 MiB of
        pages each, 17-18 MiB PSS), each of which saves a fork (5-15 ms) only to the requests the kernel
        happens to hand its worker first after a quiet spell (docs/benchmarks.md, "Round 11")."""
        processes = settings.worker_threads or available_cores()
        limits = (settings.max_image_bytes, settings.max_image_pixels)
        return cls(processes, settings.decode_memory_mb, settings.decode_timeout, *limits, keep_one=not one_of_several(settings))

    def start(self) -> None:
        """Start one worker now (the forkserver with it), so that the first request does not wait for it."""
        self._checkin(self._checkout(None))

    def probe(
        self, data: bytes, max_bytes: int, max_pixels: int, min_side: int, reduce_to_side: int = 0, cancel: threading.Event | None = None
    ) -> Probe:
        """`service.core.decode.probe` in a worker."""
        found: Probe = self._run("probe", data, (max_bytes, max_pixels, min_side, reduce_to_side), cancel)
        return found

    def decode(
        self, data: bytes, max_bytes: int, max_pixels: int, min_side: int, reduce_to_side: int = 0, cancel: threading.Event | None = None
    ) -> np.ndarray:
        """`service.core.decode.decode_image` in a worker."""
        image: np.ndarray = self._run("decode", data, (max_bytes, max_pixels, min_side, reduce_to_side), cancel)
        return image

    def give_back(self) -> None:
        """What the idle workers hold, given back once the process is idle (`heap.IdleTrim`): with
        `keep_one`, the last used keeps running, its buffer emptied (a worker keeps the pages of its
        last images resident, up to KEEP_RESIDENT: 32 MiB after a 12-megapixel photo) and its heap
        trimmed (`_Worker.rest`); the others stop, each slot starting a worker again when a burst
        needs it (5-15 ms, from the forkserver). A job meanwhile waits for its worker."""
        idle = []
        with suppress(queue.Empty):
            while True:
                idle.append(self._idle.get_nowait())
        kept = not self.keep_one  # whether one is kept already: with keep_one false, none is to be
        try:
            for at, worker in enumerate(idle):  # the last used first
                if worker is None:
                    continue
                if not kept:
                    try:
                        worker.rest()
                        kept = True
                        continue
                    except (OSError, EOFError):  # dead or hung (TimeoutError): stopped with the others
                        pass
                with self._lock:
                    self._workers.discard(worker)
                worker.kill()
                idle[at] = None
        finally:
            for worker in reversed(idle):  # the order they were in: the last used is taken first
                self._idle.put(worker)

    def close(self) -> None:
        """Stop every worker; one still running a job is stopped as it comes back."""
        with self._lock:
            self._closed = True
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            worker.kill()

    def _run(self, op: str, data: bytes, limits: Limits, cancel: threading.Event | None) -> Any:
        if len(data) > limits[0]:  # refused before it is copied anywhere
            raise ImageTooLarge(f"the image is {len(data)} bytes; the limit is {limits[0]}")
        if limits[0] > self.size or 3 * limits[1] > self.size:
            raise ValueError("decode limits above those the workers were sized for")
        worker = self._checkout(cancel)
        try:
            try:
                reply = worker.ask(op, data, limits, self.timeout, cancel)
            except BaseException:
                self._discard(worker)  # ran over, cancelled or dead: never reused
                raise
            if reply[0] == "error":
                raise ERRORS[reply[1]](reply[2])
            return worker.pixels(reply[1]) if op == "decode" else reply[1]
        finally:
            self._checkin(worker)

    def _checkout(self, cancel: threading.Event | None) -> _Worker:
        """An idle worker, or a new one in a free slot; waits while every slot is busy."""
        idle = self._next_idle(cancel)
        if idle is not None and idle.process.is_alive():
            return idle
        if idle is not None:
            self._discard(idle)
        try:
            if self._closed:
                raise RuntimeError("the decode workers are closed")
            worker = _Worker(self._context, self.size, self.memory)
        except BaseException:
            self._idle.put(None)
            raise
        with self._lock:
            self._workers.add(worker)
        return worker

    def _next_idle(self, cancel: threading.Event | None) -> _Worker | None:
        while True:
            if cancel is not None and cancel.is_set():
                raise DecodeCancelled()
            try:
                return self._idle.get(timeout=POLL)
            except queue.Empty:
                continue

    def _checkin(self, worker: _Worker) -> None:
        """Back to the idle ones, its buffer trimmed; a discarded worker leaves its slot free."""
        with self._lock:
            kept = worker in self._workers and not self._closed
        if kept:
            worker.trim()
            self._idle.put(worker)
        else:
            worker.kill()
            self._idle.put(None)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)
        worker.kill()
