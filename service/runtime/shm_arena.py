"""Memory a worker process shares with the model host: a file on a RAM-backed file system (the
model host's private folder under /dev/shm where it exists), mapped by both. The worker writes a
model's input (a canvas, crops) into blocks of it, the host reads them in place and writes the
output back over them, so pixels never pass through the socket. The space is reserved when the
file is made (posix_fallocate): a /dev/shm too small is a smaller arena at start-up, never a
SIGBUS in the middle of a request. What does not fit travels inline in the message instead.

An arena is named for the worker that made it (`arena-<pid>`): a worker that crashes (uvicorn
starts its replacement under a new pid) cannot remove its own, so whoever outlives it does
(`sweep`, which the model host's supervisor runs). NumPy is imported where an arena's blocks are
read as arrays (the worker and the host have it already), not with the module: `facegate serve`'s
process imports it only to sweep, and NumPy would add 16 MiB there."""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

BLOCK = 64 * 1024
PREFIX = "arena-"


def arena_path(folder: Path, pid: int) -> Path:
    """Where the worker process `pid` keeps its arena."""
    return folder / f"{PREFIX}{pid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def sweep(folder: Path) -> list[Path]:
    """Remove the arenas in `folder` whose worker is gone; the paths removed. The model host may
    still map one: its memory is freed once the host unmaps it too."""
    removed = []
    for path in folder.glob(f"{PREFIX}*"):
        pid = path.name.removeprefix(PREFIX)
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class Arena:
    def __init__(self, path: Path, size: int, create: bool = False):
        """Map the arena at `path`: made and reserved (`create`, the worker's side), or opened (the host's)."""
        self.path = Path(path)
        self.size = size - size % BLOCK
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.posix_fallocate(fd, 0, self.size)
            self._map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            if create:
                self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._free = bytearray(b"\1") * (self.size // BLOCK)
        self._lock = threading.Lock()

    @classmethod
    def reserve(cls, path: Path, size: int, smallest: int = 4 * 1024 * 1024) -> Arena | None:
        """An arena of `size` bytes, or of the largest half, quarter… of it the file system can
        reserve down to `smallest`; None when not even that fits (every payload then goes inline)."""
        while size >= smallest:
            try:
                return cls(path, size, create=True)
            except OSError:
                size //= 2
        return None

    def allocate(self, nbytes: int) -> int | None:
        """The offset of `nbytes` of free blocks, or None when no run of free blocks is that long."""
        blocks = max(1, -(-nbytes // BLOCK))
        with self._lock:
            start = self._free.find(b"\1" * blocks)
            if start < 0:
                return None
            self._free[start : start + blocks] = b"\0" * blocks
        return start * BLOCK

    def release(self, offset: int, nbytes: int) -> None:
        blocks = max(1, -(-nbytes // BLOCK))
        with self._lock:
            self._free[offset // BLOCK : offset // BLOCK + blocks] = b"\1" * blocks

    def view(self, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """The array at `offset`, in place (no copy)."""
        import numpy as np

        return np.ndarray(shape, np.dtype(dtype), buffer=self._map, offset=offset)

    def put(self, array: np.ndarray) -> int | None:
        """Copy `array` into newly allocated blocks; their offset, or None when it does not fit."""
        import numpy as np

        offset = self.allocate(array.nbytes)
        if offset is not None:
            np.copyto(self.view(offset, array.shape, array.dtype.str), array)
        return offset

    def close(self, unlink: bool = False) -> None:
        try:
            self._map.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with the process
            pass
        if unlink:
            self.path.unlink(missing_ok=True)
