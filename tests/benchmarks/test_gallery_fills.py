"""`benchmarks/loadtest.py`'s fill, which the benchmarks that need a large gallery write straight into
SQLite's tables with (loadtest, startup_workers, follower_lag: faster than enrolling), writes rows
the store reads as its own: after issue 50 every row names its collection, and a fill that did not
failed before anything was measured."""

from __future__ import annotations

import numpy as np

from benchmarks.loadtest import fill_gallery, fill_postgres
from service.core.models.manifest import EmbedderKey
from service.gallery.sqlite import SqliteGallery

KEY = EmbedderKey("bench", "b" * 64, 128)


def test_the_fill_makes_a_searchable_gallery_of_default_s_subjects(tmp_path):
    fill_gallery(tmp_path, KEY, 6)
    gallery = SqliteGallery.open(tmp_path, KEY, guard=False)
    try:
        assert gallery.wait_loaded()
        shape = gallery.counts()
        assert (shape["subjects"], shape["faces"], shape["searchable_faces"]) == (6, 6, 6)
        assert gallery.search(np.ones(128, np.float32) / np.sqrt(128), 1)
    finally:
        gallery.close()


def test_the_postgres_fill_makes_a_searchable_gallery(database_url):
    """startup_workers' `--store postgres` fill (COPY into the migrated tables)."""
    from service.gallery.postgres import PostgresGallery

    fill_postgres(database_url, KEY, 6)
    gallery = PostgresGallery(database_url, KEY, guard=False)
    try:
        shape = gallery.counts()
        assert (shape["subjects"], shape["faces"], shape["searchable_faces"]) == (6, 6, 6)
        assert gallery.search(np.ones(128, np.float32) / np.sqrt(128), 1)
    finally:
        gallery.close()
