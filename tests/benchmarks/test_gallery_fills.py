"""The benchmarks that write a large gallery straight into SQLite's tables (faster than enrolling)
write rows the store reads as its own: after issue 50 every row names its collection, and a fill
that did not failed before anything was measured."""

from __future__ import annotations

import numpy as np

from benchmarks import follower_lag, loadtest, startup_workers
from service.core.models.manifest import EmbedderKey
from service.gallery.sqlite import SqliteGallery

KEY = EmbedderKey("bench", "b" * 64, 128)


def counts(folder, key: EmbedderKey) -> tuple[int, int]:
    gallery = SqliteGallery.open(folder, key, searchable=False)
    try:
        shape = gallery.counts()
        return shape["subjects"], shape["faces"]
    finally:
        gallery.close()


def test_each_fill_makes_a_gallery_of_default_s_subjects(tmp_path):
    startup_workers.fill(tmp_path / "startup", KEY, 7)
    follower_lag.fill(tmp_path / "lag", 5)
    loadtest.fill_gallery(tmp_path / "load", KEY, 6)
    assert counts(tmp_path / "startup", KEY) == (7, 7)
    assert counts(tmp_path / "lag", follower_lag.KEY) == (5, 5)
    assert counts(tmp_path / "load", KEY) == (6, 6)
    gallery = SqliteGallery.open(tmp_path / "load", KEY, guard=False)
    try:
        gallery.wait_loaded()
        assert gallery.search(np.ones(128, np.float32) / np.sqrt(128), 1)  # searchable, not only counted
    finally:
        gallery.close()
