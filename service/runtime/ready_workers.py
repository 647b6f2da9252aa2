"""Which workers of one `facegate serve --workers N` are ready, so that /readyz speaks for the host.

uvicorn's workers share one listening socket, and each accepts from it once its lifespan start-up
returns: the models' warm-up and the gallery's first build go on after that, in the background, so
that the port answers meanwhile. A worker still starting therefore takes its share of the
connections and answers their image requests 503, while another worker's /readyz already said 200.
So each worker, once ready, holds a lock on a file of its own in a folder `facegate serve` made for
the host (FACEGATE_READY_WORKERS_DIR), and every worker's /readyz is 200 only while all N locks are
held. The kernel drops a lock with its process, however it ends (kill -9 too): uvicorn's
replacement of a crashed worker counts once it is ready itself, and a file whose lock can be taken
is a dead worker's, removed by whoever finds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: `facegate serve`'s supervising process imports this without the settings
    from service.core.settings import Settings

PREFIX = "ready-"


@contextlib.contextmanager
def host_folder(workers: int) -> Iterator[None]:
    """While `facegate serve` runs N > 1 workers: a private folder for their files, set with N in
    the environment its workers inherit (FACEGATE_READY_WORKERS_DIR, FACEGATE_WORKERS)."""
    if workers < 2:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="facegate-workers-") as folder:
        os.environ["FACEGATE_READY_WORKERS_DIR"] = folder
        os.environ["FACEGATE_WORKERS"] = str(workers)
        yield


def one_of_several(settings: Settings) -> bool:
    """Whether this process is a worker of `facegate serve --workers N`, N > 1 (`host_folder` set both)."""
    return settings.ready_workers_dir is not None and settings.workers > 1


class ReadyWorkers:
    def __init__(self, folder: Path, expected: int):
        self.folder, self.expected = Path(folder), expected
        self._fd: int | None = None  # this worker's lock, once it is ready

    @classmethod
    def for_settings(cls, settings: Settings) -> ReadyWorkers | None:
        """A worker of several has the host's folder; one process, none."""
        if not one_of_several(settings) or settings.ready_workers_dir is None:
            return None
        return cls(settings.ready_workers_dir, settings.workers)

    def mark_ready(self) -> None:
        """This worker answers from now on: its file locked until `close` or its end. Locked before
        it takes its name (a rename), so no reader ever finds it unlocked and takes it for a dead one's."""
        if self._fd is not None:
            return
        path = self.folder / f"{PREFIX}{os.getpid()}"
        starting = path.with_name(f".{path.name}")
        fd = os.open(starting, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(starting, path)
        self._fd = fd

    def count(self) -> int:
        """The workers ready now (their locks held, this one's too); dead workers' files removed."""
        ready = 0
        for path in self.folder.glob(f"{PREFIX}*"):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # its worker stopped meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                ready += 1
            else:  # nobody holds it: its worker is gone (unless a new one took the name since: same file only)
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == os.fstat(fd).st_ino:
                        path.unlink()
            finally:
                os.close(fd)
        return ready

    def problem(self) -> str | None:
        """Why the host is not ready although this worker may be: another worker still starting."""
        ready = self.count()
        if ready >= self.expected:
            return None
        return (
            f"{ready} of {self.expected} workers ready: the others are still starting (warm-up, the gallery's index), "
            "and a connection one of them accepts is answered 503 meanwhile"
        )

    def close(self) -> None:
        """This worker stops answering: no longer counted."""
        fd, self._fd = self._fd, None
        if fd is not None:
            (self.folder / f"{PREFIX}{os.getpid()}").unlink(missing_ok=True)
            os.close(fd)
