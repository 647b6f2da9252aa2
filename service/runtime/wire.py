"""The messages between a worker and its model host. A run and its answer, two to four of them an
image, are fixed binary records (what a pickled tuple said, in a fifth of its CPU), and the answers
a host's writer finds waiting go out as one message, read at one wake-up of the worker's reader;
everything else (hello, ping, ready, metrics, errors, a run whose pixels travel inline) is pickled.
A pickle starts with its protocol byte (0x80), a record with its kind, so one read tells them apart."""

from __future__ import annotations

import pickle
import struct
from collections.abc import Iterable

SOCKET = "models.sock"  # the file a host listens on, in its folder
SUPERVISED = "supervised.lock"  # beside it: locked by its supervisor while it supervises (`model_host.exit_with_supervisor`)
PING_TIMEOUT = 5.0  # seconds without an answer to a ping after which a host is hung, for its supervisor and its workers alike
RECORD = struct.Struct("<cBQq4s4q")  # kind, dimensions, number, arena offset, dtype, shape (up to four dimensions)
_KINDS = {b"d": "detect", b"e": "embed", b"D": "done"}
_CODES = {name: code for code, name in _KINDS.items()}


def record(kind: str, number: int, offset: int, shape: tuple[int, ...], dtype: str) -> bytes | None:
    """One run ('detect', 'embed') or answer ('done') of an array in the arena at `offset`; None
    when its shape or dtype does not fit a record (it goes pickled)."""
    if len(shape) > 4 or len(dtype) > 4:
        return None
    return RECORD.pack(_CODES[kind], len(shape), number, offset, dtype.encode(), *shape, *(0,) * (4 - len(shape)))


def pickled(message: tuple) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def joined(records: Iterable[bytes]) -> bytes:
    """Records sent as one message."""
    return b"".join(records)


def is_record(data: bytes) -> bool:
    return data[:1] in _KINDS


def messages(data: bytes) -> list[tuple]:
    """A message read → the tuples it holds: ('run', number, role, offset, shape, dtype, None) and
    ('done', number, offset, shape, dtype, None) for records, the pickled tuple otherwise."""
    if not is_record(data):
        return [pickle.loads(data)]
    found = []
    for code, ndim, number, offset, dtype, *shape in RECORD.iter_unpack(data):
        kind, dims, dtype_str = _KINDS[code], tuple(shape[:ndim]), dtype.rstrip(b"\0").decode()
        found.append(
            ("done", number, offset, dims, dtype_str, None) if kind == "done" else ("run", number, kind, offset, dims, dtype_str, None)
        )
    return found
