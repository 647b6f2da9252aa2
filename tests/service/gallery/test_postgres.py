"""The PostgreSQL gallery (FACEGATE_DATABASE_URL) against a real server started by the tests
(tests/postgres.py): the store's behaviour matches SQLite's, and several stores on one database
(replicas, here in one process) stay in step: a change applied on one reaches the others by
sequence, after missed notifications, a lost connection or a restart. Synthetic embeddings."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import psycopg
import pytest

from service.core.alignment import template_chip
from service.core.errors import FaceNotFound, SubjectExists, SubjectNotFound
from service.core.fileio import write_atomically
from service.core.models.manifest import EmbedderKey
from service.gallery.index import IndexConfig, read_meta
from service.gallery.interface import NewFace
from service.gallery.pg_connections import LISTENER_NAME
from service.gallery.postgres import PostgresGallery, migrations
from tests.requirements import importorskip

KEY = EmbedderKey("model-a", "a" * 64, 8)
OTHER = EmbedderKey("model-b", "b" * 64, 8)
WAIT = 10.0  # bound on every wait for propagation (it takes milliseconds)


def unit(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return x / np.linalg.norm(x)


@pytest.fixture
def open_store(database_url):
    stores = []

    def open_(key=KEY, searchable=True, index=None, guard=True) -> PostgresGallery:
        store = PostgresGallery(database_url, key, searchable, pool_size=4, index=index, guard=guard)
        stores.append(store)
        return store

    yield open_
    for store in stores:
        store.close()


def index_ids(store: PostgresGallery) -> set[int]:
    _, ids = store.index.search(np.zeros((1, store.index.dim), np.float32), store.index.size)
    return {int(i) for i in ids[0] if i >= 0}


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
        time.sleep(0.005)


def database_face_ids(url: str, key=KEY) -> set[int]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM faces WHERE model_sha256 = %s", (key.sha256,))}


@pytest.mark.parametrize("backend", ["faiss", "milvus"])
def test_subject_crud_search_and_deletes(open_store, backend, tmp_path):
    if backend == "milvus":
        importorskip("milvus_lite")
    g = open_store(index=IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="FLAT") if backend == "milvus" else None)
    for i in range(5):
        g.create_subject(f"person {i}", {"i": i, "nested": {"z": 1, "a": 2}}, f"s{i}")
    with pytest.raises(SubjectExists):
        g.create_subject("dup", {}, "s0")
    page, total = g.list_subjects(limit=2, offset=2)
    assert total == 5 and [s.id for s in page] == ["s2", "s3"]
    assert list(g.get_subject("s0").metadata["nested"]) == ["z", "a"]  # metadata round-trips as given
    assert g.update_subject("s1", None, {"k": "v"}).metadata == {"k": "v"}
    near = unit(0) + 0.05 * unit(1)
    (a1, _) = g.add_faces("s0", [NewFace(near / np.linalg.norm(near), box=[1, 2, 3, 4], score=0.9), NewFace(unit(2))])
    g.add_faces("s1", [NewFace(unit(3)), NewFace(unit(4))])
    ranked = g.search(unit(0), top_k=5)
    assert [c.subject_id for c in ranked] == ["s0", "s1"] and ranked[0].similarity > 0.99 and ranked[0].face_id == a1.id
    assert [f.box for f in g.list_faces("s0")] == [[1, 2, 3, 4], None]
    assert g.subject_embeddings("s0").shape == (2, 8)
    g.delete_face(a1.id)
    with pytest.raises(FaceNotFound):
        g.delete_face(a1.id)
    assert g.delete_subject("s1") == 2
    with pytest.raises(SubjectNotFound):
        g.delete_subject("s1")
    with pytest.raises(SubjectNotFound):
        g.add_faces("s1", [NewFace(unit(5))])
    assert [c.subject_id for c in g.search(unit(0), 5)] == ["s0"] and g.index.size == 1
    assert g.counts() == {"subjects": 4, "faces": 1, "searchable_faces": 1, "incompatible_faces": 0}


def test_migrations_apply_once_when_replicas_start_together(database_url):
    """Four stores opening one empty database at once: the advisory lock lets one migrate, the rest find it done."""
    opened, errors = [], []

    def start() -> None:
        try:
            opened.append(PostgresGallery(database_url, KEY, pool_size=2))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == [] and len(opened) == 4
        with psycopg.connect(database_url) as conn:
            rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
        assert [r[0] for r in rows] == [v for v, _, _ in migrations()]
    finally:
        for store in opened:
            store.close()


def test_a_newer_schema_is_refused(open_store, database_url):
    open_store().close()
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_future')")
    with pytest.raises(RuntimeError, match="upgrade facegate"):
        PostgresGallery(database_url, KEY)


def test_a_change_on_one_replica_reaches_the_other(open_store):
    a, b = open_store(), open_store()
    a.create_subject("A", {}, "a")
    (face,) = a.add_faces("a", [NewFace(unit(0))])
    assert a.search(unit(0), 1)[0].subject_id == "a"  # the writer applied it before returning
    wait_for(lambda: b.search(unit(0), 1) != [], "the enrollment reaches b")
    assert b.search(unit(0), 1)[0].face_id == face.id
    a.delete_face(face.id)
    wait_for(lambda: b.index.size == 0, "the delete reaches b's index")
    status = b.replication()
    assert status["applied_sequence"] == status["database_sequence"] == 2 and status["lag"] == 0 and status["listening"]


def test_a_merge_on_one_replica_reaches_the_other(open_store):
    """The faces change subject in one transaction; the other replica's index and roster follow."""
    a, b = open_store(), open_store()
    a.create_subject("A", {}, "a")
    a.create_subject("A again", {}, "a2")
    a.add_faces("a", [NewFace(unit(0))])
    (moved,) = a.add_faces("a2", [NewFace(unit(1))])
    wait_for(lambda: b.shape().subjects == 2, "the enrollments reach b")
    with pytest.raises(SubjectNotFound):
        a.merge_subjects("a2", "ghost")
    assert a.merge_subjects("a2", "a") == 1
    assert a.search(unit(1), 1)[0].subject_id == "a" and a.shape().subjects == 1
    wait_for(lambda: b.shape().subjects == 1, "the merge reaches b's roster")
    assert b.search(unit(1), 1)[0].face_id == moved.id and b.index.size == 2
    with pytest.raises(SubjectNotFound):
        b.get_subject("a2")


def test_a_merge_keeps_the_shared_index_vectors(open_store, tmp_path):
    """With Milvus the moved faces keep their vectors (their ids do not change); search answers the kept subject."""
    importorskip("milvus_lite")
    g = open_store(index=IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="FLAT"))
    g.create_subject("A", {}, "a")
    g.create_subject("A again", {}, "a2")
    g.add_faces("a", [NewFace(unit(0))])
    g.add_faces("a2", [NewFace(unit(1))])
    assert g.merge_subjects("a2", "a") == 1
    assert g.search(unit(1), 1)[0].subject_id == "a" and g.index.size == 2 and g.counts()["subjects"] == 1


def test_one_new_subject_id_from_two_replicas(open_store):
    """Both replicas create subject `x` at once, many times over: exactly one wins each time, the other gets 409."""
    a, b = open_store(), open_store()
    for round_ in range(10):
        outcomes: list[str] = []
        barrier = threading.Barrier(2)

        def create(store) -> None:
            barrier.wait()
            try:
                store.create_subject(f"from {id(store)}", {}, f"x{round_}")
                outcomes.append("created")
            except SubjectExists:
                outcomes.append("exists")

        threads = [threading.Thread(target=create, args=(s,)) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(outcomes) == ["created", "exists"], outcomes
    assert a.counts()["subjects"] == 10


def test_no_ghost_match_after_a_delete_on_another_replica(open_store):
    """Once a delete through `a` returned, `b` never answers the deleted subject, even before b's
    index applied the delete: a search keeps only faces the database still has."""
    a, b = open_store(), open_store()
    a.create_subject("A", {}, "a")
    a.add_faces("a", [NewFace(unit(0))])
    wait_for(lambda: b.index.size == 1, "b has the face")
    b.follower.close()  # b stops following: its index keeps the face
    a.delete_subject("a")
    assert b.index.size == 1 and b.search(unit(0), 5) == []


def test_concurrent_writers_keep_a_gap_free_sequence_and_every_index_converges(open_store, database_url):
    """Two replicas enroll and delete at once: the change numbers are 1..N without a gap, and both
    indexes end up holding exactly the database's faces."""
    a, b = open_store(), open_store()
    for i in range(8):
        a.create_subject(str(i), {}, f"s{i}")

    def writer(store, offset: int) -> None:
        for i in range(25):
            (face,) = store.add_faces(f"s{(i + offset) % 8}", [NewFace(unit(1000 * offset + i))])
            if i % 3 == 0:
                store.delete_face(face.id)

    threads = [threading.Thread(target=writer, args=(s, o)) for s, o in ((a, 1), (b, 2), (a, 3), (b, 4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with psycopg.connect(database_url) as conn:
        seqs = [r[0] for r in conn.execute("SELECT seq FROM changes ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) == 4 * (25 + 9)
    expected = database_face_ids(database_url)
    assert len(expected) == 4 * 16
    for store in (a, b):
        wait_for(lambda s=store: s.replication()["lag"] == 0, "the replica catches up")
        assert index_ids(store) == expected


def test_missed_notifications_and_a_lost_connection_are_caught_up(open_store, database_url):
    """Changes committed while b's listener was cut off (its backend terminated) arrive once it reconnects."""
    a, b = open_store(), open_store()
    a.create_subject("A", {}, "a")
    wait_for(lambda: b._changes.listening, "b listens")
    with psycopg.connect(database_url, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            (LISTENER_NAME,),
        ).fetchall()
    assert len(killed) == 2, "both listeners' connections were found"
    faces = [f.id for f in a.add_faces("a", [NewFace(unit(i)) for i in range(5)])]
    wait_for(lambda: index_ids(b) == set(faces), "b catches up after reconnecting")
    wait_for(lambda: b._changes.listening, "b listens again")


def test_a_restarted_replica_loads_the_snapshot_and_follows_from_it(open_store, database_url):
    a = open_store()
    a.create_subject("A", {}, "a")
    a.add_faces("a", [NewFace(unit(i)) for i in range(3)])
    b = open_store()
    assert index_ids(b) == database_face_ids(database_url) and b.replication()["applied_sequence"] == 1
    b.close()
    a.add_faces("a", [NewFace(unit(10))])  # while b is down
    b = open_store()
    a.add_faces("a", [NewFace(unit(11))])  # after b loaded
    wait_for(lambda: index_ids(b) == database_face_ids(database_url), "b has every face")
    assert len(index_ids(b)) == 5


def test_other_models_faces_are_kept_not_searched_and_reembed_reaches_running_replicas(open_store, database_url):
    a = open_store(KEY)
    a.create_subject("A", {}, "a")
    crop = np.full((112, 112, 3), 7, np.uint8)
    a.add_faces("a", [NewFace(unit(0), chip=template_chip(crop, "arcface_112")), NewFace(unit(1))])
    serving = open_store(OTHER)  # a replica on the new model, running while the gallery is re-embedded
    assert serving.index.size == 0 and serving.incompatible == {f"model-a@{'a' * 12}": 2}
    assert serving.counts()["incompatible_faces"] == 2
    maintenance = open_store(OTHER, searchable=False)
    assert maintenance.replication() is None
    assert maintenance.reembed(lambda crops: np.stack([unit(9)] * len(crops)), "arcface_112") == (1, 1)
    wait_for(lambda: serving.index.size == 1, "the re-embedded face reaches the new model's replica")
    assert serving.search(unit(9), 1)[0].similarity > 0.999
    wait_for(lambda: a.index.size == 1, "the old model's replica drops it")


def test_a_sql_ascii_database_reads_text_as_text(postgres_server):
    """A cluster created as SQL_ASCII (issue 37): psycopg returns its text columns as bytes unless the
    connection asks for UTF-8, and the gallery then took its own faces for another embedder's."""
    import uuid

    url = postgres_server.create_database(f"t_{uuid.uuid4().hex[:12]}", encoding="SQL_ASCII")
    with psycopg.connect(url) as conn:  # what the gallery would read without asking for UTF-8
        assert conn.execute("SHOW server_encoding").fetchone()[0] == b"SQL_ASCII"
    writer = PostgresGallery(url, KEY, pool_size=2)
    try:
        writer.create_subject("Zoë Ångström", {"site": "Malmö"}, "zoe")
        (face,) = writer.add_faces("zoe", [NewFace(unit(0))])
    finally:
        writer.close()
    store = PostgresGallery(url, KEY, pool_size=2)  # a restart: the index loads from the snapshot
    try:
        assert store.incompatible == {} and store.counts()["incompatible_faces"] == 0
        assert store.index.size == 1 and store.search(unit(0), 1)[0].face_id == face.id
        subject = store.get_subject("zoe")
        assert subject.name == "Zoë Ångström" and subject.metadata == {"site": "Malmö"}
        assert [s.id for s in store.list_subjects(10, 0, search="ÅNGSTRÖM")[0]] == ["zoe"]  # the console's search, in any case under "C"
    finally:
        store.close()


def test_the_settings_choose_the_store(database_url, tmp_path):
    from pydantic import ValidationError

    from service.core.settings import Settings
    from service.gallery.factory import open_gallery
    from service.gallery.sqlite import SqliteGallery

    password = tmp_path / "db_password"
    password.write_text("s3cret\n")
    store = open_gallery(Settings(database_url=database_url, database_password_file=password, data_dir=tmp_path), KEY)
    try:
        assert isinstance(store, PostgresGallery) and "password=s3cret" in store.url and not any(tmp_path.glob("*.sqlite3"))
    finally:
        store.close()
    sqlite = open_gallery(Settings(data_dir=tmp_path), KEY)
    assert isinstance(sqlite, SqliteGallery) and sqlite.replication() is None
    sqlite.close()
    with pytest.raises(ValidationError, match="postgresql://"):
        Settings(database_url="mysql://db/x")


def test_a_persisted_index_replays_the_changes_made_while_its_replica_was_down(open_store, database_url, tmp_path, caplog):
    config = IndexConfig("HNSW16", "efSearch=64", tmp_path)
    a = PostgresGallery(database_url, KEY, index=config)
    a.create_subject("A", {}, "a")
    (kept, gone) = a.add_faces("a", [NewFace(unit(0)), NewFace(unit(1))])
    a.close()
    b = open_store()  # another replica writes while a is down
    b.create_subject("B", {}, "b")
    b.add_faces("b", [NewFace(unit(2))])
    b.delete_face(gone.id)
    caplog.set_level("INFO", "facegate.gallery")
    a = PostgresGallery(database_url, KEY, index=config)
    try:
        assert "loaded from" in caplog.text and "read at change 1 is searched from change 3" in caplog.text
        assert a.index.size == 2 and a.index.describe()["backend"] == "faiss-hnsw"
        assert a.search(unit(2), 1)[0].subject_id == "b"
        assert all(c.face_id != gone.id for c in a.search(unit(1), 5))
    finally:
        a.close()


def test_an_index_file_from_another_database_is_not_replayed_onto(open_store, database_url, tmp_path, caplog):
    config = IndexConfig("HNSW16", "", tmp_path)
    a = PostgresGallery(database_url, KEY, index=config)
    a.create_subject("A", {}, "a")
    a.add_faces("a", [NewFace(unit(0))])
    a.close()
    meta = read_meta(config.path(KEY.sha256))
    write_atomically(config.path(KEY.sha256), json.dumps({**meta, "change": "0" * 32}).encode())  # as if saved against another database
    caplog.set_level("INFO", "facegate.gallery")
    a = PostgresGallery(database_url, KEY, index=config)
    try:
        assert "loaded from" not in caplog.text and a.index.size == 1
    finally:
        a.close()


def test_every_replica_decides_with_the_same_guard(open_store, database_url, tmp_path):
    """The open-set roster is derived like the index: from the same snapshot and the same changes,
    so replicas that applied the same changes hold the same subjects, faces and leave-one-out tail,
    however they got there (writing, following, restarting from a snapshot, replaying onto a
    persisted index). With Milvus, the counts come from the database and there is no guard."""
    a, b = open_store(), open_store()
    for i in range(110):
        store = a if i % 2 else b
        store.create_subject(f"p{i}", {}, f"p{i}")
        store.add_faces(f"p{i}", [NewFace(unit(5000 + 2 * i + j)) for j in range(1 + i % 2)])
    (extra,) = a.add_faces("p3", [NewFace(unit(9))])
    b.delete_face(extra.id)
    b.delete_subject("p4")
    for store in (a, b):
        wait_for(lambda s=store: s.replication()["lag"] == 0, "the replica catches up")
    assert a.shape().tail is not None and (a.shape().subjects, a.shape().faces) == (109, 164)
    assert b.shape().subjects == a.shape().subjects and b.shape().faces == a.shape().faces
    assert b.shape().tail.u == pytest.approx(a.shape().tail.u, abs=1e-6) and b.shape().tail.beta == pytest.approx(
        a.shape().tail.beta, abs=1e-6
    )
    c = open_store()  # from the snapshot
    assert c.shape().tail.u == pytest.approx(a.shape().tail.u, abs=1e-6) and c.shape().faces == a.shape().faces
    persisted = IndexConfig("HNSW16", "", tmp_path)
    d = open_store(index=persisted)
    d.close()
    a.add_faces("p5", [NewFace(unit(77))])  # while d is down: replayed onto its saved index and its roster
    d = open_store(index=persisted)
    wait_for(lambda: a.replication()["lag"] == 0 and d.replication()["lag"] == 0, "both caught up")
    assert d.shape().faces == a.shape().faces == 165 and d.shape().tail.u == pytest.approx(a.shape().tail.u, abs=1e-6)
    assert open_store(guard=False).shape().tail is None


def test_with_milvus_the_counts_come_from_the_database(open_store, tmp_path):
    importorskip("milvus_lite")
    store = open_store(index=IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="FLAT"))
    store.create_subject("A", {}, "a")
    store.add_faces("a", [NewFace(unit(1)), NewFace(unit(2))])
    shape = store.shape()
    assert (shape.subjects, shape.faces, shape.tail) == (1, 2, None)
