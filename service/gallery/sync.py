"""The shared PostgreSQL gallery's change log, as a replica's follower (follower.py) reads it.

Every write that changes the searchable faces commits a numbered row in `changes` (numbers without
gaps, in commit order) and a NOTIFY naming its collection in the same transaction. The process's
listener (pg_connections.py) wakes that collection's followers; each, on a notification, on the
listener's reconnect, and every `poll` seconds in case one was missed, applies the
changes after the last one it applied, in order: no change is ever skipped (the log is never
pruned). The replica that made a write applies it itself before answering (`Follower.wrote`), so
its own 2xx is already visible to its searches. Each change goes to the index and to the open-set
roster beside it (service/core/open_set.py), so a replica's guard always describes the faces its
index searches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg_pool import ConnectionPool

from service.core.models.manifest import EmbedderKey
from service.core.open_set import LeaveOneOut
from service.gallery.follower import Change, Derived
from service.gallery.pg_connections import CHANNEL, Listener
from service.gallery.snapshot import Snapshot, SnapshotFiles
from service.gallery.sqlite import ours

log = logging.getLogger("facegate.gallery.sync")


def one_row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a query that always returns one (an aggregate, the one-row change_sequence)."""
    row = cursor.fetchone()
    if row is None:
        raise LookupError("the query returned no row")
    return row


def record_change(conn: psycopg.Connection, collection: str, op: str, face_ids: list[int]) -> int:
    """Number the change and announce it, as the last statements of the caller's transaction (the
    row lock on the counter is then held only while committing). Returns its sequence number."""
    (seq,) = one_row(conn.execute("UPDATE change_sequence SET seq = seq + 1 RETURNING seq"))
    conn.execute("INSERT INTO changes (seq, op, face_ids, collection) VALUES (%s, %s, %s, %s)", (seq, op, face_ids, collection))
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, collection))  # its collection's followers are woken (pg_connections.py)
    return seq


def database_sequence(conn: psycopg.Connection) -> int:
    return one_row(conn.execute("SELECT seq FROM change_sequence"))[0]


def change_digest(conn: psycopg.Connection, seq: int) -> str:
    """md5 of change `seq`'s face ids: a persisted index or snapshot names the change it reflects by
    number and digest, so a file from another database (or one restored from a backup) is never replayed onto."""
    row = conn.execute("SELECT md5(op || face_ids::text) FROM changes WHERE seq = %s", (seq,)).fetchone()
    return row[0] if row else ""


def changes_after(conn: psycopg.Connection, collection: str, after: int, limit: int) -> list[Change]:
    """Up to `limit` of the log's changes after `after`, in order, as `collection` sees them (the log is never pruned)."""
    # another collection's change is read as an add of no face: nothing here, and the numbers stay without gaps
    rows = conn.execute(
        "SELECT seq, CASE WHEN collection = %s THEN op ELSE 'add' END, CASE WHEN collection = %s THEN face_ids ELSE '{}' END "
        "FROM changes WHERE seq > %s ORDER BY seq LIMIT %s",
        (collection, collection, after, limit),
    ).fetchall()
    return [(seq, op, list(face_ids)) for seq, op, face_ids in rows]


def faces_by_id(
    conn: psycopg.Connection, collection: str, embedder: EmbedderKey, face_ids: list[int]
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Ids, subjects and embeddings of those of `face_ids` the collection holds in `conn`'s snapshot, made by `embedder`."""
    rows = conn.execute(
        "SELECT id, subject_id, embedding FROM faces WHERE id = ANY(%s) AND collection = %s AND model_sha256 = %s",
        (face_ids, collection, embedder.sha256),
    ).fetchall()
    vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), embedder.dim)
    return np.array([r[0] for r in rows], np.int64), [r[1] for r in rows], vectors


def database_identity(conn: psycopg.Connection) -> str | None:
    """The server's system identifier and the database's oid: which database a host's snapshot is of
    (two databases behind one data folder never share one). None where the server does not say."""
    try:
        with conn.transaction():
            return one_row(
                conn.execute(
                    "SELECT (SELECT system_identifier FROM pg_control_system())::text || '-' || oid::text "
                    "FROM pg_database WHERE datname = current_database()"
                )
            )[0]
    except psycopg.Error as exc:  # pg_control_system() revoked (a managed server): each replica builds its own
        log.warning("gallery snapshot not shared: the database's identity is not readable (%s)", exc)
        return None


def snapshot_files(directory: Path, embedder: EmbedderKey, guard: bool, identity: str) -> SnapshotFiles:
    """Where the host's replicas of one database share this embedder's guard (or roster) and faces
    (`directory`: the collection's index folder, as SQLite's)."""
    return SnapshotFiles(directory, f"{embedder.sha256[:16]}-pg{identity}-state-{'guard' if guard else 'roster'}")


def snapshot_stamp(conn: psycopg.Connection, applied: int, embedder: EmbedderKey, collection: str, identity: str) -> dict[str, Any]:
    """What a snapshot as of change `applied` is checked by (`snapshot_reaches`), read in its transaction."""
    return {
        "applied": applied,
        "change": change_digest(conn, applied),
        "model_sha256": embedder.sha256,
        "collection": collection,
        "database": identity,
    }


def snapshot_reaches(
    conn: psycopg.Connection, meta: dict[str, Any], collection: str, embedder: EmbedderKey, identity: str, seq: int, faces: int
) -> bool:
    """A snapshot may start the state at change `seq` (`faces`: the embedder's in the collection
    then): it is of this database, collection and embedder, its change's digest is the log's, and it
    is of `seq` with as many faces, or of an earlier change, to be followed from there (the log is
    never pruned: every change since is read; with an HNSW or IVF index, by the roster alone at start)."""
    saved = meta.get("applied", -1)
    if meta.get("database") != identity or not ours(meta, collection, embedder) or not 0 <= saved <= seq:
        return False
    if meta.get("change") != change_digest(conn, saved):
        return False
    return saved < seq or meta.get("n") == faces


class PostgresLog:
    """follower.ChangeLog over the pool (reads) and the process's listener (`wait`: woken by its
    collection's notifications, pg_connections.py), which the follower's thread alone waits on. `build`:
    the state as of one snapshot (PostgresGallery's), the follower's first build."""

    def __init__(
        self,
        pool: ConnectionPool,
        listener: Listener,
        collection: str,
        embedder: EmbedderKey,
        build: Callable[[], Derived],
        snapshots: tuple[SnapshotFiles, str] | None = None,
    ):
        """`snapshots`: the host's snapshot files of this database and its identity (None: not shared)."""
        self.pool, self.collection, self.embedder, self.build = pool, collection, embedder, build
        self.snapshots = snapshots
        self._subscription = listener.subscribe(collection)

    @property
    def listening(self) -> bool:
        return self._subscription.listening

    def changes(self, after: int, limit: int) -> list[Change] | None:
        with self.pool.connection() as conn:
            return changes_after(conn, self.collection, after, limit)

    def faces(self, face_ids: list[int]) -> tuple[np.ndarray, list[str], np.ndarray]:
        """The faces as they are now (a face deleted since is left out: its own change removes nothing)."""
        with self.pool.connection() as conn:
            return faces_by_id(conn, self.collection, self.embedder, face_ids)

    def rebuild(self, current: Derived | None) -> Derived:
        """The first state only: the log is never pruned, so a replica never falls past it."""
        return self.build()

    def share(self, state: Derived) -> bool:
        """The guard as the host's snapshot, saved as of its change (an older one maps, then the log
        since is applied), unless another replica of the host saved a newer one."""
        if self.snapshots is None or not isinstance(state.roster, LeaveOneOut) or state.mapped is None:
            return False
        files, identity = self.snapshots
        try:
            with files.lock():
                if (files.applied() or -1) > state.mapped:
                    return True  # another replica's, newer
                with self.pool.connection() as conn:
                    stamp = snapshot_stamp(conn, state.applied, self.embedder, self.collection, identity)
                files.save(state.roster, stamp)
            return True
        except OSError as exc:
            log.warning("gallery snapshot not shared: %s", exc)
            return False

    def index_stamp(self, applied: int) -> dict[str, Any] | None:
        with self.pool.connection() as conn:
            return {"sequence": applied, "change": change_digest(conn, applied)}

    def shared_roster(self, after: int) -> Snapshot | None:
        if self.snapshots is None:
            return None
        files, identity = self.snapshots
        try:
            with files.lock(), self.pool.connection() as conn, conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")  # the change and the count: one snapshot
                seq = database_sequence(conn)
                count = one_row(
                    conn.execute(
                        "SELECT COUNT(*) FROM faces WHERE collection = %s AND model_sha256 = %s", (self.collection, self.embedder.sha256)
                    )
                )[0]
                return files.load(
                    True,  # only a guard is shared again (`share`)
                    self.embedder.dim,
                    lambda meta: (
                        meta.get("applied", -1) > after
                        and snapshot_reaches(conn, meta, self.collection, self.embedder, identity, seq, count)
                    ),
                )
        except OSError as exc:
            log.warning("gallery snapshot not mapped: %s", exc)
            return None

    def resync(self, state: Derived) -> None:
        raise RuntimeError("the PostgreSQL change log is never pruned: a replica never falls past it")

    def wait(self, timeout: float) -> None:
        """Until a notification of this collection, the listener's reconnection, or `timeout`; at once the first time."""
        self._subscription.wait(timeout)

    def wake(self) -> None:
        """End a `wait` under way (the follower is closing)."""
        self._subscription.wake()

    def close(self) -> None:
        self._subscription.close()


def replication_status(pool: ConnectionPool, applied: int, listening: bool) -> dict[str, int | bool]:
    """The change this replica applied last, the database's last, the difference, and whether
    the listener is connected."""
    with pool.connection() as conn:
        database = database_sequence(conn)
    return {"applied_sequence": applied, "database_sequence": database, "lag": max(database - applied, 0), "listening": listening}
