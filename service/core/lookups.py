"""Lookups over arrays that a gallery's snapshot maps (service/gallery/snapshot.py): a face's row or
subject code by its id, a subject's name by its code and its code by its name. A worker that maps
the snapshot thus holds no Python object per face or subject (issue 44: at 100,000 faces the dicts
and the list of names held instead took 26 MiB per worker, docs/benchmarks.md). What changes after
the arrays were made is kept in small dicts of their own: a worker's delta, as the mapped pages it
writes are."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

import numpy as np


class ById:
    """Face id → an int ≥ 0 (a guard's row, a roster's subject code): ids sorted with their values,
    searched by `np.searchsorted`, and the ids set or dropped since, in a dict (−1: dropped)."""

    def __init__(self, ids: np.ndarray | None = None, values: np.ndarray | None = None):
        self._ids = np.empty(0, np.int64) if ids is None else ids  # sorted
        self._values = np.empty(0, np.int64) if values is None else values
        self._changed: dict[int, int] = {}

    @classmethod
    def of(cls, ids: np.ndarray, values: np.ndarray) -> ById:
        """These ids (unique, in any order) and their values."""
        return cls(*by_id(ids, values))

    def get(self, face_id: int) -> int:
        """The id's value; −1 for an id not held."""
        value = self._changed.get(face_id)
        return self._base(face_id) if value is None else value

    def set(self, face_id: int, value: int) -> None:
        self._changed[face_id] = value

    def pop(self, face_id: int) -> int:
        """The id's value (−1: not held), and the id dropped."""
        value = self.get(face_id)
        if value >= 0:
            if self._base(face_id) >= 0:
                self._changed[face_id] = -1
            else:
                del self._changed[face_id]
        return value

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every id held, sorted, and their values: what a new `ById` is made of."""
        changed = np.fromiter(self._changed, np.int64, len(self._changed))
        values = np.fromiter(self._changed.values(), np.int64, len(self._changed))
        kept = ~np.isin(self._ids, changed)
        held = values >= 0
        return by_id(np.concatenate([self._ids[kept], changed[held]]), np.concatenate([self._values[kept], values[held]]))

    def _base(self, face_id: int) -> int:
        at = int(np.searchsorted(self._ids, face_id))
        return int(self._values[at]) if at < len(self._ids) and self._ids[at] == face_id else -1


def by_id(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """These ids (unique) sorted, and their values in that order: a `ById`'s arrays."""
    order = np.argsort(ids, kind="stable")
    return np.asarray(ids, np.int64)[order], np.asarray(values, np.int64)[order]


class Names:
    """Subjects by code (what a guard's or roster's subject arrays hold) and codes by subject: the
    names' UTF-8 bytes end to end with each one's offset, and the codes in the names' order, searched
    by bisection; the subjects coded since, in a list and a dict of their own."""

    def __init__(self, data: np.ndarray | None = None, offsets: np.ndarray | None = None, order: np.ndarray | None = None):
        self._data = np.empty(0, np.uint8) if data is None else data
        self._offsets = np.zeros(1, np.int64) if offsets is None else offsets  # name i: data[offsets[i] : offsets[i + 1]]
        self._order = np.empty(0, np.int64) if order is None else order  # the codes, by their names' bytes
        self._base = len(self._offsets) - 1
        self._added: list[str] = []
        self._codes: dict[str, int] = {}

    @classmethod
    def of(cls, names: Iterable[str]) -> Names:
        """These names (unique), coded in this order."""
        encoded = [name.encode() for name in names]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        order = np.array(sorted(range(len(encoded)), key=encoded.__getitem__), np.int64)
        return cls(np.frombuffer(b"".join(encoded), np.uint8).copy(), offsets, order)

    @classmethod
    def restore(cls, arrays: dict[str, np.ndarray]) -> Names:
        """The names `arrays()` held (mapped: read in place)."""
        return cls(arrays["names"], arrays["name_offsets"], arrays["name_order"])

    def arrays(self) -> dict[str, np.ndarray]:
        """Every name, as arrays for `restore` in another process: the names coded since appended,
        each one's code inserted where its name falls in the order (a bisection each)."""
        encoded = [name.encode() for name in self._added]
        lengths = np.cumsum([len(e) for e in encoded], dtype=np.int64)
        new = sorted(range(len(encoded)), key=encoded.__getitem__)
        at = [bisect_left(self._order, encoded[i], key=self._bytes) for i in new]
        return {
            "names": np.concatenate([self._data, np.frombuffer(b"".join(encoded), np.uint8)]),
            "name_offsets": np.concatenate([self._offsets, self._offsets[-1] + lengths]),
            "name_order": np.insert(self._order, at, np.array(new, np.int64) + self._base),
        }

    def __len__(self) -> int:
        return self._base + len(self._added)

    def __getitem__(self, code: int) -> str:
        if code >= self._base:
            return self._added[code - self._base]
        return self._bytes(code).decode()

    def code(self, name: str) -> int:
        """The name's code; −1 for a name not coded."""
        code = self._codes.get(name)
        if code is not None:
            return code
        key = name.encode()
        at = bisect_left(self._order, key, key=self._bytes)
        return int(self._order[at]) if at < self._base and self._bytes(self._order[at]) == key else -1

    def coded(self, name: str) -> int:
        """The name's code, the next one if it had none."""
        code = self.code(name)
        if code < 0:
            code = self._codes[name] = len(self)
            self._added.append(name)
        return code

    def _bytes(self, code: int) -> bytes:
        return self._data[self._offsets[code] : self._offsets[code + 1]].tobytes()
