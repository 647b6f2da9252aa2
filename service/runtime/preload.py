"""The HTTP workers of `facegate serve --workers N` forked from one preloaded process, as gunicorn's
`preload_app` forks its workers: uvicorn would start each in a fresh interpreter (multiprocessing's
spawn) that imports FastAPI, NumPy, OpenCV, FAISS and the service again, about 60 MB of private
heap per worker. Here they are forked from a multiprocessing forkserver that imported them once
(`PRELOAD`) and froze its objects (`gc.freeze`, so that the collector's passes leave their pages
shared): each worker's PSS counts its share of those pages (docs/benchmarks.md, "A worker's memory").

The forkserver is a fresh interpreter that only imports: no model session, no FAISS search, no
thread of ours runs in it before a fork (the BLAS libraries' idle pools are re-created in the child:
OpenBLAS stops them at fork). A worker is still a child process uvicorn supervises as before
(pinged, restarted under a new pid when it dies); only where it comes from changes."""

from __future__ import annotations

import logging
import multiprocessing
from multiprocessing.context import BaseContext

import uvicorn._subprocess

log = logging.getLogger("facegate.preload")

# The app's imports; what uvicorn and the lifespan import in a worker after it (its server, protocols
# and loop, the HTTP protocol `facegate serve` names, the SQLite store); then gc.freeze, last. A name
# that does not import (uvloop where it is not installed) is skipped by the forkserver.
PRELOAD = [
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


def fork_workers() -> None:
    """Have uvicorn start its workers from the preloaded forkserver (call before `uvicorn.run`)."""
    if not isinstance(getattr(uvicorn._subprocess, "spawn", None), BaseContext):
        log.warning("this uvicorn starts its workers its own way: each imports the app again (more memory per worker)")
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    uvicorn._subprocess.spawn = context  # type: ignore[assignment]  # uvicorn's one start method, read at each start
