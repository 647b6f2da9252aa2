"""PostgreSQL replicas on one host share the gallery's derived state as SQLite's workers do
(service/gallery/snapshot.py, sync.py): the first builds the guard under the snapshot's lock and
saves it, keyed by the database's identity, the collection, the embedder and the change it is as
of; the others map it and follow the log from that change. Against a real server (tests/postgres.py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest

from service.gallery import follower, postgres
from service.gallery.index import IndexConfig, MappedIndex
from service.gallery.interface import NewFace
from service.gallery.postgres import PostgresGallery
from tests.polling import wait_until
from tests.service.gallery.test_snapshot import assert_decides_as, config, count_builds, fill, state
from tests.service.gallery.test_sqlite_processes import KEY, found, mapped_file, unit


@pytest.fixture
def builds(monkeypatch) -> list[int]:
    return count_builds(monkeypatch, postgres)


@pytest.fixture
def opened(database_url):
    stores: list[PostgresGallery] = []

    def open_(index: IndexConfig | None = None, url: str = database_url, **kwargs) -> PostgresGallery:
        store = PostgresGallery(url, KEY, pool_size=2, index=index, **kwargs)
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.close()


def mapped(store: PostgresGallery) -> bool:
    guard = store.leave_one_out()
    return guard is not None and isinstance(guard._vectors, np.memmap)


def test_the_second_replica_maps_what_the_first_built(opened, tmp_path, builds):
    fill(opened())  # no folder: built here alone
    built, maps, alone = opened(config(tmp_path)), opened(config(tmp_path)), opened()
    assert len(builds) == 3  # the filler, `built` and `alone`: `maps` built nothing
    assert mapped(maps) and maps.index is not None and maps.index.base is not None  # type: ignore[attr-defined]
    assert state(maps) == state(built) == state(alone)
    for seed in (1000, 1001, 1050):
        assert found(maps, seed) == found(alone, seed)  # type: ignore[arg-type]


def test_a_snapshot_of_an_earlier_change_is_followed_from_it(opened, tmp_path, builds):
    """A replica starting after writes maps the snapshot of an earlier change and applies the log
    since: the guard of the replica that wrote them (float32 rounding apart: replicas apply changes
    in batches of their own, the tail's fit too); its own writes read back at once."""
    writer = opened(config(tmp_path))
    assert len(builds) == 1  # the empty gallery, saved as of change 0
    fill(writer, 40)
    writer.create_subject("new", {}, "new")
    writer.add_faces("new", [NewFace(unit(7))])
    writer.delete_subject("s3")
    writer.merge_subjects("s4", "s5")
    later = opened(config(tmp_path))
    assert len(builds) == 1 and mapped(later)  # mapped as of change 0, then followed
    assert later.applied == writer.applied
    assert_decides_as(later, state(writer))
    assert found(later, 7)[0] == "new" and "s3" not in found(later, 1003)  # type: ignore[arg-type]
    later.create_subject("own", {}, "own")
    later.add_faces("own", [NewFace(unit(8))])
    assert found(later, 8)[0] == "own"  # type: ignore[arg-type]  # read-your-writes on a mapped state


def test_another_database_or_collection_never_maps_it(opened, postgres_server, tmp_path, builds):
    """One index folder for two databases (or two collections in one folder): each builds its own
    state (the database's identity names the files, the stamp the collection); a snapshot whose
    change the log does not hold (a database restored from an older backup) is built again."""
    first = opened(config(tmp_path))
    fill(first, 10)
    other = postgres_server.create_database("t_other_" + tmp_path.name[-8:].replace("-", "_").lower())
    opened(config(tmp_path), url=other)
    assert len(builds) == 2
    opened(config(tmp_path), collection="home")
    assert len(builds) == 3  # another collection's, although found in this folder
    first.close()  # saved as of its last change: the next start maps it
    opened(config(tmp_path)).close()
    assert len(builds) == 3
    with psycopg.connect(first.url) as conn:  # as if restored from another backup: the snapshot's change is not the log's
        conn.execute("UPDATE changes SET face_ids = '{}' WHERE seq = (SELECT MAX(seq) FROM changes)")
    opened(config(tmp_path))
    assert len(builds) == 4


def opened_in_process(url: str, folder: str) -> tuple[int, bool]:
    """In a process of its own: the builds it ran while its gallery opened, and whether its guard is mapped."""
    builds: list[int] = []
    build = postgres.follow

    def counting(ids, *args, **kwargs):
        builds.append(len(ids))
        return build(ids, *args, **kwargs)

    postgres.follow = counting  # type: ignore[assignment]
    store = PostgresGallery(url, KEY, pool_size=2, index=config(Path(folder)), background=True)
    try:
        assert store.wait_loaded(60)
        return len(builds), mapped(store)
    finally:
        store.close()


def test_workers_starting_at_once_build_once(opened, database_url, tmp_path):
    """What `facegate serve --workers N` on PostgreSQL does at start-up: one builds under the
    snapshot's lock, the other waits and maps what it saved (without it, each builds its own)."""
    fill(opened(), 30)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        results = pool.starmap(opened_in_process, [(database_url, str(tmp_path))] * 2)
    assert sorted(n for n, _ in results) == [0, 1]
    assert all(is_mapped for _, is_mapped in results)


@pytest.mark.parametrize("spec", ["Flat", "HNSW16"])
def test_a_grown_delta_is_shared_and_mapped_anew(opened, tmp_path, monkeypatch, spec):
    """After REMAP changes (and 1/8 of the faces) applied to its mapped snapshot, a replica saves its
    state as the host's snapshot and maps it; another replica, past REMAP too, maps that one (an
    HNSW index keeps its own file: the guard alone is mapped anew)."""
    monkeypatch.setattr(follower, "REMAP", 3)
    fill(opened(), 20)
    first, second = opened(config(tmp_path, spec)), opened(config(tmp_path, spec))
    assert first.follower is not None and second.follower is not None
    before = first.follower.state.mapped  # type: ignore[union-attr]
    assert before == second.follower.state.mapped == first.applied  # type: ignore[union-attr]
    for i in range(8):  # past REMAP and 1/8 of the faces
        first.create_subject(f"n{i}", {}, f"n{i}")
        first.add_faces(f"n{i}", [NewFace(unit(500 + i))])
    for store in (first, second):  # each change is notified: shared as soon as one replica is past REMAP, then followed
        wait_until(lambda s=store: s.follower.state.mapped > before, "the state shared and mapped anew")  # type: ignore[union-attr]
    wait_until(lambda: second.applied == first.applied, "the second replica at the last change")
    assert len({p.name.split(".")[1] for p in (tmp_path / "index").glob("*.ids.npy")}) == 1  # the older files removed
    assert mapped(second) and found(second, 507)[0] == "n7"  # type: ignore[arg-type]
    assert state(second)[:3] == state(first)[:3] and state(second)[3] == pytest.approx(state(first)[3], abs=1e-6)


def test_replicas_past_the_bound_map_one_hnsw_file_saved_once(opened, tmp_path, monkeypatch):
    """PostgreSQL's replicas share an HNSW index as SQLite's workers do: both map the file the
    first saved; past the bound one saves its state and the other maps that file and applies the
    log since (its follower's), both then answering as a flat index of the database does."""
    monkeypatch.setattr(follower, "REMAP", 4)
    fill(opened())
    hnsw = config(tmp_path, "HNSW16")
    a, b, exact = opened(hnsw), opened(hnsw), opened(IndexConfig("Flat", "", None))

    def file_of(store: PostgresGallery) -> int | None:
        base = getattr(store.index, "base", None)
        return os.fstat(base._fd).st_ino if isinstance(base, MappedIndex) else None

    first = file_of(a)
    assert first is not None and file_of(b) == first
    a.create_subject("new", {}, "new")
    a.add_faces("new", [NewFace(unit(3000 + i)) for i in range(40)])  # past 1/8 of the 240 faces
    b.delete_subject("s3")
    wait_until(lambda: file_of(a) == file_of(b) != first, "both replicas map the file saved past the bound")
    wait_until(lambda: a.index.size == b.index.size == exact.index.size, "both replicas applied every change")  # type: ignore[union-attr]
    for seed in (3000, 3039, 1003, 1050):
        assert found(a, seed) == found(b, seed) == found(exact, seed)  # type: ignore[arg-type]


def killed(replica: Callable[[str, str], None], database_url: str, folder: Path) -> None:
    """Run `replica` in a process of its own, which ends killed by SIGKILL (no shutdown's save)."""
    process = multiprocessing.get_context("spawn").Process(target=replica, args=(database_url, str(folder)))
    process.start()
    process.join(120)
    assert process.exitcode == -signal.SIGKILL


def remap_and_die(url: str, folder: str) -> None:
    """A replica that adds past the bound, saves and maps its state as the host's file, and is killed
    there: no shutdown's save."""
    follower.REMAP = 4
    store = PostgresGallery(url, KEY, pool_size=2, index=config(Path(folder), "HNSW16"))
    first = mapped_file(store)  # type: ignore[arg-type]
    store.create_subject("new", {}, "new")
    store.add_faces("new", [NewFace(unit(3000 + i)) for i in range(40)])  # past 1/8 of the 240 faces
    wait_until(lambda: mapped_file(store) not in (None, first), "the state saved past the bound and mapped")  # type: ignore[arg-type]
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_file_saved_past_the_bound_starts_the_next_replica_after_a_kill(opened, tmp_path, database_url):
    """The file a replica saves past the bound is stamped with its change's digest, as a shutdown's
    save is: after a kill -9 the next start maps it rather than building the index from the database."""
    fill(opened())
    killed(remap_and_die, database_url, tmp_path)
    saved = sorted(p.name for p in (tmp_path / "index").glob("*.faiss"))
    again, exact = opened(config(tmp_path, "HNSW16")), opened(IndexConfig("Flat", "", None))
    assert sorted(p.name for p in (tmp_path / "index").glob("*.faiss")) == saved and len(saved) == 1  # mapped, not built and saved
    assert mapped_file(again) == (tmp_path / "index" / saved[0]).stat().st_ino  # type: ignore[arg-type]
    assert again.index.size == exact.index.size and again.index.since_mapped == 0  # type: ignore[union-attr]
    for seed in (3000, 3039, 1003, 1050):
        assert found(again, seed) == found(exact, seed)  # type: ignore[arg-type]


def change_and_die(url: str, folder: str) -> None:
    """A replica on an HNSW index that maps the guard's snapshot, deletes, merges and adds (three
    changes, under REMAP: the guard is not shared again), its index saved past its bound as of the
    last, and is killed there: no shutdown's save."""
    follower.REMAP = 4
    store = PostgresGallery(url, KEY, pool_size=2, index=config(Path(folder), "HNSW16"))
    first = mapped_file(store)  # type: ignore[arg-type]
    store.delete_subject("s3")
    store.merge_subjects("s4", "s5")
    store.create_subject("new", {}, "new")
    store.add_faces("new", [NewFace(unit(3000 + i)) for i in range(40)])  # past 1/8 of the 240 faces
    wait_until(lambda: mapped_file(store) not in (None, first), "the index saved past its bound and mapped")  # type: ignore[arg-type]
    os.kill(os.getpid(), signal.SIGKILL)


def test_after_a_kill_an_earlier_guard_and_the_log_since_start_an_hnsw_index(opened, tmp_path, database_url, builds):
    """After a kill -9 the next start maps the HNSW file saved as of the last change and the guard's
    snapshot of an earlier one, the log since applied to the guard: not rebuilt, and deciding as a
    guard built from the database does."""
    fill(opened())
    saved_at = opened(config(tmp_path)).applied  # the guard's snapshot, saved as of this change
    assert len(builds) == 2
    killed(change_and_die, database_url, tmp_path)
    saved = sorted(p.name for p in (tmp_path / "index").glob("*.faiss"))
    again, exact = opened(config(tmp_path, "HNSW16")), opened(IndexConfig("Flat", "", None))
    assert len(builds) == 3 and mapped(again)  # exact's: `again` mapped its guard
    assert again.follower is not None and again.follower.state is not None and again.follower.state.mapped == saved_at
    assert sorted(p.name for p in (tmp_path / "index").glob("*.faiss")) == saved and len(saved) == 1
    assert mapped_file(again) == (tmp_path / "index" / saved[0]).stat().st_ino  # type: ignore[arg-type]
    assert again.applied == exact.applied > saved_at
    assert_decides_as(again, state(exact))
    for seed in (3000, 3039, 1003, 1004, 1005, 1050):
        assert found(again, seed) == found(exact, seed)  # type: ignore[arg-type]
