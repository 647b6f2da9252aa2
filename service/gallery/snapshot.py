"""The gallery's derived state saved once per host and memory-mapped by every worker process: the
open-set guard's arrays (or the roster's: ids and subjects) and the faces' vectors, which a flat
index searches in place. `facegate serve --workers N` thus builds the guard once (O(N²): 37 s CPU at
100k faces) and holds one copy of it and of the flat index's faces in the page cache, not N.

One process builds under the snapshot's file lock while the others wait for it, then each maps
what it saved: the guard's arrays copy-on-write (a change writes private copies of the pages it
touches: the per-worker delta; each array has room for 1/8 more faces, so adding one does not copy
them whole), the vectors read-only for the index (`index.MappedFaces`: a face removed since is
masked, one added goes to the index's own small flat part). The lookups beside them are arrays
too (service/core/lookups.py): the guard's rows by face id, sorted (a roster's faces are saved in
id order), and the subjects' names as UTF-8 bytes, offsets and their order, so that a worker makes
no Python object per face or subject of the snapshot. Every file is written under a name
of its own and switched to by the metadata's one atomic write (never rewritten in place, which a
mapping would see), its sha256 in the metadata and checked before it is used; the store decides
whether the state it reflects (`applied`, its stamp) is one it may start from.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from service.core.fileio import replacing, sha256_file, write_atomically
from service.core.lookups import ById, Names
from service.core.open_set import LeaveOneOut, Roster
from service.gallery.index import read_meta
from service.runtime.heap import release_freed

log = logging.getLogger("facegate.gallery.snapshot")

FORMAT = 2  # the layout of the files below; another is never read
ROOM = 8  # a snapshot's arrays have room for 1/ROOM more faces (at least MIN_ROOM) before a process copies them
MIN_ROOM = 1024
NAMES = ("names", "name_offsets", "name_order")  # the subjects by code (lookups.Names)
BY_ID = ("sorted_ids", "sorted_rows")  # the guard's rows by face id (lookups.ById)
GUARD_ARRAYS = ("vectors", "ids", "subject", "top", "top_subject", "score", "counts", *BY_ID, *NAMES)  # LeaveOneOut.arrays()
ROSTER_ARRAYS = ("vectors", "ids", "subject", "counts", *NAMES)  # Roster.arrays(), rows by id, and each face's vector


@dataclass
class Snapshot:
    """The state as of change `applied`: the roster or guard, and the faces a flat index searches."""

    applied: int
    roster: Roster | LeaveOneOut
    ids: np.ndarray  # mapped read-only, the first `n` rows
    vectors: np.ndarray
    mapped: bool = True  # False: built here, kept in this process (the snapshot could not be saved)


class SnapshotFiles:
    """The files of one gallery state's snapshot (`name`: what tells it from another embedder's, or
    another collection's, in the same folder) and the lock its builder holds."""

    def __init__(self, directory: Path, name: str):
        self.directory, self.name = directory, name
        self.meta = directory / f"{name}.json"

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One process of the host at a time builds, saves or reads the snapshot."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with FileLock(self.directory / f"{self.name}.lock"):
            yield

    def load(self, guard: bool, dim: int, accept: Callable[[dict[str, Any]], bool], hashed: bool = True) -> Snapshot | None:
        """The snapshot mapped, when its metadata names this format, `guard` and `dim`, `accept`
        takes the state it reflects, and every file has the sha256 it was saved with; else None
        (absent, stale or damaged: the caller builds). `hashed=False`: the files are not read for
        their sha256 (just saved by the caller, under the lock, which hashed them then)."""
        meta = read_meta(self.meta)
        if not meta or meta.get("format") != FORMAT or meta.get("guard") != guard or meta.get("dim") != dim or not accept(meta):
            return None
        try:
            files = {name: self.directory / file for name, (file, _) in meta["files"].items()}
            for name, (_, digest) in meta["files"].items() if hashed else ():
                if sha256_file(files[name]) != digest:
                    log.warning("gallery snapshot %s: %s does not match its sha256; building instead", self.meta.name, files[name].name)
                    return None
            n = int(meta["n"])
            arrays = {name: np.load(files[name], mmap_mode="c") for name in (GUARD_ARRAYS if guard else ROSTER_ARRAYS)}
            ids, vectors = (np.load(files[name], mmap_mode="r")[:n] for name in ("ids", "vectors"))
            if guard:
                roster: Roster | LeaveOneOut = LeaveOneOut.restore(n, arrays, float(meta.get("share", 1.0)))
            else:
                roster = Roster(ById(ids, arrays["subject"][:n]), Names.restore(arrays), arrays["counts"])
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("gallery snapshot %s unreadable (%s); building instead", self.meta.name, exc)
            return None
        log.info("gallery snapshot %s: %d faces mapped, as of change %d", self.meta.name, n, meta["applied"])
        return Snapshot(int(meta["applied"]), roster, ids, vectors)

    def built(
        self,
        guard: bool,
        stamp: dict[str, Any],
        faces: Callable[[], tuple[np.ndarray, list[str], np.ndarray]],
        build: Callable[..., Roster | LeaveOneOut],
    ) -> Snapshot:
        """The state of `faces()` (ids, subjects, vectors) as of `stamp`'s change, built here by `build`
        (open_set.follow), saved and mapped as the other processes will map it; kept in this process
        where it cannot be saved (a full or read-only disk). The caller holds the lock. What the build
        read and made is freed once it is mapped, and the heap it took given back (`release_freed`)."""
        read = faces()
        ids, subjects, vectors = read
        roster = build(ids, subjects, vectors, guard)
        applied = stamp["applied"]
        try:
            self.save(roster, stamp, read)
            snapshot = self.load(guard, vectors.shape[1], lambda meta: meta.get("applied") == applied, hashed=False)
        except OSError as exc:
            log.warning("gallery snapshot not saved (%s): this worker keeps its own copy", exc)
            snapshot = None
        if snapshot is None:
            snapshot = Snapshot(applied, roster, ids, vectors, mapped=False)
        del read, ids, subjects, vectors, roster  # the last references here: the mapped copy is served
        release_freed()
        return snapshot

    def applied(self) -> int | None:
        """The change the saved snapshot is of (None: none saved)."""
        meta = read_meta(self.meta)
        return meta.get("applied") if meta else None

    def save(
        self, roster: Roster | LeaveOneOut, stamp: dict[str, Any], faces: tuple[np.ndarray, list[str], np.ndarray] | None = None
    ) -> None:
        """Write the state under a fresh name (`roster`: the guard, or a roster with the `faces` it
        was made of: ids, subjects, vectors), then the metadata that names it (`stamp`: `applied`
        and what the store checks), then remove the files no metadata names (an older snapshot's,
        a killed writer's). The caller holds the lock."""
        if isinstance(roster, LeaveOneOut):
            n = len(roster.ids())
            arrays = roster.arrays(n + max(MIN_ROOM, n // ROOM))
        else:
            if faces is None:
                raise ValueError("a roster is saved with its faces' vectors")
            ids, _, vectors = faces
            n, capacity = len(ids), len(ids) + max(MIN_ROOM, len(ids) // ROOM)
            arrays = roster.arrays()  # its faces by id: the vectors in that order too
            rows = {"ids": arrays["ids"], "subject": arrays["subject"], "vectors": np.asarray(vectors, np.float32)[np.argsort(ids)]}
            arrays.update({name: np.concatenate([a, np.zeros((capacity - n, *a.shape[1:]), a.dtype)]) for name, a in rows.items()})
        stem = f"{self.name}.{uuid.uuid4().hex[:12]}"
        files: dict[str, list[str]] = {}
        for name, array in arrays.items():
            path = self.directory / f"{stem}.{name}.npy"
            with replacing(path, suffix=".npy", durable=False) as tmp:  # derived: the metadata's write is the durable switch
                np.save(tmp, array)
            files[name] = [path.name, sha256_file(path)]
        meta = {**stamp, "format": FORMAT, "guard": isinstance(roster, LeaveOneOut), "dim": int(arrays["vectors"].shape[1]), "n": n}
        if isinstance(roster, LeaveOneOut):
            meta["share"] = roster.share  # of the faces it lists (open_set.sampled)
        write_atomically(self.meta, json.dumps({**meta, "files": files}).encode())
        for orphan in (*self.directory.glob(f"{self.name}.*.*"), *self.directory.glob(f".{self.name}.*")):
            if not orphan.name.startswith(stem) and orphan != self.meta and orphan.suffix != ".lock":
                orphan.unlink(missing_ok=True)  # a process mapping it keeps it until it unmaps
        log.info("gallery snapshot %s: %d faces saved, as of change %d", self.meta.name, n, stamp["applied"])
