"""The gallery's derived state is built once per host (service/gallery/snapshot.py): the first
process builds the guard and saves it, the others map what it saved and answer exactly as a build
would; a snapshot that is stale, of another state or damaged is never used."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import threading
import tracemalloc
import weakref
from dataclasses import astuple
from pathlib import Path

import numpy as np
import pytest

from service.core import open_set
from service.core.open_set import LeaveOneOut
from service.gallery import follower, snapshot, sqlite
from service.gallery.index import IndexConfig
from service.gallery.interface import GalleryStore, NewFace
from service.gallery.sqlite import SqliteGallery
from tests.polling import wait_until
from tests.service.gallery.test_sqlite_processes import KEY, assert_found_as_flat, found, mapped_file, sixty_subjects, unit

SUBJECTS = 120  # past the guard's 100 subjects: a tail to compare


def config(data: Path, spec: str = "Flat") -> IndexConfig:
    return IndexConfig(spec, "", data / "index")


def fill(store: GalleryStore, subjects: int = SUBJECTS) -> None:
    for i in range(subjects):
        store.create_subject(f"s{i}", {}, f"s{i}")
        store.add_faces(f"s{i}", [NewFace(unit(1000 + i))] * (1 + i % 3))


def count_builds(monkeypatch, store_module) -> list[int]:
    """One entry per guard or roster `store_module` (sqlite or postgres) builds from its store's faces in this process."""
    counted: list[int] = []
    build = store_module.follow

    def counting(ids, *args, **kwargs):
        counted.append(len(ids))
        return build(ids, *args, **kwargs)

    monkeypatch.setattr(store_module, "follow", counting)
    return counted


@pytest.fixture
def builds(monkeypatch) -> list[int]:
    return count_builds(monkeypatch, sqlite)


def state(store: SqliteGallery) -> tuple:
    """What an identify decides with: the gallery's shape and tail, and each face's leave-one-out score."""
    shape, guard = store.shape(), store.leave_one_out()
    assert guard is not None
    scores = dict(zip(guard.ids().tolist(), guard._score[: len(guard.ids())].tolist(), strict=True))
    return shape.subjects, shape.faces, shape.tail, scores


def assert_decides_as(store: GalleryStore, built: tuple) -> None:
    """`store`'s guard decides as `built`, the `state` of a guard built from the store: the same shape,
    its tail and scores but for float32 rounding (the products summed in another order)."""
    got = state(store)  # type: ignore[arg-type]
    tails = [astuple(tail) if tail is not None else () for tail in (got[2], built[2])]  # None: too few subjects for one
    assert got[:2] == built[:2] and tails[0] == pytest.approx(tails[1], rel=1e-5)
    assert got[3] == pytest.approx(built[3], abs=1e-6)


def test_the_second_process_maps_what_the_first_built(tmp_path, builds):
    first = SqliteGallery.open(tmp_path, KEY)  # no index folder: built here alone
    fill(first)
    first.close()
    built = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    mapped = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    alone = SqliteGallery.open(tmp_path, KEY)
    try:
        assert len(builds) == 3  # first, built, alone: `mapped` built nothing
        guard = mapped.leave_one_out()
        assert guard is not None and isinstance(guard._vectors, np.memmap) and isinstance(guard._top, np.memmap)
        assert mapped.index is not None and mapped.index.base is not None  # the flat index searches the mapped faces
        assert state(mapped) == state(built) == state(alone)
        for seed in (1000, 1001, 1050):
            assert found(mapped, seed) == found(alone, seed)
    finally:
        for store in (built, mapped, alone):
            store.close()


def test_the_builder_reads_each_file_it_saved_once_for_its_sha256(tmp_path, monkeypatch):
    """The builder hashes each file as it saves it and maps it without reading it again (a guard's
    files are about 1 GiB at 1M faces); a process that maps the snapshot it did not write checks them."""
    first = SqliteGallery.open(tmp_path, KEY)
    fill(first)
    first.close()
    hashed: list[str] = []
    sha256_file = snapshot.sha256_file
    monkeypatch.setattr(snapshot, "sha256_file", lambda path: hashed.append(path.name) or sha256_file(path))
    built = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    try:
        assert hashed and len(hashed) == len(set(hashed))  # each saved file once
        hashed.clear()
        mapped = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
        mapped.close()
        assert hashed and len(hashed) == len(set(hashed))  # the other process checks each once
    finally:
        built.close()


def test_the_builder_serves_the_mapped_copy_and_frees_its_own(tmp_path, monkeypatch):
    """The process that built the snapshot serves from the mapped files, as the others do: the guard
    it built and the faces it read are freed before the heap is given back (`release_freed`), not
    kept beside the mapping (docs/benchmarks.md, "A worker's memory")."""
    first = SqliteGallery.open(tmp_path, KEY)
    fill(first)
    first.close()
    made: list[weakref.ref] = []
    alive_at_release: list[list[bool]] = []

    def building(ids, *args, **kwargs):
        guard = open_set.follow(ids, *args, **kwargs)
        made.append(weakref.ref(guard))
        made.append(weakref.ref(ids))
        return guard

    monkeypatch.setattr(sqlite, "follow", building)
    monkeypatch.setattr(snapshot, "release_freed", lambda: alive_at_release.append([ref() is not None for ref in made]))
    built = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    try:
        assert alive_at_release == [[False, False]]  # one build; its guard and ids gone when the heap is given back
        guard = built.leave_one_out()
        assert guard is not None and isinstance(guard._top, np.memmap)
    finally:
        built.close()


def test_a_sampled_guard_is_mapped_with_its_share(tmp_path, builds, monkeypatch):
    """A guard that lists a sample of the faces (its sizes lowered here) is mapped listing the same
    sample: the share is saved with it, so a face added later joins the sample in every process alike."""
    monkeypatch.setattr(open_set, "SAMPLE_FROM", 100)
    monkeypatch.setattr(open_set, "LISTED", 40)
    first = SqliteGallery.open(tmp_path, KEY)
    fill(first)  # 240 faces: a quarter of them listed
    first.close()
    built = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    mapped = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    try:
        assert len(builds) == 2  # first, built: `mapped` built nothing
        guards = [store.leave_one_out() for store in (built, mapped)]
        assert [g.share for g in guards if g is not None] == [1 / 4, 1 / 4]
        assert state(mapped) == state(built)
        built.create_subject("new", {}, "new")
        built.add_faces("new", [NewFace(unit(7 + i)) for i in range(8)])  # `mapped` applies them from the log
        listed = [{face for face, *_ in store.leave_one_out().nearest_others()} for store in (built, mapped)]  # type: ignore[union-attr]
        assert listed[0] == listed[1] and 40 <= len(listed[0]) < 120
    finally:
        for store in (built, mapped):
            store.close()


def test_a_mapped_state_follows_the_log_like_a_built_one(tmp_path, builds):
    """A snapshot older than the store (the log reaches it) is mapped and followed from its change;
    adds, removes and a merge land in the mapped arrays' private copies, not in the file."""
    filler = SqliteGallery.open(tmp_path, KEY)
    fill(filler)
    filler.close()
    writer = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))  # saves the snapshot, as of `saved`
    saved = writer.applied
    writer.create_subject("new", {}, "new")
    writer.add_faces("new", [NewFace(unit(7))])
    writer.delete_subject("s3")
    writer.merge_subjects("s4", "s5")
    later = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    alone = SqliteGallery.open(tmp_path, KEY)
    try:
        assert len(builds) == 3  # filler, writer and alone
        assert later.applied == alone.applied > saved  # opened: the log since its snapshot applied
        assert state(later) == state(writer)  # the same changes on the same state: the same to the last bit
        assert_decides_as(later, state(alone))  # built from scratch: the products in another order (float32 rounding)
        assert found(later, 7)[0] == "new" and "s3" not in found(later, 1003)
        assert later.index is not None and later.index.size == alone.index.size  # type: ignore[union-attr]
    finally:
        for store in (writer, later, alone):
            store.close()
    reopened = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))  # the file was never written through a mapping
    try:
        assert len(builds) == 3
        assert found(reopened, 7)[0] == "new"
    finally:
        reopened.close()


def test_a_damaged_or_foreign_snapshot_is_built_again(tmp_path, builds):
    store = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    fill(store, 20)
    store.close()
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path)).close()  # saved by the first, mapped here
    assert len(builds) == 1
    top = next((tmp_path / "index").glob("*.top.npy"))
    data = bytearray(top.read_bytes())
    data[-5] ^= 0xFF  # one byte of the arrays, not of the header: np.load alone would take it
    top.write_bytes(bytes(data))
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path)).close()
    assert len(builds) == 2  # the sha256 did not match
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path), guard=False).close()
    assert len(builds) == 3  # a guard's snapshot is not a roster's
    db = sqlite.connect(tmp_path / sqlite.DATABASE)  # as if another database: its change there differs
    db.execute("UPDATE changes SET face_ids = '[]' WHERE seq = (SELECT MAX(seq) FROM changes)")
    db.close()
    write_one(tmp_path, 3)  # built by a store of its own (no folder)
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path)).close()
    assert len(builds) == 5  # the snapshot's change is not the log's
    write_one(tmp_path, 4)
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path, "HNSW16")).close()
    assert len(builds) == 6  # mapped, the log since applied to the guard: with an index that is not flat too
    db = sqlite.connect(tmp_path / sqlite.DATABASE)  # a face changed outside the log (as `gallery reembed` does)
    db.execute("UPDATE faces SET model_sha256 = 'other' WHERE id = (SELECT MIN(id) FROM faces)")
    db.close()
    write_one(tmp_path, 5)
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path)).close()
    assert len(builds) == 8  # the snapshot and the log since are not the store


def test_a_snapshot_is_mapped_by_its_own_collection_only(tmp_path, builds):
    """Each collection's snapshot lives in its own folder (`collections/<name>/`, below default's);
    found in another's folder (a case-insensitive disk), it is not mapped, even where the two look
    alike (both empty, the same change)."""
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path)).close()
    assert len(builds) == 1
    SqliteGallery.open(tmp_path, KEY, index=config(tmp_path), collection="home").close()  # default's folder
    assert len(builds) == 2
    nested = IndexConfig("Flat", "", tmp_path / "index" / "collections" / "home")
    for _ in range(2):
        SqliteGallery.open(tmp_path, KEY, index=nested, collection="home").close()
        SqliteGallery.open(tmp_path, KEY, index=config(tmp_path)).close()
    assert len(builds) == 4  # home's built once in its folder, default's again (home overwrote it): each then mapped


def write_one(data: Path, seed: int) -> None:
    store = SqliteGallery.open(data, KEY)
    store.create_subject(f"w{seed}", {}, f"w{seed}")
    store.add_faces(f"w{seed}", [NewFace(unit(seed))])
    store.close()


def opened(data: str) -> tuple[int, bool]:
    """In a process of its own: the builds it ran while its gallery opened, and whether its guard is mapped."""
    builds: list[int] = []
    build = sqlite.follow

    def counting(ids, *args, **kwargs):
        builds.append(len(ids))
        return build(ids, *args, **kwargs)

    sqlite.follow = counting
    store = SqliteGallery.open(Path(data), KEY, index=config(Path(data)), background=True)
    try:
        assert store.wait_loaded(60)
        guard = store.leave_one_out()
        return len(builds), guard is not None and isinstance(guard._vectors, np.memmap)
    finally:
        store.close()


def test_workers_starting_at_once_build_once(tmp_path):
    """What `facegate serve --workers N` does at start-up: processes open the gallery at once; one
    builds under the snapshot's lock, the other waits and maps what it saved."""
    store = SqliteGallery.open(tmp_path, KEY)
    fill(store, 30)
    store.close()
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.map(opened, [str(tmp_path)] * 2)
    assert sorted(n for n, _ in results) == [0, 1]
    assert all(mapped for _, mapped in results)


@pytest.mark.parametrize("spec", ["Flat", "HNSW16", "IVF2,Flat"])
def test_a_grown_delta_is_shared_and_mapped_anew(tmp_path, monkeypatch, spec):
    """After REMAP changes (and 1/8 of the faces) applied to its mapped snapshot, a process saves its
    state as the host's snapshot and maps it; another process, past REMAP too, maps that one. With
    an HNSW or IVF index too, which keeps its own file: the guard's copied pages do not grow until restart."""
    monkeypatch.setattr(follower, "REMAP", 3)
    filler = SqliteGallery.open(tmp_path, KEY)
    fill(filler, 20)
    filler.close()
    first = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path, spec))
    second = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path, spec))
    try:
        assert first.follower is not None and second.follower is not None
        mapped = first.follower.state.mapped  # type: ignore[union-attr]
        assert mapped == second.follower.state.mapped == first.applied  # type: ignore[union-attr]
        for i in range(8):  # past REMAP and 1/8 of the faces
            first.create_subject(f"n{i}", {}, f"n{i}")
            first.add_faces(f"n{i}", [NewFace(unit(500 + i))])
        for store in (first, second):  # shared once one is past REMAP (perhaps before the last write: a loaded machine), then followed
            wait_until(lambda s=store: s.follower.state.mapped > mapped, "the state shared and mapped anew")  # type: ignore[union-attr]
        wait_until(lambda: second.follower.applied == first.applied, "the second process at the last change")  # type: ignore[union-attr]
        assert len({p.name.split(".")[1] for p in (tmp_path / "index").glob("*.ids.npy")}) == 1  # the older files removed
        guard = second.leave_one_out()
        assert guard is not None and isinstance(guard._vectors, np.memmap)
        assert state(second) == state(first) and found(second, 507)[0] == "n7"
        alone = SqliteGallery.open(tmp_path, KEY)  # built from the store: what the guard mapped anew and followed answers
        assert state(alone)[:3] == state(second)[:3] and state(alone)[3] == pytest.approx(state(second)[3], abs=1e-6)
        alone.close()
    finally:
        first.close()
        second.close()


def test_a_guard_mapped_anew_beside_an_hnsw_index_takes_the_log_since_its_change(tmp_path, monkeypatch):
    """With an HNSW index, the guard alone is mapped anew: the host's snapshot of an earlier change,
    the log since applied to it (here in batches of 2, off the lock, then the tail under it), swapped
    in beside the index it had; then it is the guard a build from the store makes."""
    monkeypatch.setattr(follower, "BATCH", 2)
    filler = SqliteGallery.open(tmp_path, KEY)
    fill(filler, 20)
    filler.close()
    store = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path, "HNSW16"))
    try:
        assert store.follower is not None and store.follower.state is not None
        index, mapped = store.index, store.follower.state.mapped
        for i in range(5):
            store.create_subject(f"n{i}", {}, f"n{i}")
            store.add_faces(f"n{i}", [NewFace(unit(500 + i))])
        store.delete_subject("s3")
        assert store.follower._swap_roster(store.follower.log.shared_roster(-1))  # the snapshot saved at start
        assert store.follower.state.mapped == mapped and store.index is index  # type: ignore[union-attr]
        alone = SqliteGallery.open(tmp_path, KEY)
        assert state(alone)[:3] == state(store)[:3] and state(alone)[3] == pytest.approx(state(store)[3], abs=1e-6)
        alone.close()
    finally:
        store.close()


APPROXIMATE = {"HNSW16": "efSearch=256", "IVF1,Flat": "nprobe=1"}  # searched exhaustively at 60 faces: a flat index's answers


def change_and_die(data: str, spec: str) -> None:
    """A worker on an HNSW or IVF index that maps the guard's snapshot of the store as it was,
    deletes, merges and adds (three changes, under REMAP: the guard is not shared again), its index
    saved past its bound (nine faces) as of the last, and is killed there: no shutdown's save."""
    follower.REMAP = 4
    store = SqliteGallery.open(Path(data), KEY, index=IndexConfig(spec, APPROXIMATE[spec], Path(data) / "index"))
    first = mapped_file(store)
    store.delete_subject("s3")
    store.merge_subjects("s4", "s5")
    store.create_subject("new", {}, "new")
    store.add_faces("new", [NewFace(unit(200 + i)) for i in range(8)])
    wait_until(lambda: mapped_file(store) not in (None, first), "the index saved past its bound and mapped")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("spec", APPROXIMATE)
def test_after_a_kill_an_earlier_guard_and_the_log_since_start_an_approximate_index(tmp_path, builds, spec):
    """After a kill -9 the next start maps the HNSW or IVF file saved as of the last change and the
    guard's snapshot of an earlier one, the log since applied to the guard: not rebuilt (O(N²)),
    and deciding as a guard built from the store does."""
    sixty_subjects(tmp_path)  # the guard's snapshot saved, as of its 60th change
    assert len(builds) == 1
    worker = multiprocessing.get_context("spawn").Process(target=change_and_die, args=(str(tmp_path), spec))
    worker.start()
    worker.join(120)
    assert worker.exitcode == -signal.SIGKILL
    index = tmp_path / "index"
    saved = sorted(p.name for p in index.glob("*.faiss"))
    again = SqliteGallery.open(tmp_path, KEY, index=IndexConfig(spec, APPROXIMATE[spec], index))
    alone = SqliteGallery.open(tmp_path, KEY)
    try:
        assert len(builds) == 2  # alone's: `again` mapped its guard
        assert again.follower is not None and again.follower.state is not None and again.follower.state.mapped == 60
        assert sorted(p.name for p in index.glob("*.faiss")) == saved and mapped_file(again) == (index / saved[0]).stat().st_ino
        assert again.applied == alone.applied == 63
        assert_decides_as(again, state(alone))
        assert_found_as_flat(tmp_path, [again], [3, 4, 5, 103, 104, 105, 119, *range(200, 208)])
    finally:
        again.close()
        alone.close()


def test_searches_go_on_while_a_grown_state_is_copied_to_be_shared(tmp_path, monkeypatch):
    """The copy a re-share saves (`Follower._reshare`) is taken under the follower's lock, so no change
    lands in it half-way, but not under the guard's, and a search does not wait for the follower's
    lock meanwhile: it answers from the state as it is while the copy is held here."""
    filler = SqliteGallery.open(tmp_path, KEY)
    fill(filler, 20)
    filler.close()
    store = SqliteGallery.open(tmp_path, KEY, index=config(tmp_path))
    copying, release = threading.Event(), threading.Event()
    arrays = LeaveOneOut._arrays

    def held(self, capacity):
        if threading.current_thread().name == "resharing" and not copying.is_set():
            copying.set()
            release.wait(30)
        return arrays(self, capacity)

    monkeypatch.setattr(LeaveOneOut, "_arrays", held)
    assert store.follower is not None and store.follower.state is not None
    resharing = threading.Thread(target=store.follower._reshare, args=(store.follower.state,), name="resharing")
    answers: list[tuple] = []
    searching = threading.Thread(target=lambda: answers.append((found(store, 1005), store.shape().faces)))
    try:
        resharing.start()
        assert copying.wait(30)
        searching.start()
        searching.join(10)
        assert not searching.is_alive() and answers == [(found(store, 1005), 39)]  # answered while the copy is held
    finally:
        release.set()
        resharing.join(30)
        searching.join(30)
    assert not resharing.is_alive()
    store.close()


@pytest.mark.parametrize("guard", [True, False])
def test_a_mapped_state_makes_no_python_object_per_face(tmp_path, guard):
    """A worker that maps the host's snapshot finds a face's row (or subject) by its id and a subject
    by its name in the mapped arrays: restoring 20,000 faces of as many subjects takes 51 KiB of its
    own here (a byte a face: the guard's sample flags), where the id → row dict, the subject → code
    dict and the list of names it held took 4.6 MiB (docs/benchmarks.md, "Round 6"). Faces come and
    go after as before."""
    n = 20_000
    rng = np.random.default_rng(5)
    ids = rng.choice(10 * n, n, replace=False)
    subjects = [f"subject {i:05d} é" for i in range(n)]
    vectors = rng.standard_normal((n, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    files = snapshot.SnapshotFiles(tmp_path, "state")
    made = LeaveOneOut.build(ids, subjects, vectors, share=0.0) if guard else open_set.Roster.of(ids, subjects)
    files.save(made, {"applied": 1}, (ids, subjects, vectors))
    tracemalloc.start()
    try:
        mapped = files.load(guard, 8, lambda meta: True)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert mapped is not None and held < 8 * n  # bytes
    roster = mapped.roster
    roster.remove(ids[:2])
    roster.add(np.array([ids[0], ids[2], 10 * n]), [subjects[0], subjects[2], "new"], vectors[:3])  # ids[2]: held already
    assert roster.shape() == open_set.GalleryShape(n, n)
    assert sorted(roster.ids().tolist()) == sorted([*ids[2:], ids[0], 10 * n])


def save_change_and_die(data: str, spec: str) -> None:
    """A worker that builds and saves the HNSW or IVF index as of the store's 60th change, then
    deletes, merges and adds (under the remap bound: nothing saved again) and is killed: no shutdown's save."""
    store = SqliteGallery.open(Path(data), KEY, index=IndexConfig(spec, APPROXIMATE[spec], Path(data) / "index"))
    wait_until(lambda: mapped_file(store) is not None, "the index built, saved and mapped")
    store.delete_subject("s3")
    store.merge_subjects("s4", "s5")
    store.create_subject("new", {}, "new")
    store.add_faces("new", [NewFace(unit(200 + i)) for i in range(5)])
    os.kill(os.getpid(), signal.SIGKILL)


def killed_after_save(data: Path, spec: str) -> dict[str, int]:
    """The index folder's files (name: inode) after `save_change_and_die` on the sixty subjects."""
    sixty_subjects(data)
    worker = multiprocessing.get_context("spawn").Process(target=save_change_and_die, args=(str(data), spec))
    worker.start()
    worker.join(120)
    assert worker.exitcode == -signal.SIGKILL
    return {p.name: p.stat().st_ino for p in (data / "index").glob("*.faiss")}


@pytest.mark.parametrize("spec", APPROXIMATE)
def test_after_a_kill_an_index_file_of_an_earlier_change_is_mapped_and_the_log_since_applied(tmp_path, spec):
    """Issue 44: after a kill -9 that lost the changes since the index file's save, the next start maps
    that file (stamped as of its change, which the log still reaches) and applies the log since to it,
    the adds to its flat part, as PostgreSQL does: not rebuilt from every face, and answering as a
    flat index of the store."""
    saved = killed_after_save(tmp_path, spec)
    index = tmp_path / "index"
    again = SqliteGallery.open(tmp_path, KEY, index=IndexConfig(spec, APPROXIMATE[spec], index))
    try:
        assert {p.name: p.stat().st_ino for p in index.glob("*.faiss")} == saved and len(saved) == 1  # not built and saved again
        assert mapped_file(again) == next(iter(saved.values()))
        assert again.applied == 63 and again.index.since_mapped == 6 and again.index.size == 64  # type: ignore[union-attr]  # 5 added, 1 removed
        assert_found_as_flat(tmp_path, [again], [3, 4, 5, 103, 104, 105, 119, *range(200, 205)])
    finally:
        again.close()


def test_an_index_file_the_log_since_does_not_bring_to_the_store_is_built_again(tmp_path):
    """A face written outside the log (as `facegate gallery reembed` writes) after the kill: the file
    and the log since miss it, so the start builds the index from the faces, and finds it."""
    saved = killed_after_save(tmp_path, "HNSW16")
    db = sqlite3.connect(tmp_path / sqlite.DATABASE)
    with db:
        db.execute(
            "INSERT INTO faces (collection, subject_id, embedding, model_name, model_sha256, created) "
            "VALUES ('default', 's10', ?, ?, ?, 0)",
            (sqlite.embedding_blob(unit(300)), KEY.name, KEY.sha256),
        )
    db.close()
    again = SqliteGallery.open(tmp_path, KEY, index=IndexConfig("HNSW16", APPROXIMATE["HNSW16"], tmp_path / "index"))
    try:
        assert mapped_file(again) not in (None, *saved.values()) and again.index.size == 65  # type: ignore[union-attr]
        assert_found_as_flat(tmp_path, [again], [3, 103, 300, *range(200, 205)])
    finally:
        again.close()
