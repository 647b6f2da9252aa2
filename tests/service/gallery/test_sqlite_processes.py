"""Several processes on one SQLite gallery (`facegate serve --workers N`): each keeps its own index
and follows the change log, so what one commits is in every other's next search, in commit order;
one that fell behind the log rebuilds its index from the faces in the background, never in a request. Two stores on one file stand for
two processes (each its own connection and index). Synthetic embeddings, no models."""

import multiprocessing
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from service.core.models.manifest import EmbedderKey
from service.gallery import follower, sqlite
from service.gallery.index import IndexConfig, MappedIndex
from service.gallery.interface import NewFace
from service.gallery.sqlite import SqliteGallery
from tests.polling import wait_until

KEY = EmbedderKey("model-a", "a" * 64, 8)


def unit(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return x / np.linalg.norm(x)


def found(store: SqliteGallery, seed: int) -> list[str]:
    return [c.subject_id for c in store.search(unit(seed), top_k=10)]


@pytest.fixture(params=[("Flat", ""), ("HNSW32", "efSearch=64")], ids=["Flat", "HNSW32"])
def two(tmp_path, request):
    """Two processes' stores on one gallery, on the exact index and on a persisted approximate one."""
    config = IndexConfig(*request.param, tmp_path / "index")
    first, second = SqliteGallery.open(tmp_path, KEY, index=config), SqliteGallery.open(tmp_path, KEY, index=config)
    yield first, second
    first.close()
    second.close()


def test_an_enrollment_through_one_is_found_by_the_other(two):
    a, b = two
    a.create_subject("A", {}, "a")
    a.add_faces("a", [NewFace(unit(1))])
    assert found(b, 1)[0] == "a" and found(a, 1)[0] == "a"
    b.create_subject("B", {}, "b")
    b.add_faces("b", [NewFace(unit(2)), NewFace(unit(3))])
    assert found(a, 2)[0] == "b" and found(a, 3)[0] == "b"
    assert a.counts()["searchable_faces"] == b.counts()["searchable_faces"] == 3


def test_deletions_through_one_reach_the_other(two):
    a, b = two
    a.create_subject("A", {}, "a")
    one, _ = a.add_faces("a", [NewFace(unit(1)), NewFace(unit(2))])
    a.create_subject("C", {}, "c")
    a.add_faces("c", [NewFace(unit(5))])
    assert found(b, 1)[0] == "a"
    b.delete_face(one.id)  # one face, through the other process
    assert "a" in found(a, 2) and a.index.size == 2
    b.delete_subject("a")
    assert "a" not in found(a, 2) and a.index.size == b.index.size == 1
    assert found(a, 5)[0] == "c"


def test_interleaved_writes_apply_in_commit_order(two):
    """Each store's own write lands in its index at once; the other's, before its next search."""
    a, b = two
    for i in range(6):
        writer, other = (a, b) if i % 2 else (b, a)
        writer.create_subject(f"s{i}", {}, f"s{i}")
        writer.add_faces(f"s{i}", [NewFace(unit(10 + i))])
        if i % 3 == 2:
            other.delete_subject(f"s{i - 1}")
    expected = {f"s{i}" for i in range(6)} - {"s1", "s4"}
    for store in (a, b):
        assert {c.subject_id for c in store.search(unit(10), top_k=100)} == expected
        assert store.index.size == len(expected)


def test_a_process_behind_the_whole_log_rebuilds_its_index(two, monkeypatch):
    monkeypatch.setattr(sqlite, "CHANGES_KEPT", 3)
    a, b = two
    for i in range(8):  # more changes than the log keeps, while b searches nothing
        a.create_subject(f"s{i}", {}, f"s{i}")
        a.add_faces(f"s{i}", [NewFace(unit(20 + i))])
    a.delete_subject("s0")
    assert a._db.execute("SELECT COUNT(*) FROM changes").fetchone()[0] == 3
    wait_until(lambda: b.applied == a.applied, "b rebuilt its index in the background")
    assert {c.subject_id for c in b.search(unit(21), top_k=100)} == {f"s{i}" for i in range(1, 8)}
    assert b.index.size == 7


def test_a_request_never_pays_for_the_rebuild(tmp_path, monkeypatch):
    """A worker past the log rebuilds its index and guard off the request path: while the rebuild is
    held, its searches answer at once from the last state it had (and its own writes are in it),
    and the rebuilt state, when let go, holds every process's changes."""
    monkeypatch.setattr(sqlite, "CHANGES_KEPT", 3)
    a, b = SqliteGallery.open(tmp_path, KEY), SqliteGallery.open(tmp_path, KEY)
    release, builders = threading.Event(), []
    build = sqlite.follow

    def held(*args, **kwargs):  # the roster's build, which every rebuild runs
        builders.append(threading.current_thread())
        release.wait(30)
        return build(*args, **kwargs)

    try:
        b.create_subject("B", {}, "b")
        b.add_faces("b", [NewFace(unit(1))])
        monkeypatch.setattr(sqlite, "follow", held)
        with b.follower._lock:  # b applies none of them meanwhile (a loaded machine let it keep up): past the log
            for i in range(6):
                a.create_subject(f"s{i}", {}, f"s{i}")
                a.add_faces(f"s{i}", [NewFace(unit(20 + i))])
        wait_until(lambda: builders, "b's follower started a rebuild")
        assert found(b, 1)[0] == "b"  # answered from b's last state while the rebuild is held
        b.add_faces("b", [NewFace(unit(2))])  # its own write, acknowledged during the rebuild ...
        assert found(b, 2)[0] == "b"  # ... is in its next search
        assert builders == [b.follower._thread] and b.follower.rebuilds == 0
        release.set()
        wait_until(lambda: b.follower.rebuilds == 1 and b.applied == a.applied, "b swapped its rebuilt index in")
        assert set(found(b, 20)) == {"b", *(f"s{i}" for i in range(6))} and b.index.size == 8
        assert (b.shape().subjects, b.shape().faces) == (7, 8)
    finally:
        release.set()
        a.close()
        b.close()


def test_a_reopened_store_applies_only_what_came_after_its_snapshot(tmp_path):
    """The index is built and its change number read in one snapshot: nothing applied twice, nothing missed."""
    a = SqliteGallery.open(tmp_path, KEY)
    a.create_subject("A", {}, "a")
    a.add_faces("a", [NewFace(unit(1))])
    b = SqliteGallery.open(tmp_path, KEY)
    assert b.applied == a.applied == 1 and b.index.size == 1
    a.add_faces("a", [NewFace(unit(2))])
    assert found(b, 2)[0] == "a" and b.index.size == 2
    a.close()
    b.close()


def test_the_open_set_roster_and_its_guard_follow_the_log_too(tmp_path):
    """An identify's threshold depends on the gallery's subjects, faces and leave-one-out guard
    (service/core/open_set.py): every process holds the same ones once it has applied the same
    changes, whoever made them, so the workers of one host decide alike."""
    a, b = SqliteGallery.open(tmp_path, KEY), SqliteGallery.open(tmp_path, KEY)
    try:
        for i in range(120):  # past the guard's 100 subjects
            writer = a if i % 3 else b
            writer.create_subject(f"s{i}", {}, f"s{i}")
            writer.add_faces(f"s{i}", [NewFace(unit(1000 + i))] * (1 + i % 2))
        first, second = a.shape(), b.shape()
        assert first.tail is not None and (first.subjects, first.faces) == (120, 180)
        assert second.subjects == first.subjects and second.faces == first.faces
        assert (second.tail.m, second.tail.samples) == (first.tail.m, first.tail.samples)
        assert (second.tail.u, second.tail.beta) == pytest.approx((first.tail.u, first.tail.beta), rel=1e-9)
        b.delete_subject("s7")
        a.delete_face(a.list_faces("s9")[0].id)
        assert (a.shape().subjects, a.shape().faces) == (b.shape().subjects, b.shape().faces) == (119, 177)
        assert b.shape().tail.u == pytest.approx(a.shape().tail.u, rel=1e-9)
    finally:
        a.close()
        b.close()


def test_a_merge_through_one_reaches_the_others_roster(two):
    a, b = two
    a.create_subject("A", {}, "a")
    a.create_subject("A again", {}, "a2")
    a.add_faces("a", [NewFace(unit(1))])
    a.add_faces("a2", [NewFace(unit(2))])
    wait_until(lambda: b.shape().subjects == 2, "b follows the two subjects")
    a.merge_subjects("a2", "a")
    wait_until(lambda: b.shape().subjects == 1, "b follows the merge")
    assert found(b, 2)[0] == "a" and b.index.size == 2


def test_a_rebuild_the_log_outran_catches_up_by_difference(tmp_path, monkeypatch):
    """Writes faster than a rebuild (the log pruned past the rebuilt state before it is swapped in)
    must not rebuild again and again: the faces added and removed since are applied, once."""
    monkeypatch.setattr(sqlite, "CHANGES_KEPT", 3)
    a, b = SqliteGallery.open(tmp_path, KEY), SqliteGallery.open(tmp_path, KEY)
    release, builds = threading.Event(), []
    build = sqlite.follow

    def held(*args, **kwargs):
        builds.append(threading.current_thread())
        release.wait(30)
        return build(*args, **kwargs)

    try:
        a.create_subject("A", {}, "a")
        (first,) = a.add_faces("a", [NewFace(unit(1))])
        wait_until(lambda: b.applied == a.applied, "b follows")
        monkeypatch.setattr(sqlite, "follow", held)
        with b.follower._lock:  # b applies none of them meanwhile: past the log, b rebuilds
            for i in range(5):
                a.add_faces("a", [NewFace(unit(40 + i))])
        wait_until(lambda: builds, "b's rebuild started")
        a.delete_face(first.id)  # while it is held, past the log again
        for i in range(5):
            a.create_subject(f"s{i}", {}, f"s{i}")
            a.add_faces(f"s{i}", [NewFace(unit(50 + i))])
        release.set()
        wait_until(lambda: b.follower.rebuilds == 1 and b.applied == a.applied, "b swapped its state in")
        assert len(builds) == 1  # built once, then brought up to the store by difference
        assert sorted(b.roster.ids().tolist()) == sorted(r[0] for r in b._db.execute("SELECT id FROM faces"))
        assert b.index.size == 10 and (b.shape().subjects, b.shape().faces) == (6, 10)
        assert first.id not in {c.face_id for c in b.search(unit(1), top_k=10)}
    finally:
        release.set()
        a.close()
        b.close()


def test_workers_map_the_one_saved_hnsw_index_and_search_what_changed_since(tmp_path):
    """Issue 44: the first process builds the HNSW graph and saves it, and every process, the builder
    too, maps the saved file (one inode, nothing read into a copy of its own); faces enrolled and
    deleted since, through either, are searched by both as a flat index searches the store as it is."""
    sixty_subjects(tmp_path)
    config = IndexConfig("HNSW16", "efSearch=256", tmp_path / "index")
    a, b = SqliteGallery.open(tmp_path, KEY, index=config), SqliteGallery.open(tmp_path, KEY, index=config)
    try:
        files = {os.fstat(s.index.base._fd).st_ino for s in (a, b) if isinstance(s.index.base, MappedIndex)}
        assert len(files) == 1 and len(list((tmp_path / "index").glob("*.faiss"))) == 1
        a.create_subject("new", {}, "new")
        a.add_faces("new", [NewFace(unit(7)), NewFace(unit(8))])
        b.delete_subject("s3")
        b.delete_subject("s4")
        assert_found_as_flat(tmp_path, [a, b], [7, 8, 103, 104, *range(110, 130)])
        assert a.index.size == b.index.size == 60
    finally:
        a.close()
        b.close()


def sixty_subjects(data) -> None:
    store = SqliteGallery.open(data, KEY, index=IndexConfig("Flat", "", data / "index"))
    for i in range(60):
        store.create_subject(f"s{i}", {}, f"s{i}")
        store.add_faces(f"s{i}", [NewFace(unit(100 + i))])
    store.close()


def assert_found_as_flat(data, stores: list[SqliteGallery], seeds: list[int]) -> None:
    """Each store's answers are those of a flat index built from the store as it is."""
    exact = SqliteGallery.open(data, KEY, index=IndexConfig("Flat", "", None))
    try:
        for seed in seeds:
            expected = [c.subject_id for c in exact.search(unit(seed), top_k=10)]
            assert all(found(store, seed) == expected for store in stores), seed
    finally:
        exact.close()


def mapped_file(store: SqliteGallery) -> int | None:
    base = store.index.base if store.index is not None else None
    return os.fstat(base._fd).st_ino if isinstance(base, MappedIndex) else None


def test_a_worker_s_changes_past_the_bound_are_saved_once_and_mapped_by_every_worker(tmp_path, monkeypatch):
    """Past REMAP changes (or 1/8 of the faces) since its file, a worker's follower saves its state as
    the host's file, under the lock, and maps it; another past the bound maps that file and applies
    the log since, rather than saving its own: one file for both, a flat part of neither's own, and
    the answers a flat index gives."""
    monkeypatch.setattr(follower, "REMAP", 4)  # 60 faces: the bound is 1/8 of them, 7
    sixty_subjects(tmp_path)
    config = IndexConfig("HNSW16", "efSearch=256", tmp_path / "index")
    a, b = SqliteGallery.open(tmp_path, KEY, index=config), SqliteGallery.open(tmp_path, KEY, index=config)
    try:
        first = mapped_file(a)
        assert first is not None and mapped_file(b) == first
        a.create_subject("new", {}, "new")
        a.add_faces("new", [NewFace(unit(200 + i)) for i in range(8)])
        b.delete_subject("s3")
        wait_until(lambda: mapped_file(a) == mapped_file(b) != first, "both workers map the file saved past the bound")
        assert len(list((tmp_path / "index").glob("*.faiss"))) == 1
        assert a.index.since_mapped == b.index.since_mapped == 0 and a.index.size == b.index.size == 67
        a.add_faces("new", [NewFace(unit(300))])
        b.delete_subject("s4")
        assert_found_as_flat(tmp_path, [a, b], [3, 4, 103, 104, 300, *range(200, 208), *range(110, 120)])
    finally:
        a.close()
        b.close()
    again = SqliteGallery.open(tmp_path, KEY, index=config)  # the shutdown's save stamped the state: the next start maps it
    try:
        assert again.index.size == 67 and mapped_file(again) is not None
    finally:
        again.close()


def remap_and_die(data: str) -> None:
    """A worker that adds past the bound, saves and maps its state as the host's file, and is killed
    there: no shutdown's save."""
    follower.REMAP = 4  # 60 faces: the bound is 1/8 of the 68, 8
    store = SqliteGallery.open(Path(data), KEY, index=IndexConfig("HNSW16", "efSearch=256", Path(data) / "index"))
    first = mapped_file(store)
    store.create_subject("new", {}, "new")
    store.add_faces("new", [NewFace(unit(200 + i)) for i in range(8)])
    wait_until(lambda: mapped_file(store) not in (None, first), "the state saved past the bound and mapped")
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_file_saved_past_the_bound_starts_the_next_process_after_a_kill(tmp_path):
    """The file a worker saves past the bound is stamped as of its change, as a shutdown's save is:
    after a kill -9 the next start maps it rather than building the index from the store, and
    answers as a flat index of the store does."""
    sixty_subjects(tmp_path)
    worker = multiprocessing.get_context("spawn").Process(target=remap_and_die, args=(str(tmp_path),))
    worker.start()
    worker.join(120)
    assert worker.exitcode == -signal.SIGKILL
    saved = sorted(p.name for p in (tmp_path / "index").glob("*.faiss"))
    again = SqliteGallery.open(tmp_path, KEY, index=IndexConfig("HNSW16", "efSearch=256", tmp_path / "index"))
    try:
        assert sorted(p.name for p in (tmp_path / "index").glob("*.faiss")) == saved and len(saved) == 1  # mapped, not built and saved
        assert mapped_file(again) == (tmp_path / "index" / saved[0]).stat().st_ino
        assert again.index.size == 68 and again.index.since_mapped == 0  # type: ignore[union-attr]
        assert_found_as_flat(tmp_path, [again], [3, 103, 119, *range(200, 208)])
    finally:
        again.close()


def open_together(path: Path, start, errors) -> None:
    """One worker's start-up: open the gallery file (migrating it if need be) at the same moment as the others."""
    start.wait(10)
    try:
        SqliteGallery(path, None, None).close()
    except Exception as exc:  # reported to the test, which names it
        errors.put(f"{type(exc).__name__}: {exc}")


def test_workers_starting_together_on_a_new_gallery_all_open_it(tmp_path):
    """SQLite answers a switch to WAL "database is locked" at once, without waiting its busy timeout,
    while another connection opens or closes the file: workers starting on a new gallery failed so
    (one start in 15 here, three processes), and the server with them."""
    context = multiprocessing.get_context("fork")  # the module is imported already: the race, not the imports, is timed
    errors = context.Queue()
    for trial in range(50):
        start = context.Barrier(3)
        workers = [context.Process(target=open_together, args=(tmp_path / str(trial) / "g.sqlite3", start, errors)) for _ in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
            assert worker.exitcode == 0
        assert errors.empty(), f"trial {trial}: {errors.get()}"
