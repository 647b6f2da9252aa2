"""The SQLite gallery store: SQLite is the source of truth (WAL, synchronous=FULL, committed before any 2xx);
an in-memory vector index mirrors the faces made by the active embedder and is built at start-up
(an approximate one loaded instead where its persisted file still matches the faces),
and beside it the open-set roster (service/core/open_set.py: subjects, faces, the guard's
leave-one-out scores), built and changed with it.

One lock serializes the connection; the follower (its own lock and connection) keeps the index in
step with the database: a face enters the index only after its row is committed, and leaves it as
soon as its delete is, before the write answers.

Several processes may serve one file (`facegate serve --workers N`): every write that changes the
searchable faces also commits a numbered row in `changes`, which each process's follower
(follower.py) applies in the background, in order; a search first applies the few still pending
(follower.ON_REQUEST, waiting at most follower.ON_REQUEST_WAIT for the follower's own step), so an
enrollment or deletion made through any worker is seen by every worker's next search. A process
that fell further behind than the log keeps (CHANGES_KEPT) rebuilds its index from the faces in the
background, and searches its last state meanwhile. Opened by the server (`background`), the first
index and roster are built by the follower's thread too: searches answer 503 gallery_loading until
then. With a folder for the index (the server's), the roster and guard and a flat index's faces are
built once per host and memory-mapped by the other processes (snapshot.py, `derived_state`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from service.core.alignment import TEMPLATES, FaceChip
from service.core.errors import FaceNotFound, ModelUnavailable, StorageFull, SubjectExists, SubjectNotFound
from service.core.models.manifest import EmbedderKey
from service.core.open_set import GalleryShape, LeaveOneOut, follow
from service.gallery.collection_names import DEFAULT
from service.gallery.follower import ON_REQUEST, Change, Derived, FollowedStore, Follower, add, remove, replay
from service.gallery.index import (
    ASIDE,
    HELD_BACK,
    FaissIndex,
    IndexConfig,
    MappedFaces,
    best_subjects,
    index_kind,
    open_index,
    save_index,
    saved_and_mapped,
    tuned,
)
from service.gallery.interface import Candidate, FaceRecord, GalleryStore, NewFace, Subject
from service.gallery.milvus import MilvusIndex, open_milvus
from service.gallery.names import holding, name_key
from service.gallery.snapshot import Snapshot, SnapshotFiles
from service.runtime.heap import release_freed

log = logging.getLogger("facegate.gallery")

# Version 0: the schema every database starts from (it was the whole schema before versions were
# kept); MIGRATIONS then bring it to SCHEMA_VERSION, recorded in PRAGMA user_version.
SCHEMA = """
CREATE TABLE IF NOT EXISTS subjects (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS subjects_created ON subjects (created, id);
CREATE TABLE IF NOT EXISTS faces (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: an id in flight cannot alias a new face
    subject_id TEXT NOT NULL REFERENCES subjects (id) ON DELETE CASCADE,
    embedding BLOB NOT NULL,               -- float32 little-endian, L2-normalized
    model_name TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    box TEXT,                              -- JSON [x1, y1, x2, y2]; NULL for an aligned upload
    landmarks TEXT,
    score REAL,
    crop BLOB,                             -- PNG of the face's chip, only with FACEGATE_STORE_CROPS
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS faces_subject ON faces (subject_id);
CREATE INDEX IF NOT EXISTS faces_model ON faces (model_sha256);
"""

# Crops stored before version 1 are 112×112 arcface_112 chips, the one alignment facegate had then
# (detected faces and aligned uploads alike): their landmarks are that template's points.
LEGACY_CROP_FRAME = "arcface_112"
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: a chip is stored with its frame and its landmarks in its own coordinates (JSON 5×2), so
    #    re-embedding can re-align it for a model with another template.
    (
        "ALTER TABLE faces ADD COLUMN crop_frame TEXT",
        "ALTER TABLE faces ADD COLUMN crop_landmarks TEXT",
        f"UPDATE faces SET crop_frame = '{LEGACY_CROP_FRAME}', crop_landmarks = '{json.dumps(TEMPLATES[LEGACY_CROP_FRAME][0].tolist())}' "
        "WHERE crop IS NOT NULL",
    ),
    # 2: a subject created with a unique name (a CompreFace subject, a DeepStack userid) holds its
    #    name's key (names.py), which no other subject holds. Those the compatible APIs made before,
    #    whose id is their name, take theirs; where only case told two apart, the oldest does.
    (
        "ALTER TABLE subjects ADD COLUMN name_key TEXT",
        "UPDATE subjects SET name_key = lower(id) WHERE rowid IN (SELECT rowid FROM (SELECT rowid, "
        "row_number() OVER (PARTITION BY lower(id) ORDER BY created, id) AS n FROM subjects WHERE id = name) WHERE n = 1)",
        "CREATE UNIQUE INDEX subjects_name_key ON subjects (name_key)",
    ),
    # 3: the change log worker processes sharing the file follow (op: add, remove or move: a merge's faces,
    # whose subject changed; face_ids: JSON list).
    ("CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, op TEXT NOT NULL, face_ids TEXT NOT NULL)",),
    # 4: a name's key is lowered, no longer case-folded (names.py: Strauß and STRAUSS are two names).
    #    Old keys were unique, and lowering tells apart at least what folding did: no key collides.
    ("UPDATE subjects SET name_key = facegate_name_key(name) WHERE name_key IS NOT NULL",),
    # 5: collections (collections.py): every subject, face and change belongs to one, and a subject's
    #    id and unique name are unique within it. The tables are made again (SQLite cannot change a
    #    primary or foreign key), every row moved into `default`; faces keep their ids and the
    #    sequence that never reuses them (its row renamed with the table).
    (
        "CREATE TABLE subjects_new (collection TEXT NOT NULL, id TEXT NOT NULL, name TEXT NOT NULL, metadata TEXT NOT NULL, "
        "created REAL NOT NULL, updated REAL NOT NULL, name_key TEXT, PRIMARY KEY (collection, id))",
        f"INSERT INTO subjects_new SELECT '{DEFAULT}', id, name, metadata, created, updated, name_key FROM subjects",
        "CREATE TABLE faces_new (id INTEGER PRIMARY KEY AUTOINCREMENT, collection TEXT NOT NULL, subject_id TEXT NOT NULL, "
        "embedding BLOB NOT NULL, model_name TEXT NOT NULL, model_sha256 TEXT NOT NULL, box TEXT, landmarks TEXT, score REAL, "
        "crop BLOB, created REAL NOT NULL, crop_frame TEXT, crop_landmarks TEXT, "
        "FOREIGN KEY (collection, subject_id) REFERENCES subjects_new (collection, id) ON DELETE CASCADE)",
        f"INSERT INTO faces_new SELECT id, '{DEFAULT}', subject_id, embedding, model_name, model_sha256, box, landmarks, score, "
        "crop, created, crop_frame, crop_landmarks FROM faces",
        "DELETE FROM sqlite_sequence WHERE name = 'faces_new'",
        "UPDATE sqlite_sequence SET name = 'faces_new' WHERE name = 'faces'",
        "DROP TABLE faces",
        "DROP TABLE subjects",
        "ALTER TABLE subjects_new RENAME TO subjects",
        "ALTER TABLE faces_new RENAME TO faces",
        "CREATE INDEX subjects_created ON subjects (collection, created, id)",
        "CREATE UNIQUE INDEX subjects_name_key ON subjects (collection, name_key)",
        "CREATE INDEX faces_subject ON faces (collection, subject_id)",
        "CREATE INDEX faces_model ON faces (model_sha256)",
        "CREATE INDEX faces_collection ON faces (collection, model_sha256)",
        f"ALTER TABLE changes ADD COLUMN collection TEXT NOT NULL DEFAULT '{DEFAULT}'",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
CHANGES_KEPT = 10_000  # changes kept in the log; older ones are deleted as new ones are written
FOLLOW_SECONDS = 0.1  # how often a process's follower looks for changes other processes committed

DATABASE = "gallery.sqlite3"  # the file under FACEGATE_DATA_DIR
BUSY_SECONDS = 10.0  # how long a statement waits for another process's write (SQLite's busy timeout)
LOOKUP_CHUNK = 500  # ids per IN (...) query, well under SQLite's variable limit
# faces of the collection's (the first and third parameter) active model (the second and fourth)
# whose subject has another: the recall check's queries
# Queries both stores run (PostgreSQL's placeholders, `%%` its modulo; SQLite's through `for_sqlite`).
MATED_SUBJECTS = "(SELECT subject_id FROM faces WHERE collection = %s AND model_sha256 = %s GROUP BY subject_id HAVING COUNT(*) > 1)"
MATED_FACES = f"SELECT id, subject_id FROM faces WHERE collection = %s AND model_sha256 = %s AND subject_id IN {MATED_SUBJECTS}"
# An index's training sample: faces that train it, every stride-th id but those HELD_BACK names; and
# beside them the recall check's candidates, a face of each subject with another, for up to ASIDE
# subjects: per subject the face first in ID_HASH's order (multiplicative: spread over the ids), the
# subjects in the order of their first face's id so hashed, which no subject's number of faces moves.
# One per person, as /identify's queries are photos of a person whatever how many each enrolled: drawn
# per face, people with many photos (found more easily: a near mate lies in the same list) made up
# the check, and it read 0.14-0.15 over new photos drawn per person at IVF1024 nprobe 1 on 100k faces
# (docs/benchmarks.md, round 10). The index trains on neither those the check draws nor their near
# copies (index.py `held_back_with_copies`).
ID_HASH = 2654435761
TRAINING_FACES = (
    "SELECT id, embedding FROM faces WHERE collection = %s AND model_sha256 = %s "
    f"AND id %% %s = 0 AND id %% {HELD_BACK} != {HELD_BACK - 1} LIMIT %s"
)
CHECK_CANDIDATES = (
    "SELECT id, embedding FROM faces WHERE id IN (SELECT id FROM ("
    f"SELECT id, ROW_NUMBER() OVER (PARTITION BY subject_id ORDER BY (id * {ID_HASH}) %% 4294967296) AS pick, "
    "MIN(id) OVER (PARTITION BY subject_id) AS first "
    f"FROM faces WHERE collection = %s AND model_sha256 = %s AND subject_id IN {MATED_SUBJECTS}) AS ranked "
    f"WHERE pick = 1 ORDER BY (first * {ID_HASH}) %% 4294967296 LIMIT %s)"
)  # the window over the faces of subjects with another only: 0.7-0.9 s at 1M faces in SQLite, where over all of them 2.4-4.4


def for_sqlite(query: str) -> str:
    """One of the queries both stores run, in SQLite's placeholders and modulo."""
    return query.replace("%s", "?").replace("%%", "%")


def encode_crop(crop_rgb: np.ndarray) -> bytes:
    ok, png = cv2.imencode(".png", np.ascontiguousarray(crop_rgb[..., ::-1]))
    if not ok:
        raise ValueError("cannot encode the face's chip")
    return png.tobytes()


def decode_crop(data: bytes) -> np.ndarray:
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError("a stored face chip does not decode")
    return bgr[..., ::-1]


def chip_columns(chip: FaceChip | None) -> tuple[bytes | None, str | None, str | None]:
    """crop, crop_frame, crop_landmarks of a face's chip (all NULL without one)."""
    if chip is None:
        return None, None, None
    return encode_crop(chip.image), chip.frame, json.dumps(np.asarray(chip.landmarks, np.float64).tolist())


def stored_chip(crop: bytes, frame: str, landmarks: str) -> FaceChip:
    return FaceChip(decode_crop(crop), np.array(json.loads(landmarks), np.float64), frame)


def embedding_blob(embedding: np.ndarray) -> bytes:
    return np.asarray(embedding, dtype="<f4").tobytes()


# Row layouts both stores (SQLite here, PostgreSQL in postgres.py) share; only their SQL dialects differ.
SUBJECT_SELECT = (
    "SELECT s.id, s.name, s.metadata, s.created, s.updated, "
    "(SELECT COUNT(*) FROM faces f WHERE f.collection = s.collection AND f.subject_id = s.id), "
    "s.name_key IS NOT NULL FROM subjects s "
)
# subjects and faces per collection (`facegate gallery stats`), every collection a subject or face names
COLLECTION_COUNTS = (
    "SELECT collection, SUM(subject), SUM(face) FROM (SELECT collection, 1 AS subject, 0 AS face FROM subjects "
    "UNION ALL SELECT collection, 0, 1 FROM faces) AS held GROUP BY collection ORDER BY collection"
)
FACE_SELECT = "SELECT id, subject_id, box, landmarks, score, model_name, model_sha256, created FROM faces "
FACE_INSERT_COLUMNS = (
    "collection, subject_id, embedding, model_name, model_sha256, box, landmarks, score, crop, crop_frame, crop_landmarks, created"
)


def subject_record(row: tuple) -> Subject:
    return Subject(row[0], row[1], json.loads(row[2]), row[3], row[4], row[5], bool(row[6]))


def subject_update(current: tuple, name: str | None, metadata: dict[str, Any] | None) -> tuple[str, str, str | None]:
    """name, metadata and name_key of a subject's UPDATE, from its current row's: a subject holding
    its name's key takes the new name's."""
    renamed = name if name is not None else current[0]
    return renamed, json.dumps(metadata) if metadata is not None else current[1], name_key(renamed) if current[2] is not None else None


def taken(subject_id: str, name: str, name_taken: bool) -> SubjectExists:
    """The conflict a subject's INSERT or UPDATE met: its id, or its unique name's key."""
    if name_taken:
        return SubjectExists(f"a subject named {name[:140]!r} already exists (a unique name, whatever its case)")
    return SubjectExists(f"a subject with id {subject_id!r} already exists")


def face_record(row: tuple) -> FaceRecord:
    return FaceRecord(row[0], row[1], json.loads(row[2]) if row[2] else None, json.loads(row[3]) if row[3] else None, *row[4:8])


def face_row(collection: str, subject_id: str, face: NewFace, key: EmbedderKey, now: float) -> tuple:
    """The values of FACE_INSERT_COLUMNS for a new face."""
    box, landmarks = (json.dumps(v) if v is not None else None for v in (face.box, face.landmarks))
    return (
        collection,
        subject_id,
        embedding_blob(face.embedding),
        key.name,
        key.sha256,
        box,
        landmarks,
        face.score,
        *chip_columns(face.chip),
        now,
    )


def required_embedder(embedder: EmbedderKey | None) -> EmbedderKey:
    """The store's active embedder, for what reads or writes its faces: a store opened without one (no
    embedder loaded, a maintenance command) has none, a 503 as for any request that needs the model."""
    if embedder is None:
        raise ModelUnavailable("the gallery was opened without an embedder: no model's faces can be read or written")
    return embedder


def inserted_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made (the stubs type lastrowid Optional: None before any insert)."""
    if cursor.lastrowid is None:
        raise RuntimeError("the INSERT reported no row id")
    return cursor.lastrowid


def incompatible_models(counts: list[tuple[str, str, int]], embedder: EmbedderKey | None) -> dict[str, int]:
    """From (model_name, model_sha256, faces) rows, the faces another embedder made (never compared),
    warned about once at start-up."""
    incompatible = {f"{name}@{sha[:12]}": count for name, sha, count in counts if embedder is None or sha != embedder.sha256}
    if incompatible:
        log.warning(
            "%d enrolled faces were made by another embedder than the active one and are not searched: %s; "
            "re-embed them with `facegate gallery reembed` (needs FACEGATE_STORE_CROPS at enrollment) or re-enroll",
            sum(incompatible.values()),
            incompatible,
        )
    return incompatible


def fingerprint(db: sqlite3.Connection, collection: str, model_sha256: str) -> list[int]:
    """Count, largest and sum of the ids of the collection's faces the embedder made: ids are never
    reused, so any add or delete since a persisted index was saved changes it."""
    row = db.execute(
        "SELECT COUNT(*), COALESCE(MAX(id), 0), COALESCE(SUM(id), 0) FROM faces WHERE collection = ? AND model_sha256 = ?",
        (collection, model_sha256),
    )
    return list(row.fetchone())


def faces_of(
    db: sqlite3.Connection, collection: str, embedder: EmbedderKey, face_ids: list[int] | None
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Ids, subjects and embeddings of those of `face_ids` (None: all) the collection holds, made by `embedder`."""
    if face_ids is None:
        rows = db.execute(
            "SELECT id, subject_id, embedding FROM faces WHERE collection = ? AND model_sha256 = ?", (collection, embedder.sha256)
        ).fetchall()
    else:
        rows = []
        for start in range(0, len(face_ids), LOOKUP_CHUNK):
            chunk = face_ids[start : start + LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            rows += db.execute(
                f"SELECT id, subject_id, embedding FROM faces WHERE id IN ({marks}) AND collection = ? AND model_sha256 = ?",
                (*chunk, collection, embedder.sha256),
            ).fetchall()
    vectors = np.frombuffer(b"".join(r[2] for r in rows), "<f4").reshape(len(rows), embedder.dim)
    return np.array([r[0] for r in rows], np.int64), [r[1] for r in rows], vectors


def derived_state(
    db: sqlite3.Connection,
    path: Path,
    collection: str,
    embedder: EmbedderKey,
    config: IndexConfig,
    guard: bool,
    shared: MilvusIndex | None,
) -> Derived:
    """The collection's index (the persisted one if it reflects the database as it is, else built from it and
    persisted) and the open-set roster, with the change they reflect, all read in one snapshot:
    exactly the changes up to `applied`. `shared`: the Milvus index already open (a rebuild keeps it).
    With a folder for the index (the server's), the roster and a flat index's faces come from the
    host's snapshot (snapshot.py), built by the first process and mapped by the others."""
    if config.shared or config.directory is None:
        return built_state(db, path, collection, embedder, config, guard, shared)
    files = snapshot_files(config.directory, embedder, guard)
    with files.lock():  # taken before the read transaction: what the builder saved is seen
        db.execute("BEGIN")
        try:
            applied = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
            faces = fingerprint(db, collection, embedder.sha256)
            flat = index_kind(config.spec) == "faiss-flat"
            snapshot = files.load(
                guard,
                embedder.dim,
                lambda meta: ours(meta, collection, embedder) and reaches(db, meta, applied, faces),
            )
            if snapshot is not None and snapshot.applied != applied and not replayed(db, snapshot, collection, embedder):
                log.warning(
                    "gallery snapshot: its faces and the log since do not make the store's (faces changed outside the log): building"
                )
                snapshot = None
            if snapshot is None:
                snapshot = files.built(
                    guard, stamp(db, applied, faces, embedder, collection), lambda: faces_of(db, collection, embedder, None), follow
                )
            mapped = snapshot.applied if snapshot.mapped else None
            if flat:  # searches the snapshot's faces in place: both followed from its change
                index = tuned(FaissIndex(embedder.dim, config.spec, config.search_params, base=MappedFaces(snapshot.ids, snapshot.vectors)))
                applied = snapshot.applied
            else:  # the persisted index of `applied`, or one built from the faces; the roster brought up to it by the log
                rows = lambda: iter([(snapshot.ids, snapshot.vectors)])  # noqa: E731
                if snapshot.applied != applied:  # an earlier change's, which the log reaches (`reaches`)
                    since = changes_after(db, collection, snapshot.applied, applied - snapshot.applied) or []
                    replay(since, lambda face_ids: faces_of(db, collection, embedder, face_ids), roster=snapshot.roster)
                    rows = lambda: ((ids, vectors) for ids, _, vectors in [faces_of(db, collection, embedder, None)])  # noqa: E731
                index = persisted_index(db, collection, embedder, config, applied, faces, rows)
        finally:
            db.execute("COMMIT")
    log.info("gallery %s: %d faces searchable (%s) at change %d", path, index.size, index.spec, applied)
    return Derived(index, snapshot.roster, applied, mapped)


def snapshot_files(directory: Path, embedder: EmbedderKey, guard: bool) -> SnapshotFiles:
    """Where the host's processes share this embedder's guard (or roster) and faces."""
    return SnapshotFiles(directory, f"{embedder.sha256[:16]}-state-{'guard' if guard else 'roster'}")


def stamp(db: sqlite3.Connection, applied: int, faces: list[int] | None, embedder: EmbedderKey, collection: str) -> dict[str, Any]:
    """What a snapshot as of change `applied` is checked by (`ours`, `reaches`), read in the snapshot's transaction."""
    return {"applied": applied, "faces": faces, "change": change_at(db, applied), "model_sha256": embedder.sha256, "collection": collection}


def ours(meta: dict[str, Any], collection: str, embedder: EmbedderKey) -> bool:
    """A snapshot of this embedder's faces in this collection (one saved before collections: `default`'s),
    whatever folder it is found in: two empty collections' snapshots are otherwise alike."""
    return meta.get("model_sha256") == embedder.sha256 and meta.get("collection", DEFAULT) == collection


def reaches(db: sqlite3.Connection, meta: dict[str, Any], applied: int, faces: list[int]) -> bool:
    """A snapshot may start the state: it is of the database as it is (the change and the faces'
    fingerprint), or of an earlier change of this database (the log's row there as it was) that the
    log still reaches, to be followed from there (a flat index's faces with it; with an HNSW or IVF
    index, the roster alone, brought up to the persisted index's change at start)."""
    saved = meta.get("applied", -1)
    if saved == applied:
        return meta.get("faces") == faces
    first = db.execute("SELECT MIN(seq) FROM changes WHERE seq > ?", (saved,)).fetchone()[0]
    return 0 <= saved < applied and first == saved + 1 and meta.get("change") is not None and meta.get("change") == change_at(db, saved)


def replayed(db: sqlite3.Connection, snapshot: Snapshot, collection: str, embedder: EmbedderKey) -> bool:
    """The snapshot's faces with the log's adds and removes since are the embedder's faces in the
    collection now (what a change made outside the log, such as `facegate gallery reembed`, breaks)."""
    added: set[int] = set()
    removed: set[int] = set()
    for op, face_ids in db.execute("SELECT op, face_ids FROM changes WHERE seq > ? AND collection = ?", (snapshot.applied, collection)):
        (added if op == "add" else removed if op == "remove" else set()).update(json.loads(face_ids))
    now = np.array(
        [
            r[0]
            for r in db.execute("SELECT id FROM faces WHERE collection = ? AND model_sha256 = ? ORDER BY id", (collection, embedder.sha256))
        ],
        np.int64,
    )
    kept = np.setdiff1d(snapshot.ids, np.fromiter(removed, np.int64, len(removed)))
    return np.array_equal(np.union1d(kept, np.intersect1d(np.fromiter(added, np.int64, len(added)), now)), now)


def changes_after(db: sqlite3.Connection, collection: str, after: int, limit: int) -> list[Change] | None:
    """Up to `limit` of the log's changes after `after`, in order, as `collection` sees them; None once pruned past it."""
    # another collection's change is read as an add of no face: nothing here, and the numbers stay without gaps
    rows = db.execute(
        "SELECT seq, CASE WHEN collection = ? THEN op ELSE 'add' END, CASE WHEN collection = ? THEN face_ids ELSE '[]' END "
        "FROM changes WHERE seq > ? ORDER BY seq LIMIT ?",
        (collection, collection, after, limit),
    ).fetchall()
    if rows and rows[0][0] != after + 1:  # pruned past it: the faces are the truth
        return None
    return [(seq, op, json.loads(face_ids)) for seq, op, face_ids in rows]


def change_at(db: sqlite3.Connection, seq: int) -> str | None:
    """The log's row `seq` (what tells this database's change from another's of the same number); None once pruned."""
    row = db.execute("SELECT op, face_ids FROM changes WHERE seq = ?", (seq,)).fetchone()
    return f"{row[0]} {row[1]}" if row else None


def training_sample(rows: list[tuple], candidates: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, vectors, the candidates' ids) of TRAINING_FACES's and CHECK_CANDIDATES's rows (id,
    embedding), each face once: what `FaissIndex.train` takes."""
    seen = {r[0] for r in rows}
    rows = rows + [r for r in candidates if r[0] not in seen]
    vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), -1) if rows else np.zeros((0, 0), np.float32)
    return np.array([r[0] for r in rows], np.int64), vectors, np.array([r[0] for r in candidates], np.int64)


def sampler(
    db: sqlite3.Connection, collection: str, embedder: EmbedderKey, faces: list[int]
) -> Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """n of the collection's faces the embedder made, spread over the ids, with their ids: what an
    index that needs training trains on, and beside them the recall check's candidates
    (TRAINING_FACES, CHECK_CANDIDATES; `training_sample`)."""

    def sample(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sha, stride = embedder.sha256, max(faces[0] // max(n, 1), 1)
        rows = db.execute(for_sqlite(TRAINING_FACES), (collection, sha, stride, n)).fetchall()
        candidates = db.execute(for_sqlite(CHECK_CANDIDATES), (collection, sha, collection, sha, ASIDE)).fetchall()
        return training_sample(rows, candidates)

    return sample


def persisted_index(
    db: sqlite3.Connection,
    collection: str,
    embedder: EmbedderKey,
    config: IndexConfig,
    applied: int,
    faces: list[int],
    rows: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
) -> FaissIndex:
    """The persisted index where it holds exactly these faces (their fingerprint), or is stamped as of
    an earlier change the log still reaches (`reaches`: mapped, the log since applied to it, as
    PostgreSQL's start does, rather than rebuilt after a kill -9); else one built from `rows`
    (trained on the collection's sample), persisted and mapped (`saved_and_mapped`)."""
    sample = sampler(db, collection, embedder, faces)
    current = lambda m: m.get("faces") == faces or reaches(db, m, applied, faces)  # noqa: E731
    index, loaded = open_index(config, embedder.dim, embedder.sha256, faces[0], current, sample, rows)
    if loaded is not None and loaded.get("faces") != faces:  # an earlier change's: adds to its flat part, removes skipped
        since = changes_after(db, collection, loaded["applied"], applied - loaded["applied"]) or []
        replay(since, lambda face_ids: faces_of(db, collection, embedder, face_ids), index=index)
        if index.size != faces[0]:
            log.warning("gallery index: its faces and the log since do not make the store's (faces changed outside the log): building")
            index, loaded = open_index(config, embedder.dim, embedder.sha256, faces[0], lambda m: False, sample, rows)
    if loaded is None:
        index = saved_and_mapped(config, index, embedder.sha256, stamp(db, applied, faces, embedder, collection))
        release_freed()  # the heap of the copy built, now mapped instead
    return index


def built_state(
    db: sqlite3.Connection,
    path: Path,
    collection: str,
    embedder: EmbedderKey,
    config: IndexConfig,
    guard: bool,
    shared: MilvusIndex | None,
) -> Derived:
    """`derived_state` of this process alone (Milvus, or no folder to share a snapshot through)."""
    db.execute("BEGIN")
    try:
        applied = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
        ids, subjects, vectors = faces_of(db, collection, embedder, None)
        roster = follow(ids, subjects, vectors, guard)
        if config.shared:  # Milvus: nothing to load
            return Derived(shared or open_milvus(config, embedder.dim, embedder.sha256, collection), roster, applied)
        faces = fingerprint(db, collection, embedder.sha256)

        def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            for start in range(0, len(ids), 10_000):
                yield ids[start : start + 10_000], vectors[start : start + 10_000]

        index = persisted_index(db, collection, embedder, config, applied, faces, batches)
    finally:
        db.execute("COMMIT")
    log.info("gallery %s, collection %s: %d faces searchable (%s) at change %d", path, collection, index.size, index.spec, applied)
    return Derived(index, roster, applied)


class SqliteLog:
    """The change log as a process's follower reads it (follower.ChangeLog), through a connection of
    its own: the follower never waits for the store's lock, nor the store for a rebuild."""

    def __init__(self, path: Path, collection: str, embedder: EmbedderKey, config: IndexConfig, guard: bool):
        self.path, self.collection, self.embedder, self.config, self.guard = path, collection, embedder, config, guard
        self._db = connect(path)
        self._woken = threading.Event()

    def changes(self, after: int, limit: int) -> list[tuple[int, str, list[int]]] | None:
        return changes_after(self._db, self.collection, after, limit)

    def faces(self, face_ids: list[int]) -> tuple[np.ndarray, list[str], np.ndarray]:
        return faces_of(self._db, self.collection, self.embedder, face_ids)

    def rebuild(self, current: Derived | None) -> Derived:
        db = connect(self.path)  # its own: the log's connection stays free for the requests meanwhile
        try:
            shared = current.index if current is not None and isinstance(current.index, MilvusIndex) else None
            return derived_state(db, self.path, self.collection, self.embedder, self.config, self.guard, shared)
        finally:
            db.close()

    def share(self, state: Derived) -> bool:
        """The guard as the host's snapshot, saved as of its change (mapped by `shared_roster`, or with a
        flat index's faces by `rebuild`, then the log since applied), unless another process saved a newer one."""
        directory = self.config.directory
        if directory is None or not isinstance(state.roster, LeaveOneOut):
            return False
        files = snapshot_files(directory, self.embedder, self.guard)
        db = connect(self.path)
        try:
            with files.lock():
                if (files.applied() or -1) > (state.mapped or -1):
                    return True  # another worker's, newer
                db.execute("BEGIN")
                try:
                    applied = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
                    faces = (
                        fingerprint(db, self.collection, self.embedder.sha256) if applied == state.applied else None
                    )  # else only the log checks it
                    files.save(state.roster, stamp(db, state.applied, faces, self.embedder, self.collection))
                finally:
                    db.execute("COMMIT")
            return True
        except OSError as exc:
            log.warning("gallery snapshot not shared: %s", exc)
            return False
        finally:
            db.close()

    def index_stamp(self, applied: int) -> dict[str, Any] | None:
        self._db.execute("BEGIN")  # the change and the faces: one snapshot
        try:
            if self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0] != applied:
                return None
            return stamp(self._db, applied, fingerprint(self._db, self.collection, self.embedder.sha256), self.embedder, self.collection)
        finally:
            self._db.execute("COMMIT")

    def shared_roster(self, after: int) -> Snapshot | None:
        directory = self.config.directory
        if directory is None:
            return None
        files = snapshot_files(directory, self.embedder, self.guard)
        db = connect(self.path)
        try:
            with files.lock():
                db.execute("BEGIN")
                try:
                    applied = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
                    faces = fingerprint(db, self.collection, self.embedder.sha256)
                    return files.load(
                        self.guard,
                        self.embedder.dim,
                        lambda meta: (
                            meta.get("applied", -1) > after
                            and ours(meta, self.collection, self.embedder)
                            and reaches(db, meta, applied, faces)
                        ),  # an earlier change, the log since replayed
                    )
                finally:
                    db.execute("COMMIT")
        except OSError as exc:
            log.warning("gallery snapshot not mapped: %s", exc)
            return None
        finally:
            db.close()

    def resync(self, state: Derived) -> None:
        db = connect(self.path)
        try:
            db.execute("BEGIN")  # the ids, the faces read and the change they reflect: one snapshot
            applied = db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
            rows = db.execute("SELECT id FROM faces WHERE collection = ? AND model_sha256 = ?", (self.collection, self.embedder.sha256))
            now = np.array([r[0] for r in rows], np.int64)
            held = state.roster.ids() if state.roster is not None else np.empty(0, np.int64)
            added = faces_of(db, self.collection, self.embedder, np.setdiff1d(now, held).tolist())
            db.execute("COMMIT")
        finally:
            db.close()
        gone = np.setdiff1d(held, now)
        log.info(
            "gallery %s: %d faces added and %d removed since the rebuild read them (change %d)",
            self.path,
            len(added[0]),
            len(gone),
            applied,
        )
        remove(state, gone.tolist())
        add(state, *added)
        state.applied = applied

    def wait(self, timeout: float) -> None:
        self._woken.wait(timeout)  # SQLite announces nothing: the follower looks every `timeout` seconds
        self._woken.clear()

    def wake(self) -> None:
        self._woken.set()

    def close(self) -> None:
        self._db.close()


def write_ahead_log(db: sqlite3.Connection) -> None:
    """WAL mode, tried again while busy: SQLite answers the switch "database is locked" at once, its
    busy timeout not waited, while another connection opens or closes the file (workers starting
    together on a new gallery: one in 15 or so starts failed so)."""
    deadline = time.monotonic() + BUSY_SECONDS
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the gallery file (transactions opened explicitly: isolation_level=None)."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=BUSY_SECONDS)
    write_ahead_log(db)
    for pragma in ("synchronous=FULL", "foreign_keys=ON"):
        db.execute(f"PRAGMA {pragma}")
    db.create_function("facegate_name_key", 1, name_key, deterministic=True)  # migration 4
    return db


class SqliteGallery(FollowedStore, GalleryStore):
    on_request = ON_REQUEST  # what keeps a write made through another worker visible to the next search

    def __init__(
        self,
        path: Path,
        embedder: EmbedderKey | None,
        index: IndexConfig | None,
        guard: bool = True,
        background: bool = False,
        collection: str = DEFAULT,
    ):
        """`index` says which index mirrors the embedder's faces for search; None where nothing is
        searched (no embedder loaded, or a CLI maintenance command). `guard`: keep the open-set
        guard's leave-one-out scores (FACEGATE_OPEN_SET_GUARD), else only the roster. `background`:
        return once the database is open, the index and guard built by the follower's thread (the
        server listens meanwhile; `loading`). `collection`: the one collection this handle sees and
        changes (collections.py); every statement is held to it."""
        self.path = Path(path)
        self.collection = collection
        self.guard = guard
        self.background = background
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder
        self.index_config = index
        self._lock = threading.RLock()
        self._db = connect(self.path)  # writes open their transactions with BEGIN IMMEDIATE
        self._migrate()
        self.follower: Follower | None = None  # the index and roster, with an index config and an embedder
        self._load_index()

    def close(self) -> None:
        with self._lock:
            if self.follower is not None:
                index = self.follower.index
                if isinstance(index, FaissIndex) and self.index_config is not None:
                    self._save(index)
                self.follower.close()
                if isinstance(index, MilvusIndex):
                    index.close()
            self._db.close()

    def _save(self, index: FaissIndex) -> None:
        """Persist the index as of the log's last change, with the fingerprint of the faces then (read
        in one snapshot with the changes applied, so the two agree); not when the log no longer reaches it.
        The guard too, where the host shares it (a folder), unless saved as of that change already:
        the next start maps it instead of building it."""
        assert self.follower is not None and self.index_config is not None
        key = required_embedder(self.embedder)
        directory = self.index_config.directory
        files = snapshot_files(directory, key, self.guard) if directory is not None else None
        with files.lock() if files is not None else nullcontext(), self._snapshot(), self.follower.paused() as state:
            applied = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0]
            if state is None or state.applied != applied:
                return
            faces = self._fingerprint()
            save_index(self.index_config, index, key.sha256, stamp(self._db, applied, faces, key, self.collection))
            if files is not None and isinstance(state.roster, LeaveOneOut) and files.applied() != applied:
                try:
                    files.save(state.roster, stamp(self._db, applied, faces, key, self.collection))
                except OSError as exc:  # the next start builds it
                    log.warning("gallery snapshot not saved: %s", exc)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A transaction committed (durably: synchronous=FULL) before the caller answers."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException as exc:
                if self._db.in_transaction:  # also after a failed COMMIT (disk full): leave no open transaction
                    self._db.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise StorageFull(
                        f"the gallery's disk is full ({self.path.parent}): nothing was written; free space and retry"
                    ) from exc
                raise

    def _migrate(self) -> None:
        """Bring the database to SCHEMA_VERSION: each migration in its own transaction that first
        re-reads user_version, so opening twice (or two processes at once) applies it once."""
        with self._lock:
            self._db.executescript(SCHEMA)  # version 0; CREATE ... IF NOT EXISTS only
            for version, statements in enumerate(MIGRATIONS, 1):
                if self._schema_version() >= version:
                    continue  # no write lock taken when there is nothing to do
                with self._write() as db:
                    if self._schema_version() >= version:
                        continue
                    for statement in statements:
                        db.execute(statement)
                    db.execute(f"PRAGMA user_version = {version}")
                log.info("gallery %s: schema migrated to version %d", self.path, version)

    def _schema_version(self) -> int:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path} has schema version {version}, newer than this facegate's {SCHEMA_VERSION}: upgrade facegate")
        return version

    def _fingerprint(self) -> list[int]:
        return fingerprint(self._db, self.collection, required_embedder(self.embedder).sha256)

    def _load_index(self) -> None:
        """Build the index and roster (or load a persisted index that reflects the database as it is)
        and start following the log; report faces another model made (they are never compared)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT model_name, model_sha256, COUNT(*) FROM faces WHERE collection = ? GROUP BY 1, 2", (self.collection,)
            ).fetchall()
            self.incompatible = incompatible_models(rows, self.embedder)
            if self.index_config is None or self.embedder is None:
                return
            # Milvus gets each enrollment before its commit, from the index open: never built in the background
            background = self.background and not self.index_config.shared
            state = (
                None
                if background
                else derived_state(self._db, self.path, self.collection, self.embedder, self.index_config, self.guard, None)
            )
        changes = SqliteLog(self.path, self.collection, self.embedder, self.index_config, self.guard)
        self.follower = Follower(changes, state, FOLLOW_SECONDS, f"facegate-gallery-follower-{self.collection}")
        if state is not None and not self.follower.catch_up():  # from a snapshot of an earlier change: the log since
            self.follower.rebuild()
        self.follower.start()

    @contextmanager
    def _snapshot(self) -> Iterator[None]:
        """A read transaction: every read inside sees the database as of its first (WAL), whatever
        other processes commit meanwhile."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            self._db.execute("COMMIT")

    def _record(self, db: sqlite3.Connection, op: str, face_ids: list[int]) -> int:
        """Log a change to the searchable faces inside the caller's write; its number."""
        seq = inserted_id(
            db.execute("INSERT INTO changes (op, face_ids, collection) VALUES (?, ?, ?)", (op, json.dumps(face_ids), self.collection))
        )
        db.execute("DELETE FROM changes WHERE seq <= ?", (seq - CHANGES_KEPT,))
        return seq

    def _wrote(self, seq: int, op: str, face_ids: list[int], subject_id: str = "", vectors: np.ndarray | None = None) -> None:
        """A change this process committed, into its index and roster before it answers."""
        if self.follower is not None:
            self.follower.wrote(seq, op, face_ids, vectors, [subject_id] * len(face_ids))

    @classmethod
    def open(
        cls,
        data_dir: Path,
        embedder: EmbedderKey | None,
        searchable: bool = True,
        index: IndexConfig | None = None,
        guard: bool = True,
        background: bool = False,
        collection: str = DEFAULT,
    ) -> SqliteGallery:
        """The gallery under FACEGATE_DATA_DIR, with a FAISS index (exact flat unless `index` names
        another) when an embedder is active; a shared index (Milvus) even for maintenance, which writes to it."""
        config = index or IndexConfig()
        searched = config if embedder and (searchable or config.shared) else None
        return cls(Path(data_dir) / DATABASE, embedder, searched, guard, background, collection)

    # subjects

    def create_subject(self, name: str, metadata: dict[str, Any], subject_id: str | None = None, unique_name: bool = False) -> Subject:
        subject_id = subject_id or uuid.uuid4().hex
        now = time.time()
        try:
            with self._write() as db:
                db.execute(
                    "INSERT INTO subjects (collection, id, name, metadata, created, updated, name_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (self.collection, subject_id, name, json.dumps(metadata), now, now, name_key(name) if unique_name else None),
                )
        except sqlite3.IntegrityError as exc:
            raise taken(subject_id, name, "name_key" in str(exc)) from None
        return Subject(subject_id, name, metadata, now, now, 0, unique_name)

    def _subject_rows(self, where: str, params: tuple) -> list[Subject]:
        """Subjects of this collection `where` (its conditions follow the collection's) holds."""
        with self._lock:
            rows = self._db.execute(SUBJECT_SELECT + "WHERE s.collection = ? " + where, (self.collection, *params)).fetchall()
        return [subject_record(r) for r in rows]

    def get_subject(self, subject_id: str) -> Subject:
        rows = self._subject_rows("AND s.id = ?", (subject_id,))
        if not rows:
            raise SubjectNotFound(f"no subject with id {subject_id!r}")
        return rows[0]

    def subject_by_name(self, name: str) -> Subject:
        rows = self._subject_rows("AND s.name_key = ?", (name_key(name),))
        if not rows:
            raise SubjectNotFound(f"no subject named {name[:140]!r}")
        return rows[0]

    def unique_names(self, subject_ids: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        with self._lock:
            for start in range(0, len(subject_ids), LOOKUP_CHUNK):
                chunk = subject_ids[start : start + LOOKUP_CHUNK]
                rows = self._db.execute(
                    f"SELECT id, name FROM subjects WHERE collection = ? AND name_key IS NOT NULL AND id IN ({','.join('?' * len(chunk))})",
                    (self.collection, *chunk),
                )
                out.update(rows)
        return out

    def list_subjects(self, limit: int, offset: int, search: str | None = None) -> tuple[list[Subject], int]:
        if search is None:
            with self._lock:
                total = self._db.execute("SELECT COUNT(*) FROM subjects WHERE collection = ?", (self.collection,)).fetchone()[0]
                return self._subject_rows("ORDER BY s.created, s.id LIMIT ? OFFSET ?", (limit, offset)), total
        # A search reads every subject's name (`holding`), 0.3 s at 100,000 subjects: on a connection of
        # its own (WAL: a reader waits for no one), the store's lock left to the requests meanwhile.
        with closing(connect(self.path)) as db:
            found = holding(
                search, db.execute("SELECT id, name FROM subjects WHERE collection = ? ORDER BY created, id", (self.collection,))
            )
            page = json.dumps(found[offset : offset + limit])
            rows = db.execute(
                f"{SUBJECT_SELECT}WHERE s.collection = ? AND s.id IN (SELECT value FROM json_each(?)) ORDER BY s.created, s.id",
                (self.collection, page),
            ).fetchall()
        return [subject_record(r) for r in rows], len(found)

    def update_subject(self, subject_id: str, name: str | None, metadata: dict[str, Any] | None) -> Subject:
        try:
            with self._write() as db:
                current = db.execute(
                    "SELECT name, metadata, name_key FROM subjects WHERE collection = ? AND id = ?", (self.collection, subject_id)
                ).fetchone()
                if current is None:
                    raise SubjectNotFound(f"no subject with id {subject_id!r}")
                values = subject_update(current, name, metadata)
                db.execute(
                    "UPDATE subjects SET name = ?, metadata = ?, name_key = ?, updated = ? WHERE collection = ? AND id = ?",
                    (*values, time.time(), self.collection, subject_id),
                )
        except sqlite3.IntegrityError:
            raise taken(subject_id, values[0], True) from None
        return self.get_subject(subject_id)

    def delete_subject(self, subject_id: str) -> int:
        """Delete a subject and its faces from the database and the index; the number of faces."""
        with self._lock:
            with self._write() as db:
                ids = [
                    r[0] for r in db.execute("SELECT id FROM faces WHERE collection = ? AND subject_id = ?", (self.collection, subject_id))
                ]
                if db.execute("DELETE FROM subjects WHERE collection = ? AND id = ?", (self.collection, subject_id)).rowcount == 0:
                    raise SubjectNotFound(f"no subject with id {subject_id!r}")
                seq = self._record(db, "remove", ids)
            self._wrote(seq, "remove", ids)
        return len(ids)

    def merge_subjects(self, source_id: str, target_id: str) -> int:
        """Move every face of `source_id` to `target_id` and delete `source_id`, in one write; the
        number of faces moved. The index keeps their vectors (same ids); the open-set roster learns
        their new subject from the `move` change every process follows."""
        with self._lock:
            with self._write() as db:
                for subject_id in (source_id, target_id):
                    if not self._holds(db, subject_id):
                        raise SubjectNotFound(f"no subject with id {subject_id!r}")
                c = self.collection
                ids = [r[0] for r in db.execute("SELECT id FROM faces WHERE collection = ? AND subject_id = ? ORDER BY id", (c, source_id))]
                db.execute("UPDATE faces SET subject_id = ? WHERE collection = ? AND subject_id = ?", (target_id, c, source_id))
                db.execute("UPDATE subjects SET updated = ? WHERE collection = ? AND id = ?", (time.time(), c, target_id))
                db.execute("DELETE FROM subjects WHERE collection = ? AND id = ?", (c, source_id))
                seq = self._record(db, "move", ids) if ids else 0
            if ids:
                self._wrote(seq, "move", ids)
        return len(ids)

    def _holds(self, db: sqlite3.Connection, subject_id: str) -> bool:
        return db.execute("SELECT 1 FROM subjects WHERE collection = ? AND id = ?", (self.collection, subject_id)).fetchone() is not None

    # faces

    def add_faces(self, subject_id: str, faces: list[NewFace]) -> list[FaceRecord]:
        """Commit the faces, then make them searchable; all or none."""
        key, now = required_embedder(self.embedder), time.time()
        rows = [face_row(self.collection, subject_id, face, key, now) for face in faces]
        with self._lock:  # held past the commit, so no delete runs between the commit and the index add
            with self._write() as db:
                if not self._holds(db, subject_id):
                    raise SubjectNotFound(f"no subject with id {subject_id!r}")
                insert = f"INSERT INTO faces ({FACE_INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ids = [inserted_id(db.execute(insert, row)) for row in rows]
                seq = self._record(db, "add", ids)
                if self.index is not None and self.index.shared:  # before the commit: Milvus down = rolled back, 503
                    self.index.add(np.array(ids, np.int64), np.stack([f.embedding for f in faces]))
            self._wrote(
                seq, "add", ids, subject_id, np.stack([f.embedding for f in faces])
            )  # after the commit: only committed faces are searched
        return [FaceRecord(i, subject_id, f.box, f.landmarks, f.score, key.name, key.sha256, now) for i, f in zip(ids, faces, strict=True)]

    def list_faces(self, subject_id: str) -> list[FaceRecord]:
        self.get_subject(subject_id)
        with self._lock:
            rows = self._db.execute(
                FACE_SELECT + "WHERE collection = ? AND subject_id = ? ORDER BY id", (self.collection, subject_id)
            ).fetchall()
        return [face_record(r) for r in rows]

    def delete_face(self, face_id: int) -> str:
        """Delete a face, whichever model made it; its subject's id."""
        with self._lock:
            with self._write() as db:
                row = db.execute("SELECT subject_id FROM faces WHERE collection = ? AND id = ?", (self.collection, face_id)).fetchone()
                if row is None:
                    raise FaceNotFound(f"no face with id {face_id}")
                db.execute("DELETE FROM faces WHERE id = ?", (face_id,))
                seq = self._record(db, "remove", [face_id])
            self._wrote(seq, "remove", [face_id])
        return row[0]

    def delete_faces(self, face_ids: list[int]) -> dict[int, str]:
        """Delete those of `face_ids` the gallery holds, in one statement; {face id: subject id}."""
        ids = list(dict.fromkeys(face_ids))
        if not ids:
            return {}
        with self._lock:
            with self._write() as db:
                marks = ",".join("?" * len(ids))
                rows = db.execute(
                    f"DELETE FROM faces WHERE collection = ? AND id IN ({marks}) RETURNING id, subject_id", (self.collection, *ids)
                ).fetchall()
                seq = self._record(db, "remove", [r[0] for r in rows]) if rows else 0
            if rows:
                self._wrote(seq, "remove", [r[0] for r in rows])
        return dict(rows)

    def face_chip(self, face_id: int) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT crop FROM faces WHERE collection = ? AND id = ?", (self.collection, face_id)).fetchone()
        if row is None:
            raise FaceNotFound(f"no face with id {face_id}")
        return row[0]

    def subject_embeddings(self, subject_id: str) -> np.ndarray:
        """The subject's embeddings made by the active embedder (N×D; N may be 0)."""
        key = required_embedder(self.embedder)
        self.get_subject(subject_id)
        with self._lock:
            rows = self._db.execute(
                "SELECT embedding FROM faces WHERE collection = ? AND subject_id = ? AND model_sha256 = ?",
                (self.collection, subject_id, key.sha256),
            ).fetchall()
        return np.frombuffer(b"".join(r[0] for r in rows), dtype="<f4").reshape(len(rows), key.dim)

    # search

    def search(self, query: np.ndarray, top_k: int) -> list[Candidate]:
        """The top_k subjects by their best face's similarity, best first; each subject once
        (faces deleted while the search ran are dropped)."""
        self._loaded()  # what other worker processes enrolled or deleted since this one's follower looked
        index = self.index
        if index is None:
            return []
        return best_subjects(index, query, top_k, self.lookup_faces)

    def lookup_faces(self, face_ids: list[int]) -> dict[int, tuple[str, str, np.ndarray]]:
        """(subject id, name, embedding) of those of `face_ids` the database holds for this embedder."""
        sha = required_embedder(self.embedder).sha256
        out: dict[int, tuple[str, str, np.ndarray]] = {}
        with self._lock:
            for start in range(0, len(face_ids), LOOKUP_CHUNK):
                chunk = face_ids[start : start + LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    "SELECT f.id, s.id, s.name, f.embedding FROM faces f "
                    "JOIN subjects s ON s.collection = f.collection AND s.id = f.subject_id "
                    f"WHERE f.id IN ({marks}) AND f.collection = ? AND f.model_sha256 = ?",
                    (*chunk, self.collection, sha),
                )
                out.update((r[0], (r[1], r[2], np.frombuffer(r[3], "<f4"))) for r in rows)
        return out

    def face_chips(self, face_ids: list[int]) -> dict[int, FaceChip]:
        """The stored chips of those of `face_ids` that have one (FACEGATE_STORE_CROPS)."""
        rows: list[tuple] = []
        with self._lock:
            for start in range(0, len(face_ids), LOOKUP_CHUNK):
                chunk = face_ids[start : start + LOOKUP_CHUNK]
                marks = ",".join("?" * len(chunk))
                query = (
                    f"SELECT id, crop, crop_frame, crop_landmarks FROM faces WHERE collection = ? AND crop IS NOT NULL AND id IN ({marks})"
                )
                rows += self._db.execute(query, (self.collection, *chunk)).fetchall()
        return {r[0]: stored_chip(r[1], r[2], r[3]) for r in rows}

    def embeddings_after(self, after_id: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """Ids and embeddings of the active embedder's faces with id > after_id, in id order (a page)."""
        key = required_embedder(self.embedder)
        with self._lock:
            rows = self._db.execute(
                "SELECT id, embedding FROM faces WHERE collection = ? AND model_sha256 = ? AND id > ? ORDER BY id LIMIT ?",
                (self.collection, key.sha256, after_id, limit),
            ).fetchall()
        return np.array([r[0] for r in rows], np.int64), np.frombuffer(b"".join(r[1] for r in rows), "<f4").reshape(len(rows), key.dim)

    def mated_faces(self) -> tuple[np.ndarray, np.ndarray]:
        """Ids of the active embedder's faces whose subject has another, and their subjects (the recall check's queries)."""
        sha = required_embedder(self.embedder).sha256
        with self._lock:
            rows = self._db.execute(for_sqlite(MATED_FACES), (self.collection, sha, self.collection, sha)).fetchall()
        return np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], object)

    def read(self, sql: str, params: tuple) -> list[tuple]:
        """Rows of a read-only query, under the store's lock (`facegate gallery migrate` reads through it)."""
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def counts(self, searchable: int | None = None) -> dict[str, int]:
        """The database's counts; searchable: the index's size (as the caller read it, or now).
        Incompatible faces are counted in the database, not as faces − searchable: the index may be
        a few changes behind the database, and faces it has not applied yet are not incompatible."""
        sha = self.embedder.sha256 if self.embedder is not None else ""
        with self._lock:
            subjects, faces, other = self._db.execute(
                "SELECT (SELECT COUNT(*) FROM subjects WHERE collection = ?), (SELECT COUNT(*) FROM faces WHERE collection = ?), "
                "(SELECT COUNT(*) FROM faces WHERE collection = ? AND model_sha256 != ?)",
                (self.collection, self.collection, self.collection, sha),
            ).fetchone()
        if searchable is None:
            index = self.index
            searchable = index.size if index is not None else 0
        return {"subjects": subjects, "faces": faces, "searchable_faces": searchable, "incompatible_faces": other}

    def collection_counts(self) -> dict[str, dict[str, int]]:
        return {name: {"subjects": subjects, "faces": faces} for name, subjects, faces in self.read(COLLECTION_COUNTS, ())}

    def index_info(self) -> dict[str, Any] | None:
        index = self.index
        return index.describe() if index is not None else None

    def shape(self) -> GalleryShape:
        """The subjects, faces and guard an open-set decision holds a search to, as of the change the
        follower applied last."""
        self._loaded()
        roster = self.roster
        return roster.shape() if roster is not None else GalleryShape(0, 0)

    def replication(self) -> None:
        return None  # the processes sharing the file follow its log (follower.py); /readyz reports PostgreSQL's

    # maintenance

    def reembed(self, embed: Callable[[np.ndarray], np.ndarray], template: str, batch: int = 64) -> tuple[int, int]:
        """Re-embed faces another model made from their stored chips, each re-aligned onto `template`
        (the active embedder's alignment): (re-embedded, without a chip). Each batch is committed
        on its own, so an interrupted run keeps its progress and the next run goes on from there.

        Run it while no server uses this database; the server rebuilds its index at start-up. This collection's faces only.
        """
        key = required_embedder(self.embedder)
        done = 0
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT id, crop, crop_frame, crop_landmarks FROM faces "
                    "WHERE collection = ? AND model_sha256 != ? AND crop IS NOT NULL LIMIT ?",
                    (self.collection, key.sha256, batch),
                ).fetchall()
            if not rows:
                break
            vectors = embed(np.stack([stored_chip(r[1], r[2], r[3]).align(template) for r in rows]))
            with self._write() as db:
                db.executemany(
                    "UPDATE faces SET embedding = ?, model_name = ?, model_sha256 = ? WHERE id = ?",
                    [(embedding_blob(v), key.name, key.sha256, r[0]) for r, v in zip(rows, vectors, strict=True)],
                )
                if self.index is not None and self.index.shared:  # a local index is rebuilt at start-up instead
                    self.index.add(np.array([r[0] for r in rows], np.int64), vectors)
            done += len(rows)
        with self._lock:
            missing = self._db.execute(
                "SELECT COUNT(*) FROM faces WHERE collection = ? AND model_sha256 != ? AND crop IS NULL", (self.collection, key.sha256)
            ).fetchone()[0]
        return done, missing
