"""The PostgreSQL gallery store (FACEGATE_DATABASE_URL): several replicas share one database, the
source of truth; each keeps its own in-memory vector index of the active embedder's faces, loaded
at start-up from one consistent snapshot (by the follower's thread when the server opens it: the
port listens meanwhile) and kept in step by its follower (follower.py, sync.py), which holds it.

A write commits before it returns, with its change row and NOTIFY in the same transaction; the
replica that wrote applies the change to its index before answering. Another replica applies it
within its propagation delay (its /readyz shows how far behind it is). A search looks up the faces
the index found in the database, so a face whose delete was acknowledged by any replica is never
answered by any, even by one whose index has not applied the delete yet.

Beside its index each replica keeps the open-set roster (subjects, faces and the guard's
leave-one-out scores, service/core/open_set.py), loaded from the same snapshot and changed by the
same changes: derived state, like the index, so every replica that has applied change N holds the
same guard and decides as the others do at N. With Milvus (no change log followed) a replica reads
the subject and face counts from the database instead, and keeps no guard.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from service.core.alignment import FaceChip
from service.core.errors import FaceNotFound, GalleryUnavailable, StorageFull, SubjectNotFound
from service.core.models.manifest import EmbedderKey
from service.core.open_set import GalleryShape, LeaveOneOut, follow
from service.gallery.collection_names import DEFAULT
from service.gallery.follower import Derived, FollowedStore, Follower, replay
from service.gallery.index import (
    ASIDE,
    FaissIndex,
    IndexConfig,
    MappedFaces,
    best_subjects,
    index_kind,
    open_index,
    read_meta,
    save_index,
    saved_and_mapped,
    tuned,
)
from service.gallery.interface import Candidate, FaceRecord, GalleryStore, NewFace, Subject
from service.gallery.milvus import MilvusIndex, open_milvus
from service.gallery.names import holding, name_key
from service.gallery.pg_connections import Connections
from service.gallery.snapshot import Snapshot, SnapshotFiles
from service.gallery.sqlite import (
    CHECK_CANDIDATES,
    COLLECTION_COUNTS,
    FACE_INSERT_COLUMNS,
    FACE_SELECT,
    LOOKUP_CHUNK,
    MATED_FACES,
    SUBJECT_SELECT,
    TRAINING_FACES,
    embedding_blob,
    face_record,
    face_row,
    incompatible_models,
    ours,
    required_embedder,
    stored_chip,
    subject_record,
    subject_update,
    taken,
    training_sample,
)
from service.gallery.sync import (
    PostgresLog,
    change_digest,
    changes_after,
    database_identity,
    database_sequence,
    faces_by_id,
    one_row,
    record_change,
    replication_status,
    snapshot_files,
    snapshot_reaches,
    snapshot_stamp,
)
from service.runtime.heap import release_freed

log = logging.getLogger("facegate.gallery")

MIGRATIONS = Path(__file__).with_name("migrations")  # NNNN_name.sql, applied in order, each once
MIGRATION_LOCK = 0x66616365_67617465  # pg_advisory_xact_lock key: replicas starting together migrate one at a time
NAME_KEY_INDEX = "subjects_name_key"  # migrations/0002_subject_names.sql
NAME_KEYS_LOWERED = 3  # migrations/0003_name_keys_lowered.sql, whose step is _lower_name_keys
LOAD_BATCH = 50_000  # rows per fetch while loading the index
SYNC_POLL_SECONDS = 1.0  # catch-up interval when no notification arrives (one should always arrive)
COUNTS_SECONDS = 10.0  # with Milvus, how long the subject and face counts an open-set decision reads are reused


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, SQL) of every migration file, by version."""
    found = [(int(p.name.split("_", 1)[0]), p.stem, p.read_text()) for p in MIGRATIONS.glob("[0-9]*_*.sql")]
    return sorted(found)


def _lower_name_keys(conn: psycopg.Connection) -> None:
    """Migration 3's step that SQL cannot take: every name's key made again by names.py (lowered, no
    longer case-folded), since PostgreSQL's lower() depends on the database's collation."""
    rows = conn.execute("SELECT id, name, name_key FROM subjects WHERE name_key IS NOT NULL").fetchall()
    changed = [(name_key(name), subject_id) for subject_id, name, key in rows if name_key(name) != key]
    conn.cursor().executemany("UPDATE subjects SET name_key = %s WHERE id = %s", changed)


def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply the migrations this database lacks, all in one transaction under an advisory lock (so
    two replicas starting at once apply each once); the versions applied now."""
    known = migrations()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        newer = done - {v for v, _, _ in known}
        if newer:
            raise RuntimeError(f"the gallery database has migrations {sorted(newer)} this facegate does not know: upgrade facegate")
        applied = []
        for version, name, sql in known:
            if version not in done:
                conn.execute(sql)
                if version == NAME_KEYS_LOWERED:
                    _lower_name_keys(conn)
                conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied.append(version)
    for version in applied:
        log.info("gallery database: migration %d applied", version)
    return applied


class PostgresGallery(FollowedStore, GalleryStore):
    def __init__(
        self,
        url: str,
        embedder: EmbedderKey | None,
        searchable: bool = True,
        pool_size: int = 8,
        index: IndexConfig | None = None,
        pool_timeout: float = 1.0,
        guard: bool = True,
        background: bool = False,
        collection: str = DEFAULT,
        connections: Connections | None = None,
    ):
        """Connect, migrate, and (with an embedder and `searchable`) build the index and start following
        changes. A persisted index (a non-flat FACEGATE_INDEX) is loaded and brought up to date from
        the change log instead of being rebuilt. Fails at once when the database cannot be reached.
        `guard`: keep the open-set guard's leave-one-out scores (FACEGATE_OPEN_SET_GUARD), else only the roster.
        `background`: return once the database is migrated, the index and guard built by the
        follower's thread (the server listens meanwhile; `loading`), as SqliteGallery does.
        `collection`: the one collection this handle sees and changes (collections.py). `connections`: the pool and
        listener the server's collections share (pg_connections.py); None: a pool and listener of its own."""
        self._own_connections = connections is None  # a store opened alone closes the connections it made
        self.connections = connections or Connections(url, pool_size, pool_timeout)
        self.url = self.connections.url
        self.embedder = embedder
        self.guard = guard
        self.collection = collection
        self._counts: tuple[float, GalleryShape] | None = None  # with Milvus: (when read, what)
        config = index or IndexConfig()
        self.index_config = config if embedder and (searchable or config.shared) else None
        self.pool = self.connections.open()
        try:
            with self.pool.connection() as conn:
                migrate(conn)
                rows = conn.execute(
                    "SELECT model_name, model_sha256, COUNT(*) FROM faces WHERE collection = %s GROUP BY 1, 2", (collection,)
                ).fetchall()
            self.incompatible = incompatible_models(rows, embedder)
            self._changes: PostgresLog | None = None  # the log the follower reads
            self._snapshots: tuple[SnapshotFiles, str] | None = None  # the host's snapshot of this database, and its identity
            if self.index_config is not None:
                key = required_embedder(embedder)  # an index config is kept only with an embedder
                if self.index_config.shared:  # Milvus: shared, nothing to build or keep in step
                    self.unfollowed = open_milvus(self.index_config, key.dim, key.sha256, collection)
                else:
                    self._snapshots = self._snapshot_files(key)
                    self._changes = PostgresLog(self.pool, self.connections.listener, collection, key, self._derived_state, self._snapshots)
                    self.follower = Follower(self._changes, None, SYNC_POLL_SECONDS, f"facegate-gallery-follower-{collection}")
                    if not background:
                        self.follower.rebuild()  # here: built, and brought up to the log
                    self.follower.start()
        except BaseException:
            self._close_connections()
            raise

    def close(self) -> None:
        if isinstance(self.unfollowed, MilvusIndex):
            self.unfollowed.close()
        if self.follower:
            try:  # before the follower stops: what was committed until now applied, then saved
                self._save_index(self.follower)
            except (psycopg.Error, PoolTimeout, OSError) as exc:  # the next start replays from the older file, or rebuilds
                log.warning("gallery index not saved: %s", exc)
            self.follower.close()
        self._close_connections()

    def _close_connections(self) -> None:
        """The pool and listener, if this store made them (the server's outlive each collection)."""
        if self._own_connections:
            self.connections.close()

    def _save_index(self, follower: Follower) -> None:
        """Persist the index `follower` keeps in step with the change it reflects (a no-op for flat,
        when unchanged, or while it is first built)."""
        if self.index_config is None:  # a FAISS index is opened only with its config
            return
        with follower.paused() as state, self.pool.connection() as conn:
            if state is not None and isinstance(state.index, FaissIndex):
                digest = change_digest(conn, state.applied)
                save_index(
                    self.index_config, state.index, required_embedder(self.embedder).sha256, {"sequence": state.applied, "change": digest}
                )
                self._save_snapshot(conn, state)

    def _save_snapshot(self, conn: psycopg.Connection, state: Derived) -> None:
        """The guard as the host's snapshot, unless this collection's is saved as of its change already:
        the next start maps it instead of building it (the follower is paused: `state` does not change meanwhile)."""
        if self._snapshots is None or not isinstance(state.roster, LeaveOneOut):
            return
        files, identity = self._snapshots
        key = required_embedder(self.embedder)
        with files.lock():
            saved = read_meta(files.meta)
            if not (saved and saved.get("applied") == state.applied and ours(saved, self.collection, key)):
                files.save(state.roster, snapshot_stamp(conn, state.applied, key, self.collection, identity))

    def _wrote(self, seq: int, op: str, face_ids: list[int], vectors: np.ndarray | None = None, subjects: list[str] | None = None) -> None:
        """A change this replica committed, applied (after the few before it) before the caller answers."""
        if self.follower is None:
            return
        try:
            self.follower.wrote(seq, op, face_ids, vectors, subjects)
        except (psycopg.Error, PoolTimeout) as exc:  # the write is committed: the follower applies it once it can read again
            log.warning("gallery follower: change %d committed but not applied yet: %s", seq, exc)

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection]:
        """A pooled connection in a transaction, committed when the block ends; an unreachable
        database is a 503, never a 500."""
        try:
            with self.pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            # After an outage the pool reconnects with a growing backoff (seconds): while it has no
            # connection, a direct one (at most pool_size at once) serves the request if the
            # database is back, so the first request after a restart succeeds.
            if not self.connections.direct.acquire(blocking=False):
                raise GalleryUnavailable(f"the gallery database is unavailable: {exc}") from exc
            try:
                with psycopg.connect(self.url, connect_timeout=self.connections.connect_timeout) as conn:
                    yield conn
            except psycopg.OperationalError as direct:
                raise GalleryUnavailable(f"the gallery database is unavailable: {direct}") from direct
            finally:
                self.connections.direct.release()
        except pg_errors.DiskFull as exc:  # SQLSTATE 53100: the transaction was rolled back
            raise StorageFull(
                f"the gallery database's disk is full: nothing was written; free space on the server and retry ({exc})"
            ) from exc
        except psycopg.OperationalError as exc:
            raise GalleryUnavailable(f"the gallery database is unavailable: {exc}") from exc

    def _snapshot_files(self, key: EmbedderKey) -> tuple[SnapshotFiles, str] | None:
        """The files the host's replicas share this collection's derived state through (snapshot.py),
        in its index folder, named for the database's identity; None without a folder or an identity."""
        assert self.index_config is not None
        if self.index_config.directory is None:
            return None
        with self.pool.connection() as conn:
            identity = database_identity(conn)
        return None if identity is None else (snapshot_files(self.index_config.directory, key, self.guard, identity), identity)

    def _derived_state(self) -> Derived:
        """The index (the persisted one if it comes from this database, else filled and persisted) and
        the open-set roster, read in one REPEATABLE READ snapshot, with the change they reflect: the
        follower's build, which then replays what a persisted index lacks (the roster takes those
        changes as no-ops up to the snapshot: an add it has, a remove it lacks). With the host's
        snapshot (a folder), the roster and a flat index's faces are built by the first replica under
        its lock and mapped by the others, from a change the log then brings up to date (`_shared`)."""
        config, key = self.index_config, required_embedder(self.embedder)
        assert config is not None  # a follower is started only with a FAISS index's config
        with self._snapshots[0].lock() if self._snapshots is not None else nullcontext(), psycopg.connect(self.url) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            with conn.transaction():
                seq = database_sequence(conn)
                count = one_row(
                    conn.execute("SELECT COUNT(*) FROM faces WHERE collection = %s AND model_sha256 = %s", (self.collection, key.sha256))
                )[0]
                started = time.monotonic()
                snapshot = self._shared(conn, seq, count)
                if snapshot is not None and index_kind(config.spec) == "faiss-flat":  # searches the snapshot's faces in place
                    index = tuned(FaissIndex(key.dim, config.spec, config.search_params, base=MappedFaces(snapshot.ids, snapshot.vectors)))
                    state, how = Derived(index, snapshot.roster, snapshot.applied, snapshot.applied if snapshot.mapped else None), "mapped"
                else:
                    index, loaded = self._persisted_index(conn, seq, count)
                    if snapshot is not None and snapshot.applied < seq:  # an earlier change's: the roster brought up to `seq`
                        since = changes_after(conn, self.collection, snapshot.applied, seq - snapshot.applied)
                        replay(since, lambda face_ids: faces_by_id(conn, self.collection, key, face_ids), roster=snapshot.roster)
                    roster = snapshot.roster if snapshot is not None else follow(*self._faces(conn), self.guard)
                    mapped = snapshot.applied if snapshot is not None and snapshot.mapped else None  # its guard re-shared past REMAP
                    state, how = Derived(index, roster, loaded["sequence"] if loaded else seq, mapped), "loaded" if loaded else "built"
        log.info(
            "gallery database: %d faces searchable at change %d (%s in %.1f s)", index.size, state.applied, how, time.monotonic() - started
        )
        return state

    def _shared(self, conn: psycopg.Connection, seq: int, count: int) -> Snapshot | None:
        """The host's snapshot that may start the state (`snapshot_reaches`), else one built here,
        saved and mapped (the caller holds its lock); None where the host shares none."""
        if self._snapshots is None or self.index_config is None:
            return None
        files, identity = self._snapshots
        key = required_embedder(self.embedder)
        snapshot = files.load(self.guard, key.dim, lambda meta: snapshot_reaches(conn, meta, self.collection, key, identity, seq, count))
        return snapshot or files.built(
            self.guard, snapshot_stamp(conn, seq, key, self.collection, identity), lambda: self._faces(conn), follow
        )

    def _faces(self, conn: psycopg.Connection) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Ids, subjects and embeddings of the collection's faces the embedder made, in the caller's snapshot."""
        key = required_embedder(self.embedder)
        rows = conn.execute(
            "SELECT id, subject_id, embedding FROM faces WHERE collection = %s AND model_sha256 = %s", (self.collection, key.sha256)
        ).fetchall()
        vectors = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(len(rows), key.dim)
        return np.array([r[0] for r in rows], np.int64), [r[1] for r in rows], vectors

    def _persisted_index(self, conn: psycopg.Connection, seq: int, count: int) -> tuple[FaissIndex, dict[str, Any] | None]:
        """The persisted index if it comes from this database (its change's digest), else one filled
        from the faces and persisted; with its metadata when loaded."""
        config, key = self.index_config, required_embedder(self.embedder)
        assert config is not None
        sha = key.sha256

        def current(meta: dict) -> bool:
            saved = meta.get("sequence", -1)
            return 0 <= saved <= seq and meta.get("change") == change_digest(conn, saved)

        def sample(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # as sqlite.py's `sampler`
            stride = max(count // max(n, 1), 1)
            rows = conn.execute(TRAINING_FACES, (self.collection, sha, stride, n)).fetchall()
            return training_sample(rows, conn.execute(CHECK_CANDIDATES, (self.collection, sha, self.collection, sha, ASIDE)).fetchall())

        def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            with conn.cursor(name="facegate_load", binary=True) as cursor:
                cursor.itersize = LOAD_BATCH
                cursor.execute("SELECT id, embedding FROM faces WHERE collection = %s AND model_sha256 = %s", (self.collection, sha))
                while rows := cursor.fetchmany(LOAD_BATCH):
                    ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
                    yield ids, np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), -1)

        index, loaded = open_index(config, key.dim, sha, count, current, sample, batches)
        if loaded is None:
            index = saved_and_mapped(config, index, sha, {"sequence": seq, "change": change_digest(conn, seq)})
            release_freed()  # the heap of the copy built, now mapped instead
        return index, loaded

    # subjects

    def create_subject(self, name: str, metadata: dict[str, Any], subject_id: str | None = None, unique_name: bool = False) -> Subject:
        """Two replicas creating one id (or unique name) at once: one commits, the other gets subject_exists (409)."""
        subject_id = subject_id or uuid.uuid4().hex
        now = time.time()
        try:
            with self._conn() as conn:
                conn.execute(
                    "INSERT INTO subjects (collection, id, name, metadata, created, updated, name_key) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (self.collection, subject_id, name, json.dumps(metadata), now, now, name_key(name) if unique_name else None),
                )
        except pg_errors.UniqueViolation as exc:
            raise taken(subject_id, name, exc.diag.constraint_name == NAME_KEY_INDEX) from None
        return Subject(subject_id, name, metadata, now, now, 0, unique_name)

    def _subject_rows(self, conn: psycopg.Connection, where: str, params: tuple) -> list[Subject]:
        """Subjects of this collection `where` (its conditions follow the collection's) holds."""
        return [subject_record(r) for r in conn.execute(SUBJECT_SELECT + "WHERE s.collection = %s " + where, (self.collection, *params))]

    def get_subject(self, subject_id: str) -> Subject:
        with self._conn() as conn:
            rows = self._subject_rows(conn, "AND s.id = %s", (subject_id,))
        if not rows:
            raise SubjectNotFound(f"no subject with id {subject_id!r}")
        return rows[0]

    def subject_by_name(self, name: str) -> Subject:
        with self._conn() as conn:
            rows = self._subject_rows(conn, "AND s.name_key = %s", (name_key(name),))
        if not rows:
            raise SubjectNotFound(f"no subject named {name[:140]!r}")
        return rows[0]

    def unique_names(self, subject_ids: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._conn() as conn:
            for start in range(0, len(subject_ids), LOOKUP_CHUNK):
                chunk = subject_ids[start : start + LOOKUP_CHUNK]
                out.update(
                    conn.execute(
                        "SELECT id, name FROM subjects WHERE collection = %s AND name_key IS NOT NULL AND id = ANY(%s)",
                        (self.collection, chunk),
                    ).fetchall()
                )
        return out

    def list_subjects(self, limit: int, offset: int, search: str | None = None) -> tuple[list[Subject], int]:
        with self._conn() as conn:
            if search is None:
                total = one_row(conn.execute("SELECT COUNT(*) FROM subjects WHERE collection = %s", (self.collection,)))[0]
                return self._subject_rows(conn, "ORDER BY s.created, s.id LIMIT %s OFFSET %s", (limit, offset)), total
            # every name read and folded in Python (`holding`): normalize() fails on a SQL_ASCII database
            with conn.cursor(name="facegate_search") as cursor:
                cursor.itersize = LOAD_BATCH
                cursor.execute("SELECT id, name FROM subjects WHERE collection = %s ORDER BY created, id", (self.collection,))
                found = holding(search, cursor)
            page = found[offset : offset + limit]
            return self._subject_rows(conn, "AND s.id = ANY(%s) ORDER BY s.created, s.id", (page,)), len(found)

    def update_subject(self, subject_id: str, name: str | None, metadata: dict[str, Any] | None) -> Subject:
        try:
            with self._conn() as conn:
                current = conn.execute(
                    "SELECT name, metadata, name_key FROM subjects WHERE collection = %s AND id = %s FOR UPDATE",
                    (self.collection, subject_id),
                ).fetchone()
                if current is None:
                    raise SubjectNotFound(f"no subject with id {subject_id!r}")
                values = subject_update(current, name, metadata)
                conn.execute(
                    "UPDATE subjects SET name = %s, metadata = %s, name_key = %s, updated = %s WHERE collection = %s AND id = %s",
                    (*values, time.time(), self.collection, subject_id),
                )
        except pg_errors.UniqueViolation:
            raise taken(subject_id, values[0], True) from None
        return self.get_subject(subject_id)

    def delete_subject(self, subject_id: str) -> int:
        """Delete a subject and its faces; applied to this replica's index before it returns."""
        with self._conn() as conn:
            # The row lock orders this delete against enrollments into the subject (they take FOR SHARE).
            c = self.collection
            if conn.execute("SELECT 1 FROM subjects WHERE collection = %s AND id = %s FOR UPDATE", (c, subject_id)).fetchone() is None:
                raise SubjectNotFound(f"no subject with id {subject_id!r}")
            ids = [r[0] for r in conn.execute("DELETE FROM faces WHERE collection = %s AND subject_id = %s RETURNING id", (c, subject_id))]
            conn.execute("DELETE FROM subjects WHERE collection = %s AND id = %s", (c, subject_id))
            seq = record_change(conn, c, "remove", ids) if ids else None
        if seq and self.follower:
            self._wrote(seq, "remove", ids)
        self._unshare(ids)
        return len(ids)

    def merge_subjects(self, source_id: str, target_id: str) -> int:
        """Move every face of `source_id` to `target_id` and delete `source_id`, in one transaction;
        the number of faces moved. Logged as a `move`: every replica's roster re-reads their subject,
        its index (and a shared one, Milvus) keeps the vectors, whose ids do not change."""
        with self._conn() as conn:
            c = self.collection
            locked = conn.execute(
                "SELECT id FROM subjects WHERE collection = %s AND id = ANY(%s) ORDER BY id FOR UPDATE", (c, [source_id, target_id])
            )
            held = {r[0] for r in locked}
            for subject_id in (source_id, target_id):
                if subject_id not in held:
                    raise SubjectNotFound(f"no subject with id {subject_id!r}")
            ids = [
                r[0]
                for r in conn.execute(
                    "UPDATE faces SET subject_id = %s WHERE collection = %s AND subject_id = %s RETURNING id", (target_id, c, source_id)
                )
            ]
            conn.execute("UPDATE subjects SET updated = %s WHERE collection = %s AND id = %s", (time.time(), c, target_id))
            conn.execute("DELETE FROM subjects WHERE collection = %s AND id = %s", (c, source_id))
            seq = record_change(conn, c, "move", ids) if ids else None
        if seq and self.follower:
            self._wrote(seq, "move", ids)
        return len(ids)

    # faces

    def add_faces(self, subject_id: str, faces: list[NewFace]) -> list[FaceRecord]:
        """Commit the faces (all or none), then make them searchable here before returning."""
        key, now = required_embedder(self.embedder), time.time()
        rows = [face_row(self.collection, subject_id, face, key, now) for face in faces]
        insert = f"INSERT INTO faces ({FACE_INSERT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id"
        with self._conn() as conn:
            held = conn.execute("SELECT 1 FROM subjects WHERE collection = %s AND id = %s FOR SHARE", (self.collection, subject_id))
            if held.fetchone() is None:
                raise SubjectNotFound(f"no subject with id {subject_id!r}")
            ids = [one_row(conn.execute(insert, row))[0] for row in rows]
            if self.index is not None and self.index.shared:  # before the commit: Milvus down = rolled back, 503
                self.index.add(np.array(ids, np.int64), np.stack([f.embedding for f in faces]))
            seq = record_change(conn, self.collection, "add", ids)
        if self.follower:
            self._wrote(seq, "add", ids, np.stack([f.embedding for f in faces]), [subject_id] * len(ids))
        return [FaceRecord(i, subject_id, f.box, f.landmarks, f.score, key.name, key.sha256, now) for i, f in zip(ids, faces, strict=True)]

    def list_faces(self, subject_id: str) -> list[FaceRecord]:
        self.get_subject(subject_id)
        with self._conn() as conn:
            rows = conn.execute(
                FACE_SELECT + "WHERE collection = %s AND subject_id = %s ORDER BY id", (self.collection, subject_id)
            ).fetchall()
        return [face_record(r) for r in rows]

    def delete_face(self, face_id: int) -> str:
        """Delete a face, whichever model made it; its subject's id."""
        with self._conn() as conn:
            row = conn.execute(
                "DELETE FROM faces WHERE collection = %s AND id = %s RETURNING subject_id", (self.collection, face_id)
            ).fetchone()
            if row is None:
                raise FaceNotFound(f"no face with id {face_id}")
            seq = record_change(conn, self.collection, "remove", [face_id])
        if self.follower:
            self._wrote(seq, "remove", [face_id])
        self._unshare([face_id])
        return row[0]

    def delete_faces(self, face_ids: list[int]) -> dict[int, str]:
        """Delete those of `face_ids` the gallery holds, in one statement; {face id: subject id}."""
        ids = list(dict.fromkeys(face_ids))
        if not ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                "DELETE FROM faces WHERE collection = %s AND id = ANY(%s) RETURNING id, subject_id", (self.collection, ids)
            ).fetchall()
            deleted = [r[0] for r in rows]
            seq = record_change(conn, self.collection, "remove", deleted) if deleted else None
        if seq and self.follower:
            self._wrote(seq, "remove", deleted)
        self._unshare(deleted)
        return dict(rows)

    def face_chip(self, face_id: int) -> bytes | None:
        with self._conn() as conn:
            row = conn.execute("SELECT crop FROM faces WHERE collection = %s AND id = %s", (self.collection, face_id)).fetchone()
        if row is None:
            raise FaceNotFound(f"no face with id {face_id}")
        return None if row[0] is None else bytes(row[0])

    def _unshare(self, face_ids: list[int]) -> None:
        """Take committed deletes out of a shared index (Milvus). If it cannot be reached the vectors
        stay, never answered: search looks every candidate up in the database first."""
        if not face_ids or self.index is None or not self.index.shared:
            return
        try:
            self.index.remove(np.array(face_ids, np.int64))
        except GalleryUnavailable as exc:
            log.warning("%d deleted faces stay in the shared vector index (never answered): %s", len(face_ids), exc)

    def subject_embeddings(self, subject_id: str) -> np.ndarray:
        """The subject's embeddings made by the active embedder (N×D; N may be 0)."""
        key = required_embedder(self.embedder)
        self.get_subject(subject_id)
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT embedding FROM faces WHERE collection = %s AND subject_id = %s AND model_sha256 = %s ORDER BY id",
                (self.collection, subject_id, key.sha256),
            ).fetchall()
        return np.frombuffer(b"".join(r[0] for r in rows), dtype="<f4").reshape(len(rows), key.dim)

    # search

    def search(self, query: np.ndarray, top_k: int) -> list[Candidate]:
        """The top_k subjects by their best face's similarity, best first; each subject once
        (faces deleted meanwhile, perhaps through another replica, are dropped)."""
        self._loaded()
        index = self.index
        return [] if index is None else best_subjects(index, query, top_k, self.lookup_faces)

    def lookup_faces(self, face_ids: list[int]) -> dict[int, tuple[str, str, np.ndarray]]:
        """(subject id, name, embedding) of those of `face_ids` the database holds for this embedder."""
        sha = required_embedder(self.embedder).sha256
        if not face_ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT f.id, s.id, s.name, f.embedding FROM faces f "
                "JOIN subjects s ON s.collection = f.collection AND s.id = f.subject_id "
                "WHERE f.id = ANY(%s) AND f.collection = %s AND f.model_sha256 = %s",
                (face_ids, self.collection, sha),
            )
            return {r[0]: (r[1], r[2], np.frombuffer(r[3], "<f4")) for r in rows}

    def mated_faces(self) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the active embedder's faces whose subject has another, and their subjects (the recall check's queries)."""
        sha = required_embedder(self.embedder).sha256
        with self._conn() as conn:
            rows = conn.execute(MATED_FACES, (self.collection, sha, self.collection, sha)).fetchall()
        return np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], object)

    def face_chips(self, face_ids: list[int]) -> dict[int, FaceChip]:
        """The stored chips of those of `face_ids` that have one (FACEGATE_STORE_CROPS)."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT id, crop, crop_frame, crop_landmarks FROM faces WHERE collection = %s AND id = ANY(%s) AND crop IS NOT NULL",
                (self.collection, face_ids),
            ).fetchall()
        return {r[0]: stored_chip(r[1], r[2], r[3]) for r in rows}

    def embeddings_after(self, after_id: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids and embeddings of the active embedder's faces with id > after_id, in id order (a page)."""
        key = required_embedder(self.embedder)
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT id, embedding FROM faces WHERE collection = %s AND model_sha256 = %s AND id > %s ORDER BY id LIMIT %s",
                (self.collection, key.sha256, after_id, limit),
            ).fetchall()
        return np.array([r[0] for r in rows], np.int64), np.frombuffer(b"".join(r[1] for r in rows), "<f4").reshape(len(rows), key.dim)

    def counts(self, searchable: int | None = None) -> dict[str, int]:
        """As SqliteGallery.counts: incompatible faces counted in the database, whatever the index has applied."""
        sha = self.embedder.sha256 if self.embedder is not None else ""
        with self._conn() as conn:
            subjects, faces, other = one_row(
                conn.execute(
                    "SELECT (SELECT COUNT(*) FROM subjects WHERE collection = %s), (SELECT COUNT(*) FROM faces WHERE collection = %s), "
                    "(SELECT COUNT(*) FROM faces WHERE collection = %s AND model_sha256 != %s)",
                    (self.collection, self.collection, self.collection, sha),
                )
            )
        if searchable is None:
            searchable = self.index.size if self.index is not None else 0
        return {"subjects": subjects, "faces": faces, "searchable_faces": searchable, "incompatible_faces": other}

    def collection_counts(self) -> dict[str, dict[str, int]]:
        with self._conn() as conn:
            return {name: {"subjects": subjects, "faces": faces} for name, subjects, faces in conn.execute(COLLECTION_COUNTS)}

    def index_info(self) -> dict[str, Any] | None:
        return self.index.describe() if self.index is not None else None

    def shape(self) -> GalleryShape:
        """The roster's, kept in step with this replica's index; with Milvus, the database's counts
        of the embedder's subjects and faces (read at most every COUNTS_SECONDS), and no guard."""
        self._loaded()
        roster = self.roster
        if roster is not None:
            return roster.shape()
        if self.unfollowed is None:
            return GalleryShape(0, 0)
        now = time.monotonic()
        if self._counts is None or now - self._counts[0] > COUNTS_SECONDS:
            sha = required_embedder(self.embedder).sha256
            with self._conn() as conn:
                subjects, faces = one_row(
                    conn.execute(
                        "SELECT COUNT(DISTINCT subject_id), COUNT(*) FROM faces WHERE collection = %s AND model_sha256 = %s",
                        (self.collection, sha),
                    )
                )
            self._counts = (now, GalleryShape(subjects, faces))
        return self._counts[1]

    def replication(self) -> dict[str, int | bool] | None:
        if self.follower is None or self._changes is None:
            return None
        try:
            return replication_status(self.pool, self.follower.applied, self._changes.listening)
        except psycopg.OperationalError as exc:
            raise GalleryUnavailable(f"the gallery database is unavailable: {exc}") from exc

    # maintenance

    def reembed(self, embed: Callable[[np.ndarray], np.ndarray], template: str, batch: int = 64) -> tuple[int, int]:
        """Re-embed faces another model made from their stored chips, re-aligned onto `template`,
        a committed batch at a time; each batch is a change every replica applies (a replica on the
        old model drops the faces from its index, one on the new model adds them). This collection's faces only."""
        key = required_embedder(self.embedder)
        done = 0
        while True:
            with self._conn() as conn:
                rows = conn.execute(
                    "SELECT id, crop, crop_frame, crop_landmarks FROM faces "
                    "WHERE collection = %s AND model_sha256 != %s AND crop IS NOT NULL ORDER BY id LIMIT %s",
                    (self.collection, key.sha256, batch),
                ).fetchall()
            if not rows:
                break
            vectors = embed(np.stack([stored_chip(r[1], r[2], r[3]).align(template) for r in rows]))
            ids = [r[0] for r in rows]
            with self._conn() as conn:
                with conn.cursor() as cursor:
                    cursor.executemany(
                        "UPDATE faces SET embedding = %s, model_name = %s, model_sha256 = %s WHERE id = %s",
                        [(embedding_blob(v), key.name, key.sha256, i) for i, v in zip(ids, vectors, strict=True)],
                    )
                if self.index is not None and self.index.shared:
                    self.index.add(np.array(ids, np.int64), vectors)
                record_change(conn, self.collection, "remove", ids)
                record_change(conn, self.collection, "add", ids)
            done += len(rows)
        with self._conn() as conn:
            missing = one_row(
                conn.execute(
                    "SELECT COUNT(*) FROM faces WHERE collection = %s AND model_sha256 != %s AND crop IS NULL",
                    (self.collection, key.sha256),
                )
            )[0]
        return done, missing
