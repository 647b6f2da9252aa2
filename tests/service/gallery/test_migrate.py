"""`facegate gallery migrate`: a SQLite gallery copied into PostgreSQL as it is (ids, metadata,
embeddings of every model, chips), resumable, and searchable there at once. Synthetic embeddings."""

import os
import subprocess
import sys

import numpy as np
import psycopg

from service.core.alignment import template_chip
from service.core.models.manifest import EmbedderKey
from service.gallery.interface import NewFace
from service.gallery.migrate import sqlite_to_postgres
from service.gallery.postgres import PostgresGallery
from service.gallery.sqlite import SqliteGallery
from tests.conftest import REPO

KEY = EmbedderKey("model-a", "a" * 64, 8)
OTHER = EmbedderKey("model-b", "b" * 64, 8)


def unit(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return x / np.linalg.norm(x)


def test_sqlite_to_postgres_copies_everything_and_resumes(tmp_path, database_url):
    source = SqliteGallery.open(tmp_path, KEY)
    for s in range(5):
        source.create_subject(f"S{s}", {"n": s, "nested": {"z": 1, "a": 2}}, f"s{s}")
        source.add_faces(f"s{s}", [NewFace(unit(10 * s + i), box=[1, 2, 3, 4], score=0.9) for i in range(3)])
    chip = template_chip(np.full((112, 112, 3), 5, np.uint8), "arcface_112")
    (with_chip,) = source.add_faces("s0", [NewFace(unit(99), chip=chip)])
    source.delete_face(2)  # a gap in the ids
    source.close()
    old = SqliteGallery.open(tmp_path, OTHER)
    old.add_faces("s1", [NewFace(unit(7))])  # another model's face comes along (re-embed it later)
    old.close()

    source = SqliteGallery.open(tmp_path, KEY, searchable=False)
    replica = PostgresGallery(database_url, KEY, pool_size=2)  # running while the copy lands
    target = PostgresGallery(database_url, KEY, searchable=False, pool_size=2)
    seen = []
    try:
        try:
            sqlite_to_postgres(
                source, target, batch=4, progress=lambda n, last: seen.append(last) or (n >= 8 and (_ for _ in ()).throw(KeyboardInterrupt))
            )
        except KeyboardInterrupt:
            pass  # interrupted after two batches of faces
        assert sqlite_to_postgres(source, target, batch=4) == (0, 16 - 8)  # subjects were there; the rest of the faces
        assert sqlite_to_postgres(source, target, batch=4) == (0, 0)  # nothing left
        assert target.counts() == {
            "subjects": 5,
            "faces": 16,
            "searchable_faces": 0,
            "incompatible_faces": 1,
        }  # not searched here, but made by KEY
        assert target.get_subject("s3").metadata == {"n": 3, "nested": {"z": 1, "a": 2}}
        assert [f.id for f in target.list_faces("s0")] == [1, 3, with_chip.id]
        assert replica.counts()["searchable_faces"] == 15  # the other model's face is not searched
        assert replica.search(unit(21), 1)[0].subject_id == "s2"  # the replica applied the copied faces' changes
        (new,) = target.add_faces("s4", [NewFace(unit(50))])
        assert new.id > with_chip.id + 1  # enrollment continues after the copied ids
        with psycopg.connect(database_url) as conn:
            crop, frame = conn.execute("SELECT crop, crop_frame FROM faces WHERE id = %s", (with_chip.id,)).fetchone()
        assert crop and frame == "arcface_112"  # the chip came along, so re-embedding works after the move
    finally:
        target.close()
        replica.close()
        source.close()


def test_migrate_command(tmp_path, database_url):
    source = SqliteGallery.open(tmp_path, KEY)
    source.create_subject("A", {}, "a")
    source.add_faces("a", [NewFace(unit(0)), NewFace(unit(1))])
    source.close()
    env = {**os.environ, "FACEGATE_DATABASE_URL": database_url}
    command = [sys.executable, "-c", "from service.cli import app; app()", "gallery", "migrate", str(tmp_path)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1 subjects and 2 faces copied" in result.stdout + result.stderr
    again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert "0 subjects and 0 faces copied" in again.stdout + again.stderr
