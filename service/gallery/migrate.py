"""Moving a gallery from its SQLite file into PostgreSQL (`facegate gallery migrate`): subjects and
faces copied as they are (ids, unique names' keys, embeddings of every model, chips), a batch per
transaction, each with its change rows (one per collection) so running replicas apply it. Resumable: a rerun skips what
is there (by id) and goes on after the largest face id PostgreSQL holds. From there `facegate
gallery sync-index` fills Milvus.
"""

from __future__ import annotations

from collections.abc import Callable

from service.gallery.postgres import PostgresGallery
from service.gallery.sqlite import FACE_INSERT_COLUMNS, SqliteGallery
from service.gallery.sync import one_row, record_change

FACE_COLUMNS = f"id, {FACE_INSERT_COLUMNS}"
SUBJECT_COLUMNS = "collection, id, name, metadata, created, updated, name_key"


def sqlite_to_postgres(
    source: SqliteGallery, target: PostgresGallery, batch: int = 1000, progress: Callable[[int, int], None] | None = None
) -> tuple[int, int]:
    """Copy every subject of every collection, then every face in id order; (subjects, faces) copied by this run."""
    subjects = faces = 0
    last = ("", "")
    select = f"SELECT {SUBJECT_COLUMNS} FROM subjects WHERE (collection, id) > (?, ?) ORDER BY collection, id LIMIT ?"
    while rows := source.read(select, (*last, batch)):
        with target.pool.connection() as conn:
            inserted = [
                conn.execute(
                    f"INSERT INTO subjects ({SUBJECT_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT (collection, id) DO NOTHING RETURNING id",
                    row,
                ).fetchone()
                for row in rows
            ]
        subjects += sum(1 for r in inserted if r)
        last = rows[-1][0], rows[-1][1]
    with target.pool.connection() as conn:
        after = one_row(conn.execute("SELECT COALESCE(MAX(id), 0) FROM faces"))[0]
    insert = (
        f"INSERT INTO faces ({FACE_COLUMNS}) VALUES ({', '.join(['%s'] * len(FACE_COLUMNS.split(',')))}) "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )
    while rows := source.read(f"SELECT {FACE_COLUMNS} FROM faces WHERE id > ? ORDER BY id LIMIT ?", (after, batch)):
        with target.pool.connection() as conn:
            collection_of = {row[0]: row[1] for row in rows}  # FACE_COLUMNS: id, collection, ...
            ids = [r[0] for r in (conn.execute(insert, row).fetchone() for row in rows) if r]
            for collection in dict.fromkeys(collection_of[i] for i in ids):
                record_change(conn, collection, "add", [i for i in ids if collection_of[i] == collection])
        faces += len(ids)
        after = rows[-1][0]
        if progress:
            progress(faces, after)
    with target.pool.connection() as conn:  # new enrollments continue after the copied ids
        conn.execute("SELECT setval(pg_get_serial_sequence('faces', 'id'), GREATEST((SELECT COALESCE(MAX(id), 0) FROM faces), 1))")
    return subjects, faces
