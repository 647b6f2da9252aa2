"""Files on disk: a file's sha256 (what every manifest pins a file by), and the one way a file is
replaced atomically: written beside its target under a temporary name, then renamed over it, so a
reader or a crash sees the old file or the new one, never a part of either."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def replacing(target: Path, suffix: str = ".tmp", durable: bool = True) -> Iterator[Path]:
    """A fresh path beside `target` (its folder made) for the caller to write the new file to; when the block ends
    without an error it is renamed over `target`, else removed. `durable`: the file and then its
    folder are fsynced, so the rename survives a power cut (an acknowledged write); without it a
    crash may lose the new file but still never leaves a half-written one under `target`'s name.
    `suffix` is the temporary name's ending, for writers that go by it (numpy's `.npz`)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}{suffix}")  # made by the writer, with its usual mode
    try:
        yield tmp
        if durable:
            _fsync(tmp, os.O_RDONLY)
        os.replace(tmp, target)
        if durable:
            _fsync(target.parent, os.O_RDONLY)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: Path, data: bytes, durable: bool = True) -> None:
    with replacing(path, durable=durable) as tmp:
        tmp.write_bytes(data)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
