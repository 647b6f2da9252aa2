"""Keeps one replica's in-memory vector index in step with the shared PostgreSQL gallery.

Every write that changes the searchable faces commits a numbered row in `changes` (numbers without
gaps, in commit order) and a NOTIFY in the same transaction. A listener thread LISTENs and, on each
notification, on reconnect, and every `poll` seconds in case one was missed, applies the changes
after the last one it applied, in order: no change is ever skipped. The replica that made a write
applies it itself before answering (`wrote`), so its own 2xx is already visible to its searches.
Each change goes to the index and to the open-set roster beside it (service/core/open_set.py), so
a replica's guard always describes the faces its index searches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import ConnectionPool

from service.core.open_set import LeaveOneOut, Roster
from service.gallery.index import FaissIndex

log = logging.getLogger("facegate.gallery.sync")

CHANNEL = "facegate_gallery"
LISTENER_NAME = "facegate-gallery-sync"  # application_name of each replica's listening connection (pg_stat_activity)
BATCH = 1000  # changes read per query while catching up
RETRY_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)  # reconnect back-off


def one_row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate, the one-row change_sequence)."""
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the query returned no row")
    return row


def record_change(conn: psycopg.Connection, op: str, face_ids: list[int]) -> int:
    """Number the change and announce it, as the last statements of the caller's transaction (the
    row lock on the counter is then held only while committing). Returns its sequence number."""
    (seq,) = one_row(conn.execute("UPDATE change_sequence SET seq = seq + 1 RETURNING seq"))
    conn.execute("INSERT INTO changes (seq, op, face_ids) VALUES (%s, %s, %s)", (seq, op, face_ids))
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(seq)))
    return seq


def database_sequence(conn: psycopg.Connection) -> int:
    return one_row(conn.execute("SELECT seq FROM change_sequence"))[0]


class IndexSync:
    def __init__(
        self,
        url: str,
        pool: ConnectionPool,
        index: FaissIndex,
        model_sha256: str,
        applied: int,
        poll: float,
        roster: Roster | LeaveOneOut | None = None,
    ):
        """`applied`: the change the index was loaded at (its snapshot's sequence)."""
        self.url = url
        self.pool = pool
        self.index = index
        self.roster = roster
        self.model_sha256 = model_sha256
        self.applied = applied
        self.poll = poll
        self.listening = False
        self._lock = threading.Lock()  # one applier at a time, in sequence order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="facegate-gallery-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        try:  # wake the listener now rather than at its next poll (other replicas just catch up: nothing new)
            with self.pool.connection(timeout=2) as conn:
                conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
        except psycopg.Error:
            pass
        self._thread.join(self.poll + 5)

    def status(self) -> dict[str, int | bool]:
        """The change this replica applied last, the database's last, the difference, and whether
        the listener is connected."""
        with self.pool.connection() as conn:
            database = database_sequence(conn)
        applied = self.applied
        return {"applied_sequence": applied, "database_sequence": database, "lag": max(database - applied, 0), "listening": self.listening}

    @contextmanager
    def paused(self) -> Iterator[int]:
        """No change is applied inside the block; yields the last one applied (to persist the index as of it)."""
        with self._lock:
            yield self.applied

    def wrote(self, seq: int, op: str, face_ids: list[int], vectors: np.ndarray | None = None, subjects: list[str] | None = None) -> None:
        """A change this replica committed: applied (with every one before it) before the caller answers."""
        with self._lock:
            if self.applied >= seq:
                return
            if self.applied == seq - 1:  # nothing pending: apply what is in hand, no read needed
                self._apply_known(op, face_ids, vectors, subjects)
                self.applied = seq
                return
        self.caught_up(seq)

    def caught_up(self, seq: int) -> None:
        """Every change up to the committed `seq` applied, read from the database (a merge's, whose vectors are not in hand)."""
        try:
            with self.pool.connection() as conn:
                self.catch_up(conn)
        except psycopg.Error as exc:  # the write is committed: the listener applies it once it can read again
            log.warning("gallery sync: change %d committed but not applied yet: %s", seq, exc)

    def catch_up(self, conn: psycopg.Connection) -> int:
        """Apply every committed change after the last applied one, in order; how many."""
        done = 0
        with self._lock:
            while True:
                rows = conn.execute(
                    "SELECT seq, op, face_ids FROM changes WHERE seq > %s ORDER BY seq LIMIT %s", (self.applied, BATCH)
                ).fetchall()
                for seq, op, face_ids in rows:
                    if op == "add":
                        self._add_from_database(conn, face_ids)
                    else:
                        self._remove(face_ids)
                    self.applied = seq
                done += len(rows)
                if len(rows) < BATCH:
                    return done

    def _apply_known(self, op: str, face_ids: list[int], vectors: np.ndarray | None, subjects: list[str] | None) -> None:
        if op == "add":
            if vectors is None or subjects is None:
                raise ValueError("an add is applied with its vectors and subjects")
            self._add(np.array(face_ids, np.int64), subjects, vectors)
        else:
            self._remove(face_ids)

    def _add(self, ids: np.ndarray, subjects: list[str], vectors: np.ndarray) -> None:
        self.index.add(ids, vectors)
        if self.roster is not None:
            self.roster.add(ids, subjects, vectors)

    def _remove(self, face_ids: list[int]) -> None:
        ids = np.array(face_ids, np.int64)
        self.index.remove(ids)
        if self.roster is not None:
            self.roster.remove(ids)

    def _add_from_database(self, conn: psycopg.Connection, face_ids: list[int]) -> None:
        """The faces as they are now (a face deleted since is skipped: its own change removes nothing)."""
        rows = conn.execute(
            "SELECT id, subject_id, embedding FROM faces WHERE id = ANY(%s) AND model_sha256 = %s", (face_ids, self.model_sha256)
        ).fetchall()
        if rows:
            vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), -1)
            self._add(np.array([r[0] for r in rows], np.int64), [r[1] for r in rows], vectors)

    def _listen(self) -> None:
        """LISTEN, catch up, then apply on every notification (or every `poll` s); reconnect on error."""
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, application_name=LISTENER_NAME) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    failures = 0
                    self.catch_up(conn)  # what was committed before LISTEN took effect
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=self.poll, stop_after=1):
                            pass
                        self.catch_up(conn)
            except psycopg.Error as exc:
                self.listening = False
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                log.warning("gallery sync: %s; reconnecting in %.1f s (applied change %d)", exc, delay, self.applied)
                self._stop.wait(delay)
        self.listening = False
