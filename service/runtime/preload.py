"""The HTTP workers of `facegate serve --workers N` forked from one preloaded process, as gunicorn's
`preload_app` forks its workers: uvicorn would start each in a fresh interpreter (multiprocessing's
spawn) that imports FastAPI, NumPy, OpenCV, FAISS and the service again, about 60 MB of private
heap per worker. Here they are forked from a multiprocessing forkserver that imported them once
(`PRELOAD`) and froze its objects (`gc.freeze`, so that the collector's passes leave their pages
shared): each worker's PSS counts its share of those pages (docs/benchmarks.md, "A worker's memory").

The forkserver is a fresh interpreter that only imports: no model session, no FAISS search, no
thread of ours runs in it before a fork (the BLAS libraries' idle pools are re-created in the child:
OpenBLAS stops them at fork). A worker is still a child process uvicorn supervises as before
(pinged, restarted under a new pid when it dies); only where it comes from changes.

A worker's decoders are forked from the same forkserver (`children_context`): it imported what
decoding needs with the app, so a worker needs no forkserver of its own (17 MiB each) and its
decoders share the preloaded pages with every worker. So is the model host (`fork_workers` returns
the context to its supervisor): the forkserver imports no onnxruntime, so no CUDA state is inherited.
`name_process` tells them apart in ps and top."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import threading
from multiprocessing import forkserver, resource_tracker
from multiprocessing.context import BaseContext, ForkServerContext
from typing import Any

log = logging.getLogger("facegate.preload")
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15  # Linux's prctl options

# The app's imports; what uvicorn and the lifespan import in a worker after it (its server, protocols
# and loop, the HTTP protocol `facegate serve` names, the SQLite store); then gc.freeze, last. A name
# that does not import (uvloop where it is not installed) is skipped by the forkserver.
PRELOAD = [
    "service.runtime.lifeline",
    "service.api.app",
    "service.api.server",
    "service.gallery.sqlite",
    "uvicorn.supervisors.multiprocess",
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.websockets.auto",
    "uvicorn.lifespan.on",
    "uvloop",
    "service.runtime.freeze_imports",
]


def fork_workers() -> ForkServerContext:
    """Have uvicorn start its workers from the preloaded forkserver (call before `uvicorn.run` and
    before anything starts that forkserver: it takes the environment as it is then); the context,
    which the model host's supervisor starts its host from too."""
    import uvicorn._subprocess  # here, not above: a decoder imports this module (children_context)

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    if not isinstance(getattr(uvicorn._subprocess, "spawn", None), BaseContext):
        log.warning("this uvicorn starts its workers its own way: each imports the app again (more memory per worker)")
    else:
        uvicorn._subprocess.spawn = context  # type: ignore[assignment]  # uvicorn's one start method, read at each start
    return context


def name_process(name: bytes) -> None:
    """The name `ps`, `top` and /proc/PID/comm show (Linux's PR_SET_NAME, 15 bytes): the workers,
    their decoders and the model host are forked from one forkserver and share its command line."""
    _prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]))


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL to this process once its parent exits (Linux's PR_SET_PDEATHSIG; elsewhere nothing):
    `parent` is the pid it should have (a forked child's), else the one it has now. A parent gone
    before the signal was set is found by its pid: this process exits at once."""
    expected = os.getppid() if parent is None else parent
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() != expected:
        os._exit(1)


def _prctl(option: int, argument: Any) -> bool:
    """Linux's prctl(2) with one argument; False where it is refused or the C library has none."""
    try:
        return bool(ctypes.CDLL(None).prctl(option, argument, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children_context(preload: list[str]) -> ForkServerContext:
    """The context this process starts its own children with (a worker's decoders): the forkserver
    it was forked from, where it was (a worker of `facegate serve --workers N`), else a forkserver of
    its own that preloads `preload`.

    multiprocessing starts a forkserver per process that asks for one, although a process forked by
    one knows its address and holds its "alive" pipe, which keeps it running while the process lives
    (its docstring says a child "will usually reuse" its parent's; its code starts another). So
    `ensure_running` is replaced on this process's forkserver handle: nothing to start while that
    forkserver is still this process's parent (Linux: /proc names it); once it is gone (this process
    re-parented), the standard one again, which starts a forkserver of this process's own. Not where the handle
    authenticates its connections (Python 3.14's authkey): a forkserver of its own there."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)  # for a forkserver this process starts itself
    server: Any = forkserver._forkserver
    inherited = server._forkserver_address is not None and server._forkserver_alive_fd is not None
    if not inherited or server._forkserver_pid is not None or hasattr(server, "_forkserver_authkey") or "ensure_running" in vars(server):
        return context
    parent = os.getppid()
    if not _is_forkserver(parent):  # it is gone already (this process re-parented), or no /proc to tell
        return context

    switching = threading.Lock()  # decoders start from several threads at once

    def ensure_running() -> None:
        with switching:
            if os.getppid() == parent:
                resource_tracker.ensure_running()
                return
            if "ensure_running" in vars(server):
                log.warning("the forkserver this worker was forked from is gone: its decoders start from one of its own")
                del server.ensure_running
        server.ensure_running()

    server.ensure_running = ensure_running
    return context


def _is_forkserver(pid: int) -> bool:
    """Whether process `pid` is a multiprocessing forkserver (its command line, Linux /proc)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"multiprocessing.forkserver" in cmdline.read()
    except OSError:
        return False
