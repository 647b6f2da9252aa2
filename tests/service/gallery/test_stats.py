"""The gallery counts /readyz and /metrics show (service/gallery/stats.py), against a fake gallery
whose count takes longer than a caller waits (issue 37): a late result is kept and shown to the next
caller, a slow database that answers as usual is not reported down, one that stops answering or fails
is; the vector index is counted once per read (Milvus counts with a query)."""

from __future__ import annotations

import asyncio
import threading
import time

from service.core.errors import GalleryUnavailable
from service.gallery.stats import GalleryStats


class SlowGallery:
    """counts() takes `delay` seconds; `hang` makes the next reads block until released, `fail` raise."""

    def __init__(self, delay: float):
        self.delay, self.faces = delay, 3
        self.fail = False
        self.released = threading.Event()
        self.released.set()
        self.index_reads = 0

    def index_info(self) -> dict:
        self.index_reads += 1
        return {"backend": "fake", "size": self.faces}

    def counts(self, searchable: int | None = None) -> dict[str, int]:
        if searchable is None:  # counting the index again (a query on Milvus)
            searchable = self.index_info()["size"]
        self.released.wait(30)
        time.sleep(self.delay)
        if self.fail:
            raise GalleryUnavailable("the gallery database is unavailable")
        return {"subjects": 1, "faces": self.faces, "searchable_faces": searchable, "incompatible_faces": 0}

    def replication(self) -> None:
        return None


def run(coroutine):
    return asyncio.run(coroutine)


async def poll_until(stats: GalleryStats, done, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = await stats.snapshot()
        if done(snapshot):
            return snapshot
        await asyncio.sleep(0.05)
    raise AssertionError(f"not reached in {timeout} s: {snapshot}")


def test_a_count_that_takes_longer_than_the_wait_is_kept_and_shown():
    gallery = SlowGallery(delay=0.6)
    stats = GalleryStats(gallery, wait=0.05)  # every read outlasts every caller's wait

    async def scenario():
        first = await stats.snapshot()
        assert first.counts is None and not first.fresh  # nothing known yet: said so
        shown = await poll_until(stats, lambda s: s.counts is not None)
        assert shown.counts == {"subjects": 1, "faces": 3, "searchable_faces": 3, "incompatible_faces": 0}
        assert shown.index == {"backend": "fake", "size": 3} and shown.read_at is not None
        # the database answers as it usually does (in 0.6 s): the last counts are current, not an outage
        assert shown.fresh
        gallery.faces = 5
        updated = await poll_until(stats, lambda s: s.counts["faces"] == 5)
        assert updated.fresh and updated.read_at > shown.read_at

    run(scenario())
    stats.close()


def test_a_read_that_hangs_or_fails_turns_the_last_counts_stale():
    gallery = SlowGallery(delay=0.2)
    stats = GalleryStats(gallery, wait=0.05)

    async def scenario():
        known = await poll_until(stats, lambda s: s.counts is not None)
        assert known.fresh
        await asyncio.sleep(0.3)  # the read under way, if any, is done
        gallery.released.clear()  # the database stops answering
        hung = await poll_until(stats, lambda s: not s.fresh, timeout=5)
        assert hung.counts == known.counts  # the last known counts, marked stale
        gallery.fail = True
        gallery.released.set()  # it answers again, with an error
        await asyncio.sleep(0.5)
        failed = await stats.snapshot()
        assert not failed.fresh and failed.counts == known.counts
        gallery.fail = False
        back = await poll_until(stats, lambda s: s.fresh, timeout=5)
        assert back.counts == known.counts

    run(scenario())
    stats.close()


def test_a_fast_count_is_fresh_at_once_and_counts_the_index_once():
    gallery = SlowGallery(delay=0)
    stats = GalleryStats(gallery, wait=1)
    snapshot = run(stats.snapshot())
    stats.close()
    assert snapshot.fresh and snapshot.counts["faces"] == 3
    assert gallery.index_reads == 1, "one read counts the index once (Milvus: one count(*) query)"


def test_readyz_and_metrics_show_the_counts_of_a_gallery_whose_count_takes_seconds(api, monkeypatch):
    """Through the app: with every count taking 1 s (four times the routes' wait), /readyz shows the
    counts once the first read is done (not null forever) and /metrics says the gallery is up."""
    gallery = api.app.state.service.gallery
    counts = gallery.counts

    def slow_counts(*args, **kwargs):
        time.sleep(1.0)
        return counts(*args, **kwargs)

    monkeypatch.setattr(gallery, "counts", slow_counts)
    assert api.post("/subjects", json={"id": "a", "name": "A"}).status_code == 201
    deadline = time.monotonic() + 20
    while (body := api.get("/readyz").json()["gallery"])["subjects"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert body["subjects"] == 1 and body["faces"] == 0, body
    time.sleep(1.2)  # the read under way is done; the next one starts and outlasts the wait, as usual
    body = api.get("/readyz").json()["gallery"]
    assert body["subjects"] == 1 and "stale" not in body, body
    assert 'facegate_gallery_up{collection="default"} 1.0' in api.get("/metrics").text


def test_a_worker_behind_the_log_reports_no_incompatible_faces(tmp_path):
    """A worker whose index has not applied another worker's enrollment yet counts that face as not
    searchable yet, never as made by another embedder (its count was faces − index size)."""
    import numpy as np

    from service.core.models.manifest import EmbedderKey
    from service.gallery.interface import NewFace
    from service.gallery.sqlite import SqliteGallery

    key = EmbedderKey("model-a", "a" * 64, 8)
    a, b = SqliteGallery.open(tmp_path, key), SqliteGallery.open(tmp_path, key)
    try:
        b.follower.close()  # b stops following: its index stays behind the database
        a.create_subject("A", {}, "a")
        a.add_faces("a", [NewFace(np.eye(8, dtype=np.float32)[0])])
        snapshot = run(GalleryStats(b).snapshot())
        assert snapshot.counts == {"subjects": 1, "faces": 1, "searchable_faces": 0, "incompatible_faces": 0}
        assert snapshot.index["size"] == 0
    finally:
        a.close()
        b.close()
