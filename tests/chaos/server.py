"""`facegate serve` of this checkout as the chaos tests run it: a free 127.0.0.1 port, the given
settings on top of this environment (API keys and the database unset unless given), its output in
a log file; stopped at the end of the block."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.service.api.test_server_process import free_port

INHERITED_OFF = ("FACEGATE_API_KEYS", "FACEGATE_API_KEYS_FILE", "FACEGATE_DATABASE_URL")


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
