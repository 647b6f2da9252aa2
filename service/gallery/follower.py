"""The gallery's derived state — the vector index and the open-set roster beside it (its guard) —
kept in step with the store's numbered change log by one follower, for SQLite (the `changes` table
the processes sharing a file write) and PostgreSQL (the same table, announced by NOTIFY) alike.

The store is the truth; the index and the roster are what a process derived from it, as of the
last change it applied (`applied`). A thread applies what other processes commit, in order, in the
background (BATCH changes a step under its lock), and builds the first state where the store
started without one (either store opened by the server: the port listens meanwhile); a process that fell behind what the log
keeps (SQLite's log is pruned, PostgreSQL's never) rebuilds both from the store there, off the
request path, and answers from its last consistent state meanwhile, then swaps the rebuilt state in
whole. No request pays for it: a SQLite search applies at most ON_REQUEST pending changes, waiting at
most ON_REQUEST_WAIT for the thread's step (what keeps a write made through another worker visible
to the next search), never a rebuild; a PostgreSQL search applies none (its propagation delay).

A process's own write is applied by `wrote` before it answers (read-your-writes), after the few
changes of other processes still pending before it (so that every process applies them in one
order, and holds the same guard to the last bit). When more are pending, or the log no longer
reaches them, it is applied ahead of them and skipped when the follower reaches it. That is safe:
the store's ids are never reused (no earlier change names a face a later write made), and an add
is read from the store as it is when it is applied (a face deleted since is not added).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from service.core.errors import GalleryLoading, GalleryUnavailable
from service.core.open_set import LeaveOneOut, Roster
from service.gallery.index import FaissIndex, MappedFaces, MappedIndex, VectorIndex, remapped
from service.gallery.snapshot import Snapshot

log = logging.getLogger("facegate.gallery.follower")

BATCH = 64  # changes applied per step, the lock held (an own write waits at most one step: 64 guard updates)
ON_REQUEST = 16  # changes a search may apply itself (each costs one product with every face); more: the state it has
ON_REQUEST_WAIT = 0.25  # seconds a search waits for the follower's step (a few ms, unless the guard is large and writes many)
LOCK_POLL = 0.01  # a search waiting for the lock looks this often whether a copy of the state began (it then stops waiting)
RETRY_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)  # back-off after the store could not be read
REMAP = 1000  # changes applied to a mapped snapshot (each writes private pages), at least, before the state is shared and mapped anew


@dataclass
class Derived:
    """An index and its roster as of change `applied`: swapped in whole, never mixed."""

    index: VectorIndex
    roster: Roster | LeaveOneOut | None
    applied: int
    mapped: int | None = None  # the change of the host's snapshot it maps (snapshot.py); None: its own


Change = tuple[int, str, list[int]]  # (seq, "add", "remove" or "move", face ids)


def replay(
    rows: list[Change],
    faces: Callable[[list[int]], tuple[np.ndarray, list[str], np.ndarray]],
    index: FaissIndex | None = None,
    roster: Roster | LeaveOneOut | None = None,
) -> None:
    """The changes `rows` into an index or a roster no one reads yet (`faces`: the store's now, by id):
    a remapped snapshot's, or one an earlier change's snapshot starts a process with."""
    for _, op, face_ids in rows:
        ids = np.array(face_ids, np.int64)
        if op != "add" and roster is not None:  # a move re-reads the faces' subjects
            roster.remove(ids)
        if op == "remove" and index is not None:
            index.remove(ids)
        if op == "add" or (op == "move" and roster is not None):
            found, subjects, vectors = faces(face_ids)
            if len(found) and index is not None and op == "add":
                index.add(found, vectors)
            if len(found) and roster is not None:
                roster.add(found, subjects, vectors)


class ChangeLog(Protocol):
    """What the follower reads from a store (a connection of its own: the store's lock is never taken)."""

    def changes(self, after: int, limit: int) -> list[Change] | None:
        """Up to `limit` committed changes after `after`, in order; None when the log no longer holds `after + 1`."""
        ...

    def faces(self, face_ids: list[int]) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Ids, subjects and embeddings of those of `face_ids` the store holds now, made by the active embedder."""
        ...

    def rebuild(self, current: Derived | None) -> Derived:
        """The state of the store as of one snapshot, built from its faces (`current`: what is served meanwhile, if any)."""
        ...

    def share(self, state: Derived) -> bool:
        """Save `state` as the host's snapshot (unless a newer one is saved): True when there is one
        newer than the snapshot `state` maps, for `rebuild` to map (`state`: a copy no one changes)."""
        ...

    def shared_roster(self, after: int) -> Snapshot | None:
        """The host's snapshot of a change after `after`, its roster mapped, where the log still
        reaches it (to be brought up to date from there); else None."""
        ...

    def index_stamp(self, applied: int) -> dict[str, Any] | None:
        """What the store's start checks a persisted index by (`save_index`'s state), for one as of
        change `applied`; None where it cannot be told now (SQLite: the database is past it)."""
        ...

    def resync(self, state: Derived) -> None:
        """Bring a state no one reads yet to the store as of one snapshot by the faces that differ
        (the log pruned past it while it was built: only the faces added or removed since count)."""
        ...

    def wait(self, timeout: float) -> None:
        """Return when something may have been committed (a notification), or after `timeout` seconds."""
        ...

    def wake(self) -> None:
        """End a `wait` under way (the follower is closing)."""
        ...

    def close(self) -> None: ...


class Follower:
    def __init__(self, changes: ChangeLog, state: Derived | None, poll: float, name: str = "facegate-gallery-follower"):
        """`state`: the index and roster as of a change; None: built first by the thread (the port
        listens meanwhile, and a search is a 503 gallery_loading until `loaded` is set)."""
        self.log = changes
        self._state = state
        self.loaded = threading.Event()
        if state is not None:
            self.loaded.set()
        self.poll = poll
        self.rebuilds = 0  # rebuilds done since start (what a test can see)
        self._early: set[int] = set()  # own changes applied ahead of others still pending
        self._remap_after = 0  # a snapshot that could not be shared is tried again REMAP changes later
        self._index_at = state.applied if state is not None else 0  # the change a mapped HNSW or IVF file is as of
        self._copying = False  # a copy of the state to share is under way (`_reshare`): searches do not wait for the lock
        self._lock = threading.Lock()  # one applier at a time, in order; held for one step
        self._stop = threading.Event()
        self._closed = False  # the log closed: nothing is applied any more
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # what the store reads

    @property
    def state(self) -> Derived | None:
        """The current index and roster (one attribute: a reader never sees a rebuilt index beside an
        old roster); None until the first is built."""
        return self._state

    @property
    def index(self) -> VectorIndex | None:
        state = self._state
        return state.index if state is not None else None

    @property
    def roster(self) -> Roster | LeaveOneOut | None:
        state = self._state
        return state.roster if state is not None else None

    @property
    def applied(self) -> int:
        state = self._state
        return state.applied if state is not None else 0

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Until the first state is built (True), or the follower is closed first or `timeout` passes (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.loaded.wait(0.2):
            if self._stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
        return True

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self.log.wake()
            self._thread.join(self.poll + 10)
        with self._lock:
            self._closed = True
            self.log.close()

    @contextmanager
    def paused(self) -> Iterator[Derived | None]:
        """Every committed change applied, and none applied inside the block: the state to persist
        (None: behind what the log holds, a state not worth persisting)."""
        current = self.catch_up()
        with self._lock:
            yield self._state if current else None

    # applying

    def wrote(self, seq: int, op: str, face_ids: list[int], vectors: np.ndarray | None = None, subjects: list[str] | None = None) -> None:
        """A change this process committed, applied before the caller answers (with the vectors and
        subjects in hand: nothing is read)."""
        with self._lock:
            state = self._state
            if state is None or seq <= state.applied or seq in self._early:
                return  # not built yet: the build reads it from the store
            pending = seq - 1 - state.applied
            if 0 < pending <= ON_REQUEST and not self._closed:  # the few before it first: every process applies them in one order
                rows = self.log.changes(state.applied, pending)
                if rows is not None:
                    self._apply(state, rows)
            if op == "add":
                if vectors is None or subjects is None:
                    raise ValueError("an add is applied with its vectors and subjects")
                add(state, np.array(face_ids, np.int64), subjects, vectors)
            elif op == "move":
                move(state, face_ids, *self.log.faces(face_ids))
            else:
                remove(state, face_ids)
            if seq == state.applied + 1:
                state.applied = seq
            else:
                self._early.add(seq)

    def catch_up(self, most: int | None = None) -> bool:
        """Apply the committed changes after `applied`, in order (`most`: at most that many, what a
        request may do itself; it waits at most ON_REQUEST_WAIT for the follower's own step, which
        is applying them anyway, and not at all while the state is copied to be shared). False when the
        log no longer reaches them: a rebuild is due."""
        done = 0
        while most is None or done < most:
            limit = BATCH if most is None else min(BATCH, most - done)
            if not (self._lock.acquire() if most is None else self._request_lock()):
                return True  # a request: the follower is applying them, or copying: the state it has meanwhile
            try:
                state = self._state
                rows = None if self._closed or state is None else self.log.changes(state.applied, limit)
                if state is None or rows is None:
                    return False
                self._apply(state, rows)
            finally:
                self._lock.release()
            done += len(rows)
            if len(rows) < limit:
                break
        return True

    def _request_lock(self) -> bool:
        """The lock for a request's own catch-up, waited for ON_REQUEST_WAIT at most, and not while a
        copy of the state is under way (the copy's whole time: 0.2 s at 100k faces)."""
        deadline = time.monotonic() + ON_REQUEST_WAIT
        while not self._copying:
            if self._lock.acquire(timeout=LOCK_POLL):
                return True
            if time.monotonic() > deadline:
                break
        return False

    def _apply(self, state: Derived, rows: list[Change], early: bool = True) -> None:
        """Committed changes, in order, each add read from the store as it is now. To the shared
        state (`early`: skipping the own changes applied ahead) the lock is held, so an add is read
        and applied with no own write in between; a rebuilt state no one reads yet takes them all."""
        for seq, op, face_ids in rows:
            if early and seq in self._early:
                self._early.discard(seq)
            elif op == "add":
                found, subjects, vectors = self.log.faces(face_ids)
                if len(found):
                    add(state, found, subjects, vectors)
            elif op == "move":
                move(state, face_ids, *self.log.faces(face_ids))
            else:
                remove(state, face_ids)
            state.applied = seq

    def rebuild(self, why: str = "the change log no longer reaches change {next}") -> None:
        """Build the state from the store off every lock, bring it up to the log, and swap it in."""
        if self._state is not None:
            log.info("gallery: %s; rebuilding the index off the request path", why.format(next=self.applied + 1))
        fresh = self.log.rebuild(self._state)
        read = fresh.applied
        while not self._stop.is_set():  # what was committed while it was built: read under the lock, applied outside
            with self._lock:
                rows = self.log.changes(fresh.applied, BATCH)
                if rows is not None and len(rows) < BATCH:  # the tail: applied here, then swapped in
                    self._apply(fresh, rows, early=False)
                    if self._state is not None:
                        self.rebuilds += 1
                    self._state, self._early, self._index_at = fresh, set(), read  # every own change is in the log by now
                    self.loaded.set()
                    log.info(
                        "gallery: the index read at change %d is searched from change %d (%d faces)", read, fresh.applied, fresh.index.size
                    )
                    return
            if rows is None:  # pruned past it again while it was built (writes faster than a build): by difference
                self.log.resync(fresh)
            else:
                self._apply(fresh, rows, early=False)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if not self.catch_up():
                    self.rebuild()
                elif self._grown():
                    self._remap_roster()
                elif self._index_grown():
                    self._remap_index()
                failures = 0
                self.log.wait(self.poll)
            except Exception as exc:  # the store unreachable for a moment: the state served stays as it is
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("gallery follower: %s; retrying in %.1f s (applied change %d)", exc, delay, self.applied)
                self._stop.wait(delay)

    def _grown(self) -> bool:
        """The changes applied since the mapped snapshot are due to be shared (`_due`), and the state is
        now shared as the host's snapshot (`_reshare`): time to map it."""
        state = self._state
        return state is not None and self._due(state) and self._reshare(state)

    def _index_grown(self) -> bool:
        """A mapped HNSW or IVF index's own part (the faces added and removed since its file) reached
        REMAP, or 1/8 of the faces."""
        state = self._state
        index = state.index if state is not None else None
        return isinstance(index, FaissIndex) and isinstance(index.base, MappedIndex) and index.since_mapped >= max(REMAP, index.size // 8)

    def _remap_index(self) -> None:
        """The index mapped anew (`index.remapped`): the host's newer file and the log since, or this
        state saved as the host's file. Under the follower's lock (no change applied meanwhile: an own
        write waits: 0.35 s to save HNSW32 at 100k faces with 1,000 added, benchmarks.md), which searches do not wait for (`_copying`)."""
        self._copying = True
        try:
            with self._lock:
                state = self._state
                if state is None or self._early or self._closed or not isinstance(state.index, FaissIndex):
                    return  # own changes applied ahead of others: not one change's state
                fresh = remapped(
                    state.index,
                    state.applied,
                    self._index_at,
                    lambda index, after: self._replay(after, state.applied, index=index),
                    lambda: self.log.index_stamp(state.applied),  # a start after a kill maps it
                )
                if fresh is not None:
                    self._state, self._index_at = replace(state, index=fresh), state.applied
                    log.info("gallery index %s: mapped anew at change %d (%d faces)", fresh.spec, state.applied, fresh.size)
        finally:
            self._copying = False

    def _replay(self, after: int, until: int, index: FaissIndex | None = None, roster: Roster | LeaveOneOut | None = None) -> bool:
        """The log's changes after `after` up to `until` into an index or a roster no one reads yet;
        False where the log no longer holds them."""
        rows = self.log.changes(after, until - after) if until > after else []
        if rows is None or len(rows) != until - after:
            return False
        replay(rows, self.log.faces, index, roster)
        return True

    def _remap_roster(self) -> None:
        """The state mapped anew from the host's snapshot, now shared (`_grown`). A flat index searches
        the snapshot's faces: both are rebuilt from it. An HNSW or IVF index is kept (it is mapped
        anew on its own bound, `_remap_index`): the roster alone is mapped, the log since its change
        applied to it off the lock but for the last BATCH changes, and swapped in; where that fails
        (the log pruned past it, own changes applied ahead), tried again REMAP changes later."""
        state = self._state
        if state is None or state.mapped is None:
            return
        if isinstance(getattr(state.index, "base", None), MappedFaces):
            self.rebuild("{next}: the changes since the mapped snapshot, now shared, are mapped anew")
        elif not self._swap_roster(self.log.shared_roster(state.mapped)):
            self._remap_after = self.applied

    def _swap_roster(self, snapshot: Snapshot | None) -> bool:
        """`snapshot`'s roster, brought to the state's change, swapped in for the state's (True)."""
        if snapshot is None:
            return False
        roster, at = snapshot.roster, snapshot.applied
        while not self._stop.is_set():
            with self._lock:
                state = self._state
                if state is None or self._early or self._closed:
                    return False  # own changes applied ahead of others: not one change's state
                if at > state.applied:  # another process's, ahead of this state: the state brought up to it first
                    rows = self.log.changes(state.applied, at - state.applied)
                    if rows is None or len(rows) != at - state.applied:
                        return False
                    self._apply(state, rows)
                if state.applied - at <= BATCH:
                    if not self._replay(at, state.applied, roster=roster):
                        return False
                    self._state = replace(state, roster=roster, mapped=snapshot.applied)
                    log.info("gallery snapshot: the roster mapped anew as of change %d, at change %d", snapshot.applied, state.applied)
                    return True
                until = state.applied
            if not self._replay(at, until, roster=roster):
                return False
            at = until
        return False

    def _due(self, state: Derived) -> bool:
        """The changes applied to a mapped snapshot reached REMAP, or 1/8 of the faces (the room its
        arrays have: its private pages grow with them)."""
        if state.mapped is None or not isinstance(state.roster, LeaveOneOut):
            return False
        return state.applied - max(state.mapped, self._remap_after) >= max(REMAP, state.index.size // 8)

    def _reshare(self, state: Derived) -> bool:
        """`state` saved as the host's snapshot: True when there is one newer than the snapshot it
        maps, to map. The copy saved is taken under the follower's lock (no change applied
        meanwhile: an own write waits for it) but not the roster's, and searches do not wait for it
        (`_copying`): they read the state as it is meanwhile; the save is outside every lock."""
        assert isinstance(state.roster, LeaveOneOut)
        self._copying = True  # before the lock: a search then never starts waiting for it
        try:
            with self._lock:
                frozen = Derived(state.index, state.roster.copy(locked=False), state.applied, state.mapped)
        finally:
            self._copying = False
        if self.log.share(frozen):
            return True
        self._remap_after = frozen.applied
        return False


def add(state: Derived, ids: np.ndarray, subjects: list[str], vectors: np.ndarray) -> None:
    """Committed faces into the index (a shared one, Milvus, got them with the write) and the roster."""
    if not state.index.shared:
        state.index.add(ids, vectors)
    if state.roster is not None:
        state.roster.add(ids, subjects, vectors)


def move(state: Derived, face_ids: list[int], found: np.ndarray, subjects: list[str], vectors: np.ndarray) -> None:
    """Faces that changed subject (a merge): the index keeps their vectors (same ids); the roster
    re-reads their subjects from the store (`found`, those of them it still holds)."""
    if state.roster is not None:
        state.roster.remove(np.array(face_ids, np.int64))
        if len(found):
            state.roster.add(found, subjects, vectors)


def remove(state: Derived, face_ids: list[int]) -> None:
    """Committed deletes out of the roster and the index. A shared index that cannot be reached keeps
    the vectors, which are never answered: a search looks every candidate up in the store first."""
    ids = np.array(face_ids, np.int64)
    if state.roster is not None:
        state.roster.remove(ids)
    try:
        state.index.remove(ids)
    except GalleryUnavailable as exc:
        log.warning("%d deleted faces stay in the shared vector index (never answered): %s", len(face_ids), exc)


class FollowedStore:
    """What a store (SQLite, PostgreSQL) reads of its derived state: all of it is its follower's,
    one attribute, never a copy beside it (a copy would go stale at the follower's first rebuild).
    `follower`: None where nothing is searched, or where no change log is followed (`unfollowed`:
    Milvus on PostgreSQL, one index the replicas share)."""

    follower: Follower | None = None
    unfollowed: VectorIndex | None = None
    on_request = 0  # changes a search applies itself before it reads (SQLite: ON_REQUEST; PostgreSQL: none, its propagation delay)

    @property
    def index(self) -> VectorIndex | None:
        """The index searched now (a rebuilt one is swapped in whole: read it again, never keep it);
        None while it is first built, or where nothing is searched."""
        return self.follower.index if self.follower is not None else self.unfollowed

    @property
    def roster(self) -> Roster | LeaveOneOut | None:
        return self.follower.roster if self.follower is not None else None

    @property
    def applied(self) -> int:
        """The last change of the log the index reflects."""
        return self.follower.applied if self.follower is not None else 0

    @property
    def loading(self) -> bool:
        """The index and guard are still being built (opened in the background): searches answer 503 gallery_loading."""
        return self.follower is not None and not self.follower.loaded.is_set()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self.follower is None or self.follower.wait_loaded(timeout)

    def _loaded(self) -> None:
        """Before a search reads the state: GalleryLoading while the first is built; else the few
        changes still pending applied here (`on_request` at most, never a rebuild)."""
        if self.follower is None:
            return
        if not self.follower.loaded.is_set():
            raise GalleryLoading("the gallery's index and open-set guard are being built at start-up; retry shortly (GET /readyz)")
        if self.on_request:
            self.follower.catch_up(self.on_request)

    def leave_one_out(self) -> LeaveOneOut | None:
        self._loaded()
        roster = self.roster
        return roster if isinstance(roster, LeaveOneOut) else None
