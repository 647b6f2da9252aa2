"""Milvus as the shared vector index (FACEGATE_MILVUS_URI), against Milvus Lite (a local file; one
process may open it, so "replicas" here are several stores in this process sharing one Milvus and
one PostgreSQL). What is promised: a 2xx enrollment is searchable on every replica at once (Strong
consistency), a deleted face is never answered, Milvus unreachable is a 503 with nothing written and
the next call reconnects, re-embedding fills the new model's collection, and a replica starts without
loading anything. Synthetic embeddings."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from service.core.errors import GalleryUnavailable
from service.core.models.manifest import EmbedderKey
from service.gallery.index import IndexConfig
from service.gallery.interface import NewFace
from service.gallery.milvus import fill
from service.gallery.postgres import PostgresGallery
from service.gallery.sqlite import SqliteGallery
from tests.requirements import importorskip

importorskip("milvus_lite")

KEY = EmbedderKey("model-a", "a" * 64, 8)
OTHER = EmbedderKey("model-b", "b" * 64, 8)


def unit(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return x / np.linalg.norm(x)


@pytest.fixture
def milvus(tmp_path) -> IndexConfig:
    return IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="FLAT")


@pytest.fixture
def replicas(database_url, milvus):
    stores = [PostgresGallery(database_url, KEY, pool_size=2, index=milvus) for _ in range(2)]
    yield stores
    for store in stores:
        store.close()


def unreachable(store) -> str:
    """Point the store's Milvus client at a closed port (as if Milvus went down); returns the real URI."""
    uri, store.index.uri, store.index._client = store.index.uri, "http://127.0.0.1:1", None
    return uri


def test_an_enrollment_is_searchable_on_every_replica_at_once(replicas):
    a, b = replicas
    assert a.follower is None and a.replication() is None  # nothing to keep in step: Milvus is shared
    a.create_subject("A", {}, "a")
    (face,) = a.add_faces("a", [NewFace(unit(0))])
    found = b.search(unit(0), 1)  # no wait: Strong consistency
    assert found[0].subject_id == "a" and found[0].face_id == face.id and found[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert b.index.describe() | {"uri": None} == {
        "backend": "milvus",
        "uri": None,
        "collection": f"facegate_{'a' * 16}",
        "partition": "default",
        "index_type": "FLAT",
        "index_params": {},
        "search_params": {},
        "search_params_source": "default",
        "metric": "IP",
        "consistency": "Strong",
        "size": 1,
    }
    assert b.counts()["searchable_faces"] == 1


def test_a_deleted_face_is_never_answered_even_when_milvus_kept_it(replicas):
    a, b = replicas
    a.create_subject("A", {}, "a")
    a.create_subject("B", {}, "b")
    (gone, kept) = a.add_faces("a", [NewFace(unit(0)), NewFace(unit(1))])
    a.add_faces("b", [NewFace(unit(2))])
    a.delete_face(gone.id)
    assert all(c.face_id != gone.id for c in b.search(unit(0), 5)) and b.index.size == 2
    uri = unreachable(a)  # the delete commits, Milvus keeps the vector: search still never returns it
    a.delete_subject("b")
    a.index.uri = uri
    assert a.index.size == 2  # the orphan is still in Milvus...
    assert [c.subject_id for c in b.search(unit(2), 5)] == ["a"]  # ...but never answered


def test_milvus_unreachable_is_a_503_that_writes_nothing_and_recovers(replicas, database_url):
    a, b = replicas
    a.create_subject("A", {}, "a")
    uri = unreachable(a)
    with pytest.raises(GalleryUnavailable, match="Milvus"):
        a.add_faces("a", [NewFace(unit(0))])
    with pytest.raises(GalleryUnavailable):
        a.search(unit(0), 1)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM faces").fetchone()[0] == 0  # rolled back: no face Milvus lacks
    a.index.uri = uri  # Milvus is back: the next call reconnects
    a.add_faces("a", [NewFace(unit(0))])
    assert b.search(unit(0), 1)[0].subject_id == "a"


def test_reembedding_fills_the_new_models_collection(database_url, milvus):
    from service.core.alignment import template_chip

    old = PostgresGallery(database_url, OTHER, pool_size=2, index=milvus)
    old.create_subject("A", {}, "a")
    old.add_faces("a", [NewFace(unit(0), chip=template_chip(np.full((112, 112, 3), 7, np.uint8), "arcface_112"))])
    old.close()
    maintenance = PostgresGallery(database_url, KEY, searchable=False, pool_size=2, index=milvus)  # `facegate gallery reembed`
    assert maintenance.reembed(lambda crops: np.stack([unit(9)] * len(crops)), "arcface_112") == (1, 0)
    maintenance.close()
    new = PostgresGallery(database_url, KEY, pool_size=2, index=milvus)
    try:
        assert new.index.size == 1 and new.search(unit(9), 1)[0].similarity == pytest.approx(1.0, abs=1e-5)
    finally:
        new.close()


def test_the_sqlite_store_on_milvus(tmp_path, milvus):
    g = SqliteGallery.open(tmp_path, KEY, index=milvus)
    g.create_subject("A", {}, "a")
    g.create_subject("B", {}, "b")
    g.add_faces("a", [NewFace(unit(0)), NewFace(unit(1))])
    g.add_faces("b", [NewFace(unit(2))])
    assert [c.subject_id for c in g.search(unit(1), 5)] == ["a", "b"]
    assert g.delete_subject("a") == 2 and g.index.size == 1
    uri = unreachable(g)
    with pytest.raises(GalleryUnavailable):
        g.add_faces("b", [NewFace(unit(3))])
    g.index.uri = uri
    assert g.counts() == {"subjects": 1, "faces": 1, "searchable_faces": 1, "incompatible_faces": 0}
    g.close()
    again = SqliteGallery.open(tmp_path, KEY, index=milvus)  # nothing to load: Milvus kept it
    assert again.search(unit(2), 1)[0].subject_id == "b"
    again.close()


def test_sync_index_moves_a_gallery_onto_milvus_and_drops_what_it_missed(tmp_path, milvus):
    """An existing SQLite gallery (FAISS) moved onto Milvus, resumed after an interruption, and a
    delete Milvus missed while unreachable removed."""
    g = SqliteGallery.open(tmp_path, KEY)
    for s in range(3):
        g.create_subject(f"S{s}", {}, f"s{s}")
        g.add_faces(f"s{s}", [NewFace(unit(10 * s + i)) for i in range(4)])
    g.close()
    g = SqliteGallery.open(tmp_path, KEY, index=milvus)
    assert g.index.size == 0 and g.search(unit(0), 1) == []  # nothing in Milvus yet
    seen = []
    with pytest.raises(RuntimeError):  # interrupted after the first batch
        fill(g, g.index, batch=5, progress=lambda n, last: seen.append(last) or (n >= 5 and (_ for _ in ()).throw(RuntimeError("killed"))))
    assert g.index.size == 5
    uri = unreachable(g)
    g.delete_subject("s0")  # Milvus misses this delete (its 4 faces are in Milvus already)
    g.index.uri = uri
    assert fill(g, g.index, after_id=seen[-1], batch=5) == (7, 4)  # the rest, then the 4 orphans
    assert g.index.size == 8 and g.search(unit(11), 1)[0].subject_id == "s1" and g.search(unit(0), 1)[0].subject_id != "s0"
    g.close()


def test_a_milvus_deadline_is_a_503_too(tmp_path, milvus):
    """A call past FACEGATE_MILVUS_TIMEOUT fails in gRPC, not as a MilvusException: still a 503."""
    import grpc

    class Deadline(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.DEADLINE_EXCEEDED

        def details(self):
            return "Deadline Exceeded"

    g = SqliteGallery.open(tmp_path, KEY, index=milvus)
    try:
        g.index._client.search = lambda *a, **k: (_ for _ in ()).throw(Deadline())
        with pytest.raises(GalleryUnavailable, match="DEADLINE_EXCEEDED"):
            g.index.search(unit(0)[None], 1)
        assert g.index._client is None  # the next call reconnects
        assert g.search(unit(0), 1) == []
    finally:
        g.close()


def test_readyz_counts_the_collection_once_per_read(tmp_path, milvus, monkeypatch):
    """/readyz and /metrics read the counts and the index's description together: on Milvus each
    size is a count(*) query, which one read must not run twice (issue 37)."""
    import asyncio

    from service.gallery.stats import GalleryStats

    g = SqliteGallery.open(tmp_path, KEY, index=milvus)
    g.create_subject("A", {}, "a")
    g.add_faces("a", [NewFace(unit(0)), NewFace(unit(1))])
    calls = []
    call = g.index._call
    monkeypatch.setattr(g.index, "_call", lambda fn: calls.append(fn) or call(fn))
    stats = GalleryStats(g, wait=30)
    snapshot = asyncio.run(stats.snapshot())
    stats.close()
    assert snapshot.fresh and snapshot.counts["searchable_faces"] == 2 and snapshot.index["size"] == 2
    assert len(calls) == 1, f"{len(calls)} Milvus calls for one read"
    g.close()


def test_milvus_index_and_search_parameters_default_per_index_type(tmp_path):
    """A collection facegate creates gets IVF lists (or an HNSW graph) of its own choosing, and
    searches the nprobe / ef facegate's FAISS defaults give; given ones win. (Milvus Lite builds
    them but searches exactly whatever the index, so recall itself is the FAISS tests'.)"""
    from service.gallery.index import default_ef_search, default_nprobe
    from service.gallery.milvus import MILVUS_NLIST, default_search_params
    from service.gallery.recall import held_out, measured

    ivf = IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="IVF_FLAT")
    g = SqliteGallery.open(tmp_path, KEY, index=ivf)
    sent = []
    search = g.index._client.search
    g.index._client.search = lambda *a, **k: sent.append(k["search_params"]) or search(*a, **k)
    try:
        g.create_subject("A", {}, "a")
        g.add_faces("a", [NewFace(unit(i)) for i in range(20)])
        assert g.index.tune() is None  # set when the store opened
        described = g.index.describe()
        assert described["index_params"] == {"nlist": MILVUS_NLIST} and described["search_params_source"] == "default"
        assert described["search_params"] == {"nprobe": default_nprobe(MILVUS_NLIST)}
        assert g.search(unit(3), 1)[0].face_id and sent[-1] == {"metric_type": "IP", "params": described["search_params"]}
        result = measured(g, g.index, held_out(g, g.index, 10, seed=0))
        assert result.queries == result.mated_queries == 10 and result.recall_at_1 == 1.0 and g.index.changes == 20
        nprobe = described["search_params"]["nprobe"]
        assert g.index.widen() == {"nprobe": min(2 * nprobe, MILVUS_NLIST)} and g.index.describe()["widened_from"] == {"nprobe": nprobe}
        assert g.index.describe()["search_params_source"] == "widened" and g.index.tune() is None  # kept as the gallery grows
        while g.index.widen() is not None:
            pass
        assert g.index.search_params == {"nprobe": MILVUS_NLIST} and g.index.answers_exactly  # every list of IVF_FLAT: exact
    finally:
        g.close()
    given = IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index="HNSW", milvus_search_params={"ef": 32})
    g = SqliteGallery.open(tmp_path, KEY, index=given)  # the collection exists: it keeps its IVF index
    try:
        assert g.index.index_type == "IVF_FLAT" and g.index.describe()["search_params"] == {"ef": 32}
        assert g.index._search_params(100) == {"ef": 100}  # Milvus refuses an ef below the faces asked for
    finally:
        g.close()
    assert default_search_params("HNSW", {}, 10**6) == {"ef": default_ef_search(10**6)}
    assert default_search_params("IVF_SQ8", {}, 10**6) == {"nprobe": default_nprobe(128)}  # Milvus's default nlist
    assert default_search_params("AUTOINDEX", {}, 10**6) == {}  # Milvus's own choice


def test_collections_are_partitions_of_one_milvus_collection(tmp_path, milvus, database_url):
    """Issue 50: each facegate collection writes and searches its own partition (the partition key);
    the same faces in two collections are answered in each from its own, sizes and deletes stay apart."""
    home = SqliteGallery.open(tmp_path, KEY, index=milvus, collection="home")
    office = SqliteGallery.open(tmp_path, KEY, index=milvus, collection="office")
    try:
        for gallery, subject in ((home, "h"), (office, "o")):
            gallery.create_subject(subject.upper(), {}, subject)
            gallery.add_faces(subject, [NewFace(unit(0)), NewFace(unit(1))])
        home.create_subject("Only", {}, "only-home")
        home.add_faces("only-home", [NewFace(unit(2))])
        assert (home.index.size, office.index.size) == (3, 2)
        assert [c.subject_id for c in office.search(unit(2), 5)] == ["o"]
        assert [c.subject_id for c in home.search(unit(2), 5)] == ["only-home", "h"]
        assert home.delete_subject("h") == 2 and (home.index.size, office.index.size) == (1, 2)
        assert home.index.describe()["partition"] == "home"
    finally:
        home.close()
        office.close()


def test_a_milvus_collection_made_before_collections_serves_default_only(tmp_path, milvus):
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri=milvus.milvus_uri)
    schema = MilvusClient.create_schema(auto_id=False)  # the schema facegate made before issue 50
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=8)
    params = client.prepare_index_params()
    params.add_index("embedding", index_type="FLAT", metric_type="IP")
    client.create_collection(f"facegate_{KEY.sha256[:16]}", schema=schema, index_params=params)
    client.close()
    g = SqliteGallery.open(tmp_path, KEY, index=milvus)
    try:
        g.create_subject("A", {}, "a")
        g.add_faces("a", [NewFace(unit(0))])
        assert g.search(unit(0), 1)[0].subject_id == "a" and g.index.describe()["partition"] is None
    finally:
        g.close()
    with pytest.raises(GalleryUnavailable, match="before facegate had collections"):
        SqliteGallery.open(tmp_path, KEY, index=milvus, collection="home")


@pytest.mark.parametrize("index_type", ["IVF_FLAT", "HNSW"])
def test_under_the_minimum_milvus_answers_exactly_only_where_its_index_can(tmp_path, index_type):
    """Milvus keeps no exact copy (other replicas write to it directly, past this process): an
    IVF_FLAT collection widened to every list answers as FLAT does, and the check says `exact`; any
    other index type, widened as far as it goes, stays a /readyz problem that names IVF_FLAT and
    FLAT. (Milvus Lite searches exactly whatever the index: here its search loses each query's two
    best faces until every list is scanned, as an index searched too narrowly loses them.)"""
    from service.gallery.index import MAX_EF_SEARCH
    from service.gallery.milvus import MILVUS_NLIST
    from service.gallery.recall import RecallCheck

    g = SqliteGallery.open(tmp_path, KEY, index=IndexConfig(milvus_uri=str(tmp_path / "milvus.db"), milvus_index=index_type))
    try:
        for p in range(10):
            g.create_subject(f"p{p}", {}, f"p{p}")
            g.add_faces(f"p{p}", [NewFace(unit(100 * p + i)) for i in range(3)])
        search = g.index.search

        def narrow(queries, k, approximate=False):
            scores, ids = search(queries, k + 2, approximate)
            return (scores[:, :k], ids[:, :k]) if g.index.answers_exactly else (scores[:, 2:], ids[:, 2:])

        g.index.search = narrow
        check = RecallCheck(g, lambda: g.index, sample=10, every=1000, minimum=0.97)
        result = check.run()
        assert result is not None
        if index_type == "IVF_FLAT":
            assert g.index.search_params == {"nprobe": MILVUS_NLIST} and result.answers == "exact" and result.recall_at_1 == 1.0
            assert check.problems() == []
        else:
            assert g.index.search_params == {"ef": MAX_EF_SEARCH} and result.answers == "index" and result.recall_at_1 < 0.97
            (problem,) = check.problems()
            assert "Milvus has no exact search" in problem["error"] and "IVF_FLAT" in problem["fix"] and "FLAT" in problem["fix"]
    finally:
        g.close()
