"""How `facegate serve` runs once its command line is checked (`run`): uvicorn with the service's
connection limits and, with N > 1 workers, the host's process model around it (the workers forked
from one preloaded forkserver, their shared folder, the supervised model host).

With N > 1 workers the command's own process only supervises, so `replace_process` re-executes it
first as an interpreter that imports this module and what `run` needs, not the command line's Typer,
Rich and settings (docs/benchmarks.md, "Round 11"). The pid stays (what started `facegate serve`
holds it: a shell, systemd, a container's init), and so does the environment `serve` set for its
children."""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import nullcontext
from typing import Any, NoReturn

# `-c` puts the working directory first on the import path, where the `facegate` script does not: taken off
# before the service is imported (Python 3.11's -P would do it, but this package runs on 3.10 too).
SAFE_PATH = "import sys; sys.path[:1] == [''] and sys.path.pop(0)"
ENTRY = f"{SAFE_PATH}; from service.runtime.serving import main; main()"


class OneLineStartupFailure(logging.Filter):
    """A start-up failure (models, gallery, database) is reported as its reason, the exception's
    last line, not as the traceback Starlette hands uvicorn: the process then exits non-zero."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Traceback"):
            record.msg, record.args = f"start-up failed: {message.strip().splitlines()[-1]}", ()
        return True


def replace_process(options: dict[str, Any]) -> NoReturn:
    """`run(options)` in this process re-executed."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, [sys.executable, "-c", ENTRY, json.dumps(options)])


def main() -> None:
    from service.runtime.preload import name_process

    name_process(b"facegate-serve")  # in ps and top, where its command line is now this module's
    run(json.loads(sys.argv[1]))


def run(options: dict[str, Any]) -> None:
    """uvicorn.run's `host`, `port`, `workers`, `timeout_keep_alive`, `backlog` and
    `h11_max_incomplete_event_size`; `hosted`: the models in a model host."""
    import uvicorn

    from service.runtime.preload import fork_workers
    from service.runtime.ready_workers import host_folder
    from service.runtime.supervisor import model_host

    logging.getLogger("uvicorn.error").addFilter(OneLineStartupFailure())
    served = dict(options)
    hosted, workers = served.pop("hosted"), served["workers"]
    # Workers, their decoders and the model host are forked from one preloaded forkserver, which takes the environment
    # as it is when the first of them starts: every variable they read is set before (FACEGATE_MODEL_HOST by model_host()).
    forkserver = fork_workers() if workers > 1 else None
    with host_folder(workers), model_host(context=forkserver) if hosted else nullcontext():
        uvicorn.run(
            "service.api.app:create_app",
            factory=True,
            log_level="info",
            # h11 (the parser whose header limit h11_max_incomplete_event_size is) with a header deadline.
            http="service.api.server:HeaderDeadlineProtocol",
            # No limit_concurrency: uvicorn counts open connections against it, so idle sockets would
            # make /healthz answer 503; FACEGATE_MAX_INFLIGHT_REQUESTS limits the work instead.
            **served,
        )
