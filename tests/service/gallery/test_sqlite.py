"""The SQLite gallery and its index: durability across reopen, subject-level ranking, deletes,
embedder compatibility and re-embedding from stored crops. Synthetic embeddings, no models."""

import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from service.core.alignment import template_chip
from service.core.errors import FaceNotFound, SubjectExists, SubjectNotFound
from service.core.models.manifest import EmbedderKey
from service.gallery import sqlite
from service.gallery.index import IndexConfig
from service.gallery.interface import NewFace
from service.gallery.sqlite import SqliteGallery
from tests.requirements import importorskip

KEY = EmbedderKey("model-a", "a" * 64, 8)
OTHER = EmbedderKey("model-b", "b" * 64, 8)


def unit(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return x / np.linalg.norm(x)


@pytest.fixture(params=["faiss", "milvus"])
def gallery(tmp_path, request):
    """The store on its own FAISS index, and on Milvus Lite (FACEGATE_MILVUS_URI)."""
    if request.param == "milvus":
        importorskip("milvus_lite")
    index = IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="FLAT") if request.param == "milvus" else None
    g = SqliteGallery.open(tmp_path, KEY, index=index)
    yield g
    g.close()


def test_pragmas_make_commits_durable(gallery):
    db = sqlite3.connect(gallery.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    assert gallery._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_subject_crud_and_pagination(gallery):
    for i in range(5):
        gallery.create_subject(f"person {i}", {"i": i}, f"s{i}")
    with pytest.raises(SubjectExists):
        gallery.create_subject("dup", {}, "s0")
    page, total = gallery.list_subjects(limit=2, offset=2)
    assert total == 5 and [s.id for s in page] == ["s2", "s3"]
    updated = gallery.update_subject("s1", None, {"k": "v"})
    assert updated.name == "person 1" and updated.metadata == {"k": "v"}
    gallery.delete_subject("s1")
    with pytest.raises(SubjectNotFound):
        gallery.get_subject("s1")
    with pytest.raises(SubjectNotFound):
        gallery.delete_subject("s1")


def test_search_ranks_subjects_by_their_best_face(gallery):
    gallery.create_subject("A", {}, "a")
    gallery.create_subject("B", {}, "b")
    query = unit(0)
    near = query + 0.05 * unit(1)
    gallery.add_faces("a", [NewFace(unit(2)), NewFace(near / np.linalg.norm(near))])
    gallery.add_faces("b", [NewFace(unit(3)), NewFace(unit(4)), NewFace(unit(5))])
    ranked = gallery.search(query, top_k=5)
    assert [c.subject_id for c in ranked] == ["a", "b"]  # each subject once, best first
    assert ranked[0].similarity > 0.99
    assert gallery.search(query, top_k=1)[0].subject_id == "a"


def test_deletes_leave_search_and_database(gallery):
    gallery.create_subject("A", {}, "a")
    (face,) = gallery.add_faces("a", [NewFace(unit(0))])
    gallery.create_subject("B", {}, "b")
    gallery.add_faces("b", [NewFace(unit(1)), NewFace(unit(2))])
    gallery.delete_face(face.id)
    assert all(c.subject_id != "a" for c in gallery.search(unit(0), 5))
    with pytest.raises(FaceNotFound):
        gallery.delete_face(face.id)
    assert gallery.delete_subject("b") == 2
    assert gallery.search(unit(1), 5) == [] and gallery.index.size == 0
    assert gallery.counts()["faces"] == 0


def test_add_to_unknown_subject_writes_nothing(gallery):
    with pytest.raises(SubjectNotFound):
        gallery.add_faces("ghost", [NewFace(unit(0))])
    assert gallery.counts()["faces"] == 0 and gallery.index.size == 0


def test_reopen_rebuilds_the_index_and_ignores_other_models(tmp_path):
    g = SqliteGallery.open(tmp_path, KEY)
    g.create_subject("A", {}, "a")
    g.add_faces("a", [NewFace(unit(0)), NewFace(unit(1))])
    g.close()
    other = SqliteGallery.open(tmp_path, OTHER)  # a different embedder is active now
    assert other.index.size == 0 and other.search(unit(0), 5) == []
    assert other.incompatible == {f"model-a@{'a' * 12}": 2}
    assert other.counts()["incompatible_faces"] == 2
    assert len(other.subject_embeddings("a")) == 0
    other.close()
    again = SqliteGallery.open(tmp_path, KEY)
    assert again.index.size == 2 and again.search(unit(1), 1)[0].subject_id == "a"
    again.close()


def test_reembed_from_stored_crops(tmp_path):
    g = SqliteGallery.open(tmp_path, KEY)
    g.create_subject("A", {}, "a")
    crop = np.full((112, 112, 3), 7, np.uint8)
    g.add_faces("a", [NewFace(unit(0), chip=template_chip(crop, "arcface_112")), NewFace(unit(1))])
    g.close()
    g = SqliteGallery.open(tmp_path, OTHER, searchable=False)
    seen = []

    def embed(crops):
        seen.append(crops.copy())
        return np.stack([unit(9)] * len(crops))

    assert g.reembed(embed, "arcface_112") == (1, 1)  # one re-embedded, one had no crop
    assert np.array_equal(seen[0][0], crop)  # the crop survived its PNG round trip and its identity re-alignment
    g.close()
    g = SqliteGallery.open(tmp_path, OTHER)
    assert g.index.size == 1 and g.search(unit(9), 1)[0].similarity > 0.999
    g.close()


def hnsw(tmp_path) -> IndexConfig:
    return IndexConfig("HNSW16", "efSearch=64", tmp_path / "index")


def test_an_approximate_index_is_persisted_and_loaded_at_restart(tmp_path, caplog):
    g = SqliteGallery.open(tmp_path, KEY, index=hnsw(tmp_path))
    g.create_subject("A", {}, "a")
    g.create_subject("B", {}, "b")
    g.add_faces("a", [NewFace(unit(i)) for i in range(20)])
    (gone,) = g.add_faces("b", [NewFace(unit(100))])
    g.delete_face(gone.id)
    g.close()
    caplog.set_level("INFO", "facegate.gallery.index")
    g = SqliteGallery.open(tmp_path, KEY, index=hnsw(tmp_path))
    assert "loaded from" in caplog.text and "built" not in caplog.text
    assert g.index.describe()["backend"] == "faiss-hnsw" and g.index.size == 20
    assert g.search(unit(3), 1)[0].subject_id == "a" and g.search(unit(100), 2)[0].subject_id == "a"  # the deleted face stays out
    g.close()


def older_file(tmp_path) -> None:
    """An index file saved as of one face, then another enrolled while it was not saved (another process, a crash)."""
    g = SqliteGallery.open(tmp_path, KEY, index=hnsw(tmp_path))
    g.create_subject("A", {}, "a")
    g.add_faces("a", [NewFace(unit(0))])
    g.close()
    writer = SqliteGallery.open(tmp_path, KEY, searchable=False)
    writer.create_subject("B", {}, "b")
    writer.add_faces("b", [NewFace(unit(1))])
    writer.close()


@pytest.mark.parametrize(
    ("kept", "started", "not_started"), [(10_000, "loaded from", "built"), (1, "built", "loaded from")], ids=["reached", "pruned"]
)
def test_a_file_older_than_the_database_takes_the_log_since_or_is_rebuilt(tmp_path, caplog, monkeypatch, kept, started, not_started):
    """Its fingerprint no longer matches: where the log still reaches its change it is loaded and the
    log since applied to it (issue 44), where the log is pruned past it the index is rebuilt from the
    faces; either way the new face is searchable."""
    monkeypatch.setattr(sqlite, "CHANGES_KEPT", kept)
    older_file(tmp_path)
    caplog.set_level("INFO", "facegate.gallery.index")
    g = SqliteGallery.open(tmp_path, KEY, index=hnsw(tmp_path))
    assert started in caplog.text and not_started not in caplog.text
    assert g.index.size == 2 and g.search(unit(1), 1)[0].subject_id == "b"
    g.close()


def test_the_open_set_roster_follows_enrollments_and_deletes(gallery, tmp_path):
    """The subjects, faces and leave-one-out tail an FPIR decision reads: kept with every write, the
    same as computed afresh from the faces the store holds, and the same after a restart."""
    from service.core.open_set import LeaveOneOut

    assert (gallery.shape().subjects, gallery.shape().faces, gallery.shape().tail) == (0, 0, None)
    vectors = {}
    for i in range(130):
        gallery.create_subject(f"p{i}", {}, f"p{i}")
        faces = [NewFace(unit(1000 + 3 * i + j)) for j in range(1 + i % 3)]
        for face, record in zip(faces, gallery.add_faces(f"p{i}", faces), strict=True):
            vectors[record.id] = (f"p{i}", face.embedding)
    gone = list(vectors)[::7]
    for face_id in gone:
        gallery.delete_face(face_id)
        del vectors[face_id]
    gallery.delete_subject("p1")
    vectors = {f: v for f, v in vectors.items() if v[0] != "p1"}
    shape = gallery.shape()
    fresh = LeaveOneOut.build(np.array(list(vectors)), [s for s, _ in vectors.values()], np.stack([v for _, v in vectors.values()])).shape()
    assert (shape.subjects, shape.faces) == (len({s for s, _ in vectors.values()}), len(vectors)) and shape.subjects >= 100
    assert shape.tail is not None and shape.tail.u == pytest.approx(fresh.tail.u, abs=1e-5)
    assert shape.tail.beta == pytest.approx(fresh.tail.beta, abs=1e-5) and shape.tail.m == fresh.tail.m
    reopened = SqliteGallery.open(tmp_path, KEY, index=gallery.index_config)
    try:
        assert reopened.shape().tail.u == pytest.approx(shape.tail.u, abs=1e-6) and reopened.shape().faces == shape.faces
    finally:
        reopened.close()
    counted = SqliteGallery.open(tmp_path, KEY, index=gallery.index_config, guard=False)
    try:
        assert (counted.shape().subjects, counted.shape().faces, counted.shape().tail) == (shape.subjects, shape.faces, None)
    finally:
        counted.close()


def test_a_merge_moves_the_faces_and_deletes_the_emptied_subject(gallery):
    """One person under two ids merged into one: searched as the kept subject, the index's vectors
    unchanged, the open-set roster counting one subject; an unknown id changes nothing."""
    gallery.create_subject("A", {}, "a")
    gallery.create_subject("A again", {}, "a2")
    gallery.add_faces("a", [NewFace(unit(0))])
    moved = gallery.add_faces("a2", [NewFace(unit(1)), NewFace(unit(2))])
    with pytest.raises(SubjectNotFound):
        gallery.merge_subjects("a2", "ghost")
    assert gallery.counts()["subjects"] == 2 and gallery.shape().subjects == 2
    assert gallery.merge_subjects("a2", "a") == 2
    with pytest.raises(SubjectNotFound):
        gallery.get_subject("a2")
    assert [f.id for f in gallery.list_faces("a")][1:] == [f.id for f in moved]
    assert gallery.search(unit(1), 5)[0].subject_id == "a" and gallery.index.size == 3
    assert gallery.shape().subjects == 1 and gallery.counts()["subjects"] == 1


def test_a_subject_search_leaves_the_store_s_lock_to_the_requests(gallery):
    """A search reads every subject's name through a Python function (0.3 s at 100,000 subjects):
    on a connection of its own, so that a request needing the store's lock meanwhile does not wait."""
    gallery.create_subject("Ada Lovelace", {}, "ada")
    gallery.create_subject("Someone Else", {}, "else")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with gallery._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    try:
        with ThreadPoolExecutor(1) as pool:
            page, total = pool.submit(gallery.list_subjects, 10, 0, "LOVE").result(timeout=10)
        assert total == 1 and [s.id for s in page] == ["ada"]
    finally:
        release.set()
        holder.join()
