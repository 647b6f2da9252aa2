"""CPU clocks per stage inside every process of a `facegate serve --workers N` (its HTTP workers,
their decoder processes, the model host), installed from outside the service: `cpu_budget.py`
puts a `sitecustomize` on the server's PYTHONPATH that calls `install()`, which wraps functions of
the service and of the libraries it calls as each module is first imported. Nothing in `service/`
knows of it, so the figures are those of the code as it ships (plus the wrappers' own cost, which
is calibrated and taken out).

A wrapped call is a *region*: its thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) from entry to exit,
less that of the regions it calls (so each row is exclusive), keyed by the path of regions it ran
under (`send` inside a decoder round trip is not `send` inside a model-host run). Besides the
regions, each process reports every thread's CPU clock (onnxruntime's threads too, named by the
model whose session made them) and its own total (`getrusage`), so what no region covers is
reported as the remainder instead of disappearing. On request (`generation` written in the probe's
folder) each process writes its figures to `<generation>-<pid>.json` there. Linux only: it reads
other threads' CPU clocks by thread id, and lists them in /proc/self/task."""

from __future__ import annotations

import functools
import importlib.abc
import json
import math
import os
import re
import resource
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FOLDER = "FACEGATE_CPU_PROBE_DIR"
REGIONS = "FACEGATE_CPU_PROBE_REGIONS"  # "0": process and thread clocks only, no function wrapped (the control run)
POLL = 0.1  # seconds between looks for a new generation
THREAD = "facegate-cpu-probe"  # the probe's own thread, which the benchmark leaves out

_clock = time.thread_time_ns
_local = threading.local()
_tables: list[tuple[str, dict[tuple[str, ...], list[int]]]] = []  # per thread: its role, path → [ns, calls, child calls, bytes]
_lock = threading.Lock()
_role = "other"
_model_threads: dict[int, str] = {}  # native thread id → the model whose onnxruntime session started it
_cost = (0.0, 0.0)  # the wrappers' own ns per call: inside the region, and left in its caller


def _thread_role(name: str) -> str:
    """A thread's name without its number: the pool it belongs to."""
    return re.sub(r"[_-]?\d+$", "", name)


def _thread_table() -> dict[tuple[str, ...], list[int]]:
    table = getattr(_local, "table", None)
    if table is None:
        table = _local.table = {}
        _local.stack = []
        with _lock:
            _tables.append((_thread_role(threading.current_thread().name), table))
    return table


def region(label: str | Callable[..., str], fn: Callable, nbytes: Callable[[tuple, Any], int] | None = None) -> Callable:
    """`fn` timed as a region named `label` (or `label(*args)`); `nbytes(args, result)`: the bytes
    it copies, for the copy count."""

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        table = _thread_table()
        stack = _local.stack
        name = label if isinstance(label, str) else label(*args)
        frame = [(*stack[-1][0], name) if stack else (name,), 0, 0]  # path, children's ns, children's calls
        stack.append(frame)
        start = _clock()
        result, returned = None, False
        try:
            result = fn(*args, **kwargs)
            returned = True
            return result
        finally:
            _account(table, stack, frame, _clock() - start, nbytes(args, result) if nbytes is not None and returned else 0)

    return timed


class _TimedCoroutine:
    """A coroutine whose every step (from a resumption to its next suspension) is a region: the CPU
    an async function spends on the event loop's thread, while other requests' steps interleave.
    Its calls count steps."""

    __slots__ = ("coro", "label")

    def __init__(self, coro, label: str):
        self.coro, self.label = coro, label

    def __await__(self):
        coro, value, error = self.coro, None, None
        while True:
            table = _thread_table()
            stack = _local.stack
            frame = [(*stack[-1][0], self.label) if stack else (self.label,), 0, 0]
            stack.append(frame)
            start = _clock()
            done, result = False, None
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                done, result = True, stop.value
            finally:
                _account(table, stack, frame, _clock() - start)
            if done:
                return result
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in (a cancellation): passed on to the coroutine
                value, error = None, exc


def async_region(label: str, fn: Callable) -> Callable:
    """An async function whose calls' steps are timed (still a coroutine function: a task can run it)."""

    @functools.wraps(fn)
    async def timed(*args, **kwargs):
        return await _TimedCoroutine(fn(*args, **kwargs), label)

    return timed


def _account(table: dict, stack: list, frame: list, spent: int, nbytes: int = 0) -> None:
    """A region's call done: its exclusive time into its row, its whole time into its caller's children."""
    stack.pop()
    if stack:
        stack[-1][1] += spent
        stack[-1][2] += 1
    row = table.get(frame[0])
    if row is None:
        row = table[frame[0]] = [0, 0, 0, 0]
    row[0] += spent - frame[1]
    row[1] += 1
    row[2] += frame[2]
    row[3] += nbytes


def _calibrate(rounds: int = 3000) -> tuple[float, float]:
    """(ns an empty region measures inside itself, ns a region adds to its caller's exclusive time),
    each the median of a few batches: what the wrappers cost, taken out of every row."""
    inner_fn = region("calibration", lambda: None)
    outer_fn = region("calibration-outer", lambda: inner_fn())
    bare_fn = region("calibration-bare", lambda: None)
    inside, left = [], []
    table = _thread_table()
    for _ in range(5):
        for key in list(table):
            if key[0].startswith("calibration"):
                del table[key]
        for _ in range(rounds):
            outer_fn()
            bare_fn()
        inside.append(table[("calibration-outer", "calibration")][0] / rounds)
        left.append((table[("calibration-outer",)][0] - table[("calibration-bare",)][0]) / rounds)
    for key in list(table):
        if key[0].startswith("calibration"):
            del table[key]
    return sorted(inside)[2], max(0.0, sorted(left)[2])


def _thread_clock(tid: int) -> int | None:
    """A thread's CPU time in ns (Linux's per-thread CPU clock id, which any thread of the process may read)."""
    try:
        return time.clock_gettime_ns(((~tid) << 3) | 6)
    except OSError:
        return None


def _thread_roles() -> dict[int, str]:
    names = {t.native_id: _thread_role(t.name) for t in threading.enumerate() if t.native_id is not None}
    roles = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        roles[tid] = names.get(tid) or (f"onnxruntime threads ({_model_threads[tid]})" if tid in _model_threads else "native threads")
    return roles


def snapshot() -> dict:
    """This process's figures so far: its role, total CPU, each thread's CPU (by id, with its role)
    and every region by thread role and path."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    threads = {tid: [role, ns] for tid, role in _thread_roles().items() if (ns := _thread_clock(tid)) is not None}
    regions: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    with _lock:
        tables = list(_tables)
    for thread, table in tables:
        for path, row in list(table.items()):
            total = regions.setdefault((thread, path), [0, 0, 0, 0])
            for i, value in enumerate(row):
                total[i] += value
    return {
        "pid": os.getpid(),
        "role": _role,
        "process_ns": int((usage.ru_utime + usage.ru_stime) * 1e9),
        "threads": threads,
        "regions": [[thread, list(path), *row] for (thread, path), row in regions.items()],
        "wrapper_ns": list(_cost),
    }


def _serve_snapshots(folder: Path) -> None:
    """Write a snapshot whenever the benchmark asks for a new generation."""
    seen = None
    request = folder / "generation"
    while True:
        time.sleep(POLL)
        try:
            generation = request.read_text().strip()
        except OSError:
            continue
        if generation and generation != seen:
            seen = generation
            out = folder / f"{generation}-{os.getpid()}.json"
            temporary = out.with_suffix(".tmp")
            temporary.write_text(json.dumps(snapshot()))
            os.replace(temporary, out)


def _start(folder: Path) -> None:
    (folder / f"alive-{os.getpid()}").touch()
    threading.Thread(target=_serve_snapshots, args=(folder,), name=THREAD, daemon=True).start()


def _after_fork(folder: Path) -> None:
    """A forked child (a decoder process) starts from zero, with its own snapshot thread."""
    global _local, _lock, _role, _tables
    _local = threading.local()
    _lock = threading.Lock()
    _tables = []
    _role = "other"
    _start(folder)


def _set_role(role: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def entered(*args, **kwargs):
        global _role
        _role = role
        return fn(*args, **kwargs)

    return entered


def _recording_threads(fn: Callable) -> Callable:
    """`load_model`, remembering the threads its onnxruntime session started as that model's."""

    @functools.wraps(fn)
    def load(name_or_path, *args, **kwargs):
        before = set(os.listdir("/proc/self/task"))
        loaded = fn(name_or_path, *args, **kwargs)
        for tid in set(os.listdir("/proc/self/task")) - before:
            _model_threads[int(tid)] = Path(str(name_or_path)).stem
        return loaded

    return load


def _wrap(owner: Any, attribute: str, label: str | Callable[..., str], nbytes: Callable[[tuple, Any], int] | None = None) -> None:
    setattr(owner, attribute, region(label, getattr(owner, attribute), nbytes))


def _wrap_async(owner: Any, attribute: str, label: str) -> None:
    setattr(owner, attribute, async_region(label, getattr(owner, attribute)))


def _patch_middleware(m: Any) -> None:
    for name in ("RequestMetrics", "ApiKeyAuth", "BodyLimit", "CancelOnDisconnect", "Admission"):
        if hasattr(m, name):
            _wrap_async(getattr(m, name), "__call__", f"middleware {name}")


def _patch_connection(m: Any) -> None:
    _wrap(m._ConnectionBase, "send", "send")
    _wrap(m._ConnectionBase, "recv", "recv")
    _wrap(m._ConnectionBase, "send_bytes", "send")
    _wrap(m._ConnectionBase, "recv_bytes", "recv")
    _wrap(m._ConnectionBase, "poll", "poll")


def _patch_decode(m: Any) -> None:
    _wrap(m, "probe", "probe (header)")
    _wrap(m, "decode_probed", "decode (OpenCV)")


def _job_bytes(args: tuple, result: tuple) -> int:
    """A decoder job's copies: the image's bytes out of the shared buffer, and its pixels into it."""
    return args[2] + (math.prod(result[1]) if result[0] == "image" else 0)


def _patch_decode_workers(m: Any) -> None:
    _wrap(m, "_job", lambda buffer, op, count, *_: f"{op} job", _job_bytes)
    _wrap(m._Worker, "ask", lambda self, op, *_: f"{op} round trip", lambda args, result: len(args[2]))
    _wrap(m._Worker, "pixels", "pixels copied out", lambda args, result: result.nbytes)
    _wrap(m.DecodeWorkers, "probe", "probe in a decoder")
    _wrap(m.DecodeWorkers, "decode", "decode in a decoder")


def _patch_detector(m: Any) -> None:
    _wrap(m.FaceDetector, "letterbox", "letterbox", lambda args, result: result[0].nbytes)
    _wrap(m.FaceDetector, "infer", "detector run")
    _wrap(m.FaceDetector, "_candidates", "detect post: candidates")
    _wrap(m.FaceDetector, "faces", "detect post: NMS, faces")


def _patch_embedder(m: Any) -> None:
    _wrap(m.FaceEmbedder, "embed", "embedder run")
    _wrap(m, "preprocess", "embed pre: preprocess", lambda args, result: result.nbytes)
    _wrap(m, "l2_normalize", "embed post: normalize")


def _patch_pipeline(m: Any) -> None:
    _wrap(m.FacePipeline, "align", "align", lambda args, result: result.nbytes)
    _wrap(m.FacePipeline, "_select", "select faces")
    _wrap(m, "advance", "pipeline steps")


def _patch_engine(m: Any) -> None:
    _wrap(m.Engine, "_start", "start: decode, letterbox")
    _wrap_async(m.Engine, "faces", "engine (its steps on the loop)")


def _patch_hosted(m: Any) -> None:
    _wrap(m.HostedModels, "_submit", lambda self, role, rows: f"{role} sent to the model host")
    _wrap(m.HostedModels, "_answer", "answer from the model host")


def _patch_model_host(m: Any) -> None:
    _wrap(m._Worker, "_handle", lambda self, message: f"handle {message[0]}")
    _wrap(m._Worker, "_send", "answer sent")


def _patch_batching(m: Any) -> None:
    _wrap(m.MicroBatcher, "_run_batch", lambda self, jobs: f"{self.role} batch", lambda args, result: sum(j.rows.nbytes for j in args[1]))
    _wrap(m.MicroBatcher, "_collect", lambda self, first: f"{self.role} batch collected")


# What each process is and which model started which onnxruntime thread, patched even without the regions.
ROLE_PATCHES: dict[str, Callable[[Any], None]] = {
    "service.runtime.decode_workers": lambda m: setattr(m, "serve", _set_role("decoder", m.serve)),
    "service.engine": lambda m: setattr(m.Engine, "__init__", _set_role("worker", m.Engine.__init__)),
    "service.runtime.model_host": lambda m: setattr(m, "run_host", _set_role("model host", m.run_host)),
    "service.core.models.files": lambda m: setattr(m, "load_model", _recording_threads(m.load_model)),
}
PATCHES: dict[str, Callable[[Any], None]] = {
    "multiprocessing.connection": _patch_connection,
    "concurrent.futures._base": lambda m: _wrap(m.Future, "set_result", "future set (wakes its waiter)"),
    "onnxruntime.capi.onnxruntime_inference_collection": lambda m: _wrap(m.InferenceSession, "run", "onnxruntime run"),
    "h11._connection": lambda m: (_wrap(m.Connection, "send", "h11 send"), _wrap(m.Connection, "next_event", "h11 parse")),
    "python_multipart.multipart": lambda m: _wrap(m.MultipartParser, "write", "multipart parse"),
    "starlette.responses": lambda m: _wrap(m.JSONResponse, "render", "JSON response"),
    "service.api.requests": lambda m: (
        _wrap(m, "validated", "options validated"),
        _wrap_async(m, "read_image_request", "request read (body, form)"),
    ),
    "service.api.middleware": _patch_middleware,
    "service.api.admission": _patch_middleware,
    "uvicorn.protocols.http.h11_impl": lambda m: (
        _wrap(m.H11Protocol, "data_received", "HTTP data received"),
        _wrap_async(m.RequestResponseCycle, "run_asgi", "ASGI request (Starlette, FastAPI)"),
    ),
    "starlette.routing": lambda m: _wrap_async(m.Router, "__call__", "router (Starlette's routing, FastAPI's request handler)"),
    "starlette.middleware.exceptions": lambda m: _wrap_async(m.ExceptionMiddleware, "__call__", "exception middleware"),
    "starlette.middleware.errors": lambda m: _wrap_async(m.ServerErrorMiddleware, "__call__", "server error middleware"),
    "fastapi.dependencies.utils": lambda m: _wrap_async(m, "solve_dependencies", "dependencies solved"),
    "fastapi.routing": lambda m: (
        _wrap_async(m, "serialize_response", "response validated, serialized"),
        _wrap_async(m, "run_endpoint_function", "route handler"),
    ),
    "service.api.deps": lambda m: _wrap(m.Service, "search", "gallery search"),
    "service.core.decision": lambda m: [_wrap(m, f, "decision") for f in ("decide", "decide_subject", "decide_search")],
    "service.core.decode": _patch_decode,
    "service.core.alignment": lambda m: _wrap(m, "similarity_transform", "similarity transform (numpy)"),
    "service.gallery.index": lambda m: _wrap(m, "best_subjects", "index searched, faces looked up"),
    "service.gallery.sqlite": lambda m: _wrap(m.SqliteGallery, "_loaded", "change log followed (SQLite)"),
    "service.runtime.decode_workers": _patch_decode_workers,
    "service.core.models.detector": _patch_detector,
    "service.core.models.embedder": _patch_embedder,
    "service.core.pipeline": _patch_pipeline,
    "service.engine": _patch_engine,
    "service.runtime.hosted_models": _patch_hosted,
    "service.runtime.model_host": _patch_model_host,
    "service.runtime.shm_arena": lambda m: _wrap(m.Arena, "put", "shared-memory copy", lambda args, result: args[1].nbytes),
    "service.runtime.batching": _patch_batching,
}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies a module's patches right after the module runs, before anything imports names from it."""

    def __init__(self, patches: dict[str, list[Callable[[Any], None]]]):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader, patches = spec.loader, self.patches[name]
        run = loader.exec_module

        def exec_module(module):
            run(module)
            for patch in patches:
                patch(module)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called by the benchmark's sitecustomize in every process of the server."""
    global _cost
    folder = Path(os.environ[FOLDER])
    patches: dict[str, list[Callable[[Any], None]]] = {}
    for table in (ROLE_PATCHES, PATCHES) if os.environ.get(REGIONS, "1") != "0" else (ROLE_PATCHES,):
        for name, patch in table.items():
            patches.setdefault(name, []).append(patch)
    for name in [n for n in patches if n in sys.modules]:
        for patch in patches.pop(name):
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport(patches))
    _cost = _calibrate()
    os.register_at_fork(after_in_child=lambda: _after_fork(folder))
    _start(folder)
