"""Model hosts that stand in for the real one in the supervisor's tests (each the target of a
spawned process, given the folder of its socket): one that answers pings, one that listens but
never answers (hung), one that exits at once, and one that stays up a while on one of its starts."""

from __future__ import annotations

import os
import threading
from multiprocessing.connection import Connection, Listener
from pathlib import Path

SOCKET = "models.sock"  # model_host.SOCKET (test_supervisor checks it), not imported: a stand-in then starts in a fraction of the time


def _answer(connection: Connection, answering: bool) -> None:
    try:
        while True:
            message = connection.recv()
            if answering and message[0] == "ping":
                connection.send(("ping", message[1], {"warmed": True, "warmup_error": None}))
    except (EOFError, OSError):
        pass


def _listen(folder: str, answering: bool, seconds: float | None = None) -> None:
    listener = Listener(str(Path(folder) / SOCKET), family="AF_UNIX")
    if seconds is not None:
        threading.Timer(seconds, os._exit, (0,)).start()
    while True:
        threading.Thread(target=_answer, args=(listener.accept(), answering), daemon=True).start()


def answering(folder: str) -> None:
    _listen(folder, answering=True)


def hanging(folder: str) -> None:
    _listen(folder, answering=False)


def dying(folder: str) -> None:
    raise SystemExit(3)


def up_on_start(folder: str, start: int, seconds: float) -> None:
    """Exits at once, except on its `start`-th start (counted in the folder), when it answers for `seconds`."""
    counter = Path(folder) / "starts"
    count = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(count))
    if count == start:
        _listen(folder, answering=True, seconds=seconds)
    raise SystemExit(3)
