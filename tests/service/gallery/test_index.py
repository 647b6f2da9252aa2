"""The FAISS indexes behind the VectorIndex interface: ids are the caller's, removal is exact (HNSW
through remembered removals), persistence round-trips and a stale or damaged file is rebuilt, and
every candidate's similarity is re-scored from the stored embedding."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest

from service.gallery import index as index_module
from service.gallery.index import FaissIndex, IndexConfig, MappedIndex, ReadWriteLock, best_subjects, open_index, read_meta, save_index
from service.runtime.heap import release_freed
from tests.polling import wait_until
from tests.requirements import need

NO_CANDIDATES = np.zeros(0, np.int64)  # an index trained with no recall check's faces to hold back


def unit(rows: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_search_returns_caller_ids_best_first():
    index = FaissIndex(16)
    vectors = unit(50)
    index.add(np.arange(1000, 1050), vectors)
    scores, ids = index.search(vectors[7], 3)
    assert ids[0, 0] == 1007
    assert scores[0, 0] == np.float32(1.0) or abs(scores[0, 0] - 1.0) < 1e-5
    assert list(scores[0]) == sorted(scores[0], reverse=True)
    assert index.size == 50


def test_remove_takes_faces_out_of_results():
    index = FaissIndex(16)
    vectors = unit(10)
    index.add(np.arange(10), vectors)
    assert index.remove(np.array([3, 4, 99])) == 2
    _, ids = index.search(vectors[3], 10)
    assert 3 not in ids[0] and 4 not in ids[0]
    assert index.size == 8


def test_empty_index_and_k_larger_than_size():
    index = FaissIndex(16)
    scores, ids = index.search(unit(1)[0], 5)
    assert scores.shape == (1, 0) and ids.shape == (1, 0)
    index.add(np.array([1, 2]), unit(2))
    _, ids = index.search(unit(1, seed=1)[0], 5)
    assert sorted(ids[0]) == [1, 2]


@pytest.mark.parametrize(("spec", "params"), [("HNSW16", "efSearch=64"), ("HNSW16,SQ8", "efSearch=64"), ("IVF4,Flat", "nprobe=4")])
def test_approximate_index_adds_removes_and_searches(spec, params):
    index = FaissIndex(16, spec, params)
    vectors = unit(400)
    if not index.is_trained:
        index.train(np.arange(400), vectors, NO_CANDIDATES)
    index.add(np.arange(400), vectors)
    assert index.remove(np.array([7, 8, 7, 9999])) == 2  # a repeat and an unknown id count once / not at all
    assert index.size == 398
    _, ids = index.search(vectors[7], 10)
    assert 7 not in ids[0] and 8 not in ids[0]
    _, ids = index.search(vectors[9], 1)
    assert ids[0, 0] == 9
    index.add(np.array([7]), vectors[7:8])  # a removed id added again (re-embedding) is found again
    assert index.size == 399
    _, ids = index.search(vectors[7], 1)
    assert ids[0, 0] == 7


def test_hnsw_search_skips_removed_faces_while_searching():
    index = FaissIndex(16, "HNSW16", "efSearch=200")
    vectors = unit(100)
    index.add(np.arange(100), vectors)
    index.remove(np.arange(0, 100, 2))
    scores, ids = index.search(vectors[1], 50)
    assert sorted(ids[0].tolist()) == list(range(1, 100, 2))
    assert list(scores[0]) == sorted(scores[0], reverse=True)


def test_save_and_load_keep_ids_removals_and_parameters(tmp_path):
    index = FaissIndex(16, "HNSW16", "efSearch=77")
    vectors = unit(50)
    index.add(np.arange(100, 150), vectors)
    index.remove(np.array([100]))
    path = tmp_path / "index.json"
    index.save(path, {"faces": [1, 2, 3]})
    first = read_meta(path)["file"]
    index.add(np.array([500]), unit(1, seed=5))
    index.save(path, {"faces": [4, 5, 6]})
    meta = read_meta(path)
    assert meta["faces"] == [4, 5, 6] and meta["removed"] == [100]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index.json", meta["file"], meta["aside"]])  # the older files are gone
    assert meta["file"] != first
    loaded = FaissIndex.load(path, meta, "efSearch=77")
    assert loaded.size == 50 and loaded.describe()["backend"] == "faiss-hnsw"
    assert faiss.downcast_index(loaded._searched.index).hnsw.efSearch == 77  # on the mapped file it searches
    _, ids = loaded.search(vectors[5], 1)
    assert ids[0, 0] == 105


def graph_ids(meta_path: Path) -> set[int]:
    """The ids in a saved HNSW index's graph file."""
    graph = faiss.read_index(str(meta_path.with_name(read_meta(meta_path)["file"])))
    return set(faiss.vector_to_array(graph.id_map).tolist())


def test_an_hnsw_graph_keeps_the_check_s_faces_aside_searched_and_saved_beside_it(tmp_path, monkeypatch):
    """Issue 47: up to ASIDE held-back faces (one id in eight) stay out of the graph, searched flat
    beside it: found like any face, removed, saved in a file of their own and mapped with the graph,
    and those added to a mapped index join them when it is saved again; a freed place takes the next."""
    monkeypatch.setattr(index_module, "ASIDE", 3)
    index = FaissIndex(16, "HNSW16", "efSearch=64")
    vectors = unit(48)
    index.add(np.arange(40), vectors[:40])  # held back: 7, 15, 23, 31, 39; the first three kept aside
    assert np.flatnonzero(index.held_out_of(np.arange(40))).tolist() == [7, 15, 23] and index.size == 40
    assert index.describe()["kept_aside"] == 3 and "kept_aside" not in FaissIndex(16, "IVF4,Flat").describe()
    assert [index.search(vectors[i], 1)[1][0, 0] for i in (7, 15, 31)] == [7, 15, 31]
    assert index.remove(np.array([15, 16])) == 2 and 15 not in index.search(vectors[15], 40)[1][0] and index.size == 38
    index.add(np.array([47]), vectors[47:48])  # the freed place
    assert np.flatnonzero(index.held_out_of(np.arange(48))).tolist() == [7, 23, 47]
    path = tmp_path / "index.json"
    index.save(path, {})
    assert graph_ids(path) == set(range(40)) - {7, 15, 23}  # 16, removed, is still a node there (its meta lists it)
    loaded = FaissIndex.load(path, read_meta(path), "efSearch=64")
    assert isinstance(loaded.aside, MappedIndex) and np.flatnonzero(loaded.held_out_of(np.arange(48))).tolist() == [7, 23, 47]
    assert loaded.size == 39 and [loaded.search(vectors[i], 1)[1][0, 0] for i in (7, 47, 31)] == [7, 47, 31]
    loaded.remove(np.array([23]))
    loaded.add(np.array([55]), unit(1, seed=9))  # mapped: to the own part, marked for the aside
    assert np.flatnonzero(loaded.held_out_of(np.arange(56))).tolist() == [7, 47, 55]
    loaded.save(path, {})
    assert graph_ids(path) == set(range(40)) - {7, 15, 23} and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["index.json", read_meta(path)["file"], read_meta(path)["aside"]]
    )
    again = FaissIndex.load(path, read_meta(path), "efSearch=64")
    assert np.flatnonzero(again.held_out_of(np.arange(56))).tolist() == [7, 47, 55] and again.size == 39
    assert again.describe()["kept_aside"] == 3


def test_an_hnsw_file_saved_without_an_aside_loads_as_before(tmp_path):
    """An index file written before the aside: every face in its graph, none drawn apart (the
    recall check hides its faces in the graph, as it did); an IVF index has none either."""
    index = FaissIndex(16, "HNSW16")
    vectors = unit(30)
    index.add(np.arange(30), vectors)
    path = tmp_path / "index.json"
    index.save(path, {})
    meta = read_meta(path)
    old = tmp_path / "old.json"
    whole = faiss.IndexIDMap(faiss.IndexHNSWFlat(16, 16, faiss.METRIC_INNER_PRODUCT))
    whole.add_with_ids(vectors, np.arange(30))
    faiss.write_index(whole, str(tmp_path / "old.0.faiss"))
    old.write_text(json.dumps({**{k: v for k, v in meta.items() if k != "aside"}, "file": "old.0.faiss"}))
    loaded = FaissIndex.load(old, read_meta(old), "")
    assert loaded.aside is None and loaded.held_out_of(np.arange(30)).all() and loaded.size == 30
    assert loaded.search_hiding(vectors[7:8], 3, np.array([7]))[0, 0] != 7
    assert FaissIndex(16, "IVF4,Flat").aside is None


def test_an_ivf_index_trains_without_the_check_s_faces_and_their_near_copies(tmp_path, monkeypatch):
    """The faces the recall check draws (one id in eight) trained no IVF list, nor did their near
    copies (a mirror image, a re-crop enrolled again: cosine NEAR_COPY or more): trained on them, a
    list's centroid sat on the face the check then searches, which a new photo's never does. The
    faces so held back are kept in the index's file; one saved before has none (its check draws
    every held-back face, as it did)."""
    photos = unit(600, seed=1)
    copies = photos + 0.05 * unit(600, seed=2)  # one near copy of each photo, enrolled right after it
    copies /= np.linalg.norm(copies, axis=1, keepdims=True)
    assert (np.einsum("fd,fd->f", photos, copies) > index_module.NEAR_COPY).all()
    vectors = np.stack([photos, copies], 1).reshape(1200, 16)
    trained: list[np.ndarray] = []
    index = FaissIndex(16, "IVF8,Flat")
    inner_train = index._index.train
    monkeypatch.setattr(index._index, "train", lambda x: trained.append(np.array(x)) or inner_train(x))
    ids = np.arange(1200)
    index.train(ids, vectors, ids[index_module.held_back(ids)])  # the candidates: the held-back ids
    index.add(ids, vectors)
    (training,) = trained
    drawn = index.check_faces
    assert drawn is not None and len(drawn) == 150 and (drawn % 8 == 7).all()  # every held-back face: their copies are 150 of 1,050
    assert (training @ vectors[drawn].T).max() < index_module.NEAR_COPY  # neither the faces nor their copies trained
    assert len(training) == 1200 - 150 - 150
    assert np.flatnonzero(index.held_out_of(ids)).tolist() == sorted(drawn.tolist())
    path = tmp_path / "index.json"
    index.save(path, {})
    assert sorted(FaissIndex.load(path, read_meta(path), "").check_faces.tolist()) == sorted(drawn.tolist())
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in read_meta(path).items() if k != "check_faces"}))
    assert FaissIndex.load(old, read_meta(old), "").held_out_of(ids).tolist() == (ids % 8 == 7).tolist()


def test_the_check_s_faces_are_drawn_from_the_candidates_the_store_gives(monkeypatch):
    """The store's sample names the recall check's candidates (a face per person: sqlite.py's
    CHECK_CANDIDATES): the check draws its faces from them, whatever their ids, and the index trains
    on every other face of the sample, the candidates it did not draw too."""
    vectors, ids = unit(1200, seed=6), np.arange(1200)
    trained: list[np.ndarray] = []
    index = FaissIndex(16, "IVF8,Flat")
    inner_train = index._index.train
    monkeypatch.setattr(index._index, "train", lambda x: trained.append(np.array(x)) or inner_train(x))
    candidates = ids[::6]  # 200, a third of them ids held_back names
    index.train(ids, vectors, candidates, check_sample=150)
    (training,) = trained
    drawn = index.check_faces
    assert drawn is not None and len(drawn) == 150 and np.isin(drawn, candidates).all()
    assert len(training) == 1200 - 150 and (training @ vectors[drawn].T).max() < 0.999  # the 50 not drawn train; no copies here
    assert np.flatnonzero(index.held_out_of(ids)).tolist() == sorted(drawn.tolist())


def test_the_copies_held_back_take_at_most_a_quarter_of_the_training():
    """A gallery where every face has many near copies: the check's faces are held back with theirs
    only while that leaves three quarters of the training (COPIES_LEFT_OUT), drawn from all over the
    sample rather than its first ids, and no more of them than the check draws (each takes its
    copies' weight from the lists around the faces the check searches)."""
    people = unit(100, seed=4)
    vectors = np.repeat(people, 12, axis=0) + 0.02 * unit(1200, seed=5)  # 12 near copies of each of 100 faces
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1200)
    candidate = ids % 12 == 5  # the store's candidates: a face of each person
    drawn, left_out = index_module.held_back_with_copies(ids, vectors, candidate, index_module.NEAR_COPY, 1000)
    assert 0 < len(left_out) <= index_module.COPIES_LEFT_OUT * (1200 - len(drawn)) and not np.isin(left_out, drawn).any()
    assert len(drawn) < 100 and candidate[drawn].all() and drawn.max() > 600  # not the first ids alone
    assert (vectors[left_out] @ vectors[drawn].T).max(1).min() >= index_module.NEAR_COPY
    few, theirs = index_module.held_back_with_copies(ids, vectors, candidate, index_module.NEAR_COPY, 5)  # as many as the check draws
    assert len(few) == 5 and len(theirs) < len(left_out) and (vectors[theirs] @ vectors[few].T).max(1).min() >= index_module.NEAR_COPY


def build_inputs(vectors: np.ndarray):
    """A store's `sample` (ids, vectors, the recall check's candidates: here the ids `held_back` names) and `rows`."""
    ids = np.arange(1, len(vectors) + 1)
    return (lambda n: (ids[:n], vectors[:n], ids[index_module.held_back(ids)])), (lambda: iter([(ids, vectors)]))


def test_open_index_loads_a_current_file_and_rebuilds_a_stale_one(tmp_path):
    config = IndexConfig("HNSW16", "", tmp_path)
    vectors = unit(60)
    sample, rows = build_inputs(vectors)
    built, loaded = open_index(config, 16, "a" * 64, 60, lambda m: True, sample, rows)
    assert loaded is None and built.size == 60
    save_index(config, built, "a" * 64, {"faces": 60})
    again, loaded = open_index(
        config, 16, "a" * 64, 60, lambda m: m["faces"] == 60, sample, lambda: pytest.fail("a current file is loaded, not rebuilt")
    )
    assert loaded is not None and again.size == 60
    _, fresh = open_index(config, 16, "a" * 64, 61, lambda m: m["faces"] == 61, sample, rows)
    assert fresh is None  # stale: rebuilt
    _, other = open_index(config, 16, "b" * 64, 60, lambda m: True, sample, rows)
    assert other is None  # another embedder's file is never used
    config.path("a" * 64).with_name(read_meta(config.path("a" * 64))["file"]).write_bytes(b"truncated")
    damaged, loaded = open_index(config, 16, "a" * 64, 60, lambda m: True, sample, rows)
    assert loaded is None and damaged.size == 60


def test_an_ivf_index_stays_exact_until_there_are_enough_faces_to_train(tmp_path):
    config = IndexConfig("IVF8,Flat", "nprobe=2", tmp_path)
    few = unit(100)
    index, _ = open_index(config, 16, "a" * 64, len(few), lambda m: True, *build_inputs(few))
    assert index.describe()["backend"] == "faiss-flat" and index.size == 100
    many = unit(8 * 39, seed=3)
    index, _ = open_index(config, 16, "a" * 64, len(many), lambda m: True, *build_inputs(many))
    assert index.describe()["backend"] == "faiss-ivf" and index.is_trained and index.size == len(many)


def test_candidates_are_rescored_from_the_stored_embeddings():
    """An approximate index's own scores (PQ codes here) never reach a decision: each candidate's
    similarity is the stored embedding's dot product with the query."""
    vectors = unit(2000)
    index = FaissIndex(16, "IVF4,SQ4", "nprobe=4")
    index.train(np.arange(2000), vectors, NO_CANDIDATES)
    index.add(np.arange(2000), vectors)
    query = unit(1, seed=9)[0]
    approx, _ = index.search(query, 16)
    stored = {i: (f"s{i}", f"n{i}", vectors[i]) for i in range(2000)}
    found = best_subjects(index, query, 5, lambda ids: {i: stored[i] for i in ids})
    for c in found:
        assert c.similarity == pytest.approx(float(vectors[c.face_id] @ query), abs=1e-6)
    assert [c.similarity for c in found] == sorted((c.similarity for c in found), reverse=True)
    assert not np.allclose(sorted(approx[0], reverse=True)[:5], [c.similarity for c in found], atol=1e-4)  # 4-bit codes: estimates differ


def test_a_bad_factory_string_is_a_clear_start_up_error(tmp_path):
    with pytest.raises(ValueError, match="Flat, HNSW"):
        open_index(IndexConfig("LSH", "", tmp_path), 16, "a" * 64, 0, lambda m: True, *build_inputs(unit(1)))
    with pytest.raises(ValueError, match="FACEGATE_INDEX='IVF4,PQ3'"):  # 3 sub-quantizers do not divide 16 dimensions
        open_index(IndexConfig("IVF4,PQ3", "", tmp_path), 16, "a" * 64, 0, lambda m: True, *build_inputs(unit(1)))


class _CountingCondition(threading.Condition):
    """A condition that counts the threads waiting on it: the lock's state, observed instead of timed."""

    waiting = 0

    def wait(self, timeout=None):
        self.waiting += 1
        try:
            return super().wait(timeout)
        finally:
            self.waiting -= 1


def test_searches_share_the_lock_and_a_write_waits_for_them():
    lock = ReadWriteLock()
    lock._cond = cond = _CountingCondition()
    order = []

    def hold(mode, what):
        with getattr(lock, mode)():
            order.append(what)

    with lock.read():
        with lock.read():  # a second search does not wait for the first
            order.append("two readers")
        writer = threading.Thread(target=hold, args=("write", "writer"), daemon=True)
        writer.start()
        wait_until(lambda: cond.waiting == 1, "the writer waiting for the search")
        late = threading.Thread(target=hold, args=("read", "late reader"), daemon=True)  # queued behind the waiting writer
        late.start()
        wait_until(lambda: cond.waiting == 2 or not late.is_alive(), "the late reader waiting, or through")
        assert writer.is_alive() and late.is_alive() and order == ["two readers"]
    writer.join(30)
    late.join(30)
    assert order == ["two readers", "writer", "late reader"]


def test_a_search_in_any_thread_uses_the_configured_openmp_threads(monkeypatch):
    """OpenMP keeps its thread count per thread: set once at start-up, the searches that requests
    run on other threads fanned out over every core (16 worker processes' at once on a GPU host)."""
    from service.gallery import index as index_module

    monkeypatch.setattr(index_module, "_search_threads", 0)
    before = faiss.omp_get_max_threads()
    index_module.set_search_threads(1)
    try:
        index = FaissIndex(16)
        index.add(np.arange(50), unit(50))
        seen = []

        def search_in_a_new_thread():
            fresh = faiss.omp_get_max_threads()
            index.search(unit(1, seed=3), 5)
            seen.append((fresh, faiss.omp_get_max_threads()))

        thread = threading.Thread(target=search_in_a_new_thread)
        thread.start()
        thread.join(10)
        assert seen == [(seen[0][0], 1)]
        if before > 1:  # what the bug looked like: a new thread starts at OpenMP's default, not at the setting
            assert seen[0][0] == before
    finally:
        index_module.set_search_threads(before)


def test_processes_saving_one_index_at_once_leave_one_file(tmp_path):
    """Workers that save the same persisted index at once (each at its own shutdown) take turns under
    its file lock: the folder ends with the metadata and the one data file it names, no orphan."""
    config = IndexConfig("HNSW16", "", tmp_path)
    indexes = []
    for seed in range(6):
        index = FaissIndex(16, "HNSW16")
        index.add(np.arange(200), unit(200, seed=seed))
        indexes.append(index)
    start = threading.Barrier(len(indexes))

    def save(i: int) -> None:
        start.wait()
        for turn in range(4):
            indexes[i].dirty = True
            save_index(config, indexes[i], "a" * 64, {"faces": [i, turn]})

    threads = [threading.Thread(target=save, args=(i,)) for i in range(len(indexes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    meta = read_meta(config.path("a" * 64))
    assert sorted(p.name for p in tmp_path.glob("*.faiss")) == [meta["file"]]
    assert not list(tmp_path.glob(".*"))  # no temporary left
    assert FaissIndex.load(config.path("a" * 64), meta, "").size == 200


def test_a_state_saved_already_is_not_written_again(tmp_path):
    """The second worker to shut down holds what the first saved: it writes nothing."""
    config = IndexConfig("HNSW16", "", tmp_path)
    first, second = FaissIndex(16, "HNSW16"), FaissIndex(16, "HNSW16")
    for index in (first, second):
        index.add(np.arange(20), unit(20))
    save_index(config, first, "a" * 64, {"faces": [20, 19, 190]})
    written = read_meta(config.path("a" * 64))["file"]
    save_index(config, second, "a" * 64, {"faces": [20, 19, 190]})
    assert read_meta(config.path("a" * 64))["file"] == written and second.dirty


def saved(tmp_path, spec: str, params: str, vectors: np.ndarray) -> tuple[IndexConfig, dict]:
    """An index of `vectors` (ids 1000…) saved as a worker saves it: its config and metadata."""
    config = IndexConfig(spec, params, tmp_path)
    index = FaissIndex(16, spec, params)
    if not index.is_trained:
        index.train(np.arange(1000, 1000 + len(vectors)), vectors, NO_CANDIDATES)
    index.add(np.arange(1000, 1000 + len(vectors)), vectors)
    save_index(config, index, "a" * 64, {"faces": [len(vectors)]})
    return config, read_meta(config.path("a" * 64))


def mappings(path, pid="self") -> list[dict[str, str]]:
    """The mappings of `path` in a process's /proc/PID/smaps: their permissions and fields (kB)."""
    found, current = [], None
    for line in open(f"/proc/{pid}/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:
            current = {"perms": fields[1]} if len(fields) >= 6 and fields[5] == str(path) else None
            if current is not None:
                found.append(current)
        elif current is not None and fields[0].endswith(":") and len(fields) >= 2:
            current[fields[0][:-1]] = fields[1]
    return found


CHILD = """
import sys, time
import numpy as np
from service.gallery.index import FaissIndex, read_meta
from pathlib import Path
path = Path(sys.argv[1])
index = FaissIndex.load(path, read_meta(path), sys.argv[2])
index.search(np.load(sys.argv[3]), index.size)
print("searched", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(("spec", "params"), [("HNSW16", "efSearch=2000"), ("IVF4,Flat", "nprobe=4")])
def test_a_saved_index_is_mapped_read_only_and_its_pages_shared_by_the_processes_that_load_it(tmp_path, spec, params):
    """Issue 44: every worker of a host maps the saved HNSW or IVF file (one copy in the page cache),
    never reads it into memory of its own: a second process searching it shares the pages the first
    touched (its PSS of the file below its RSS)."""
    if not Path("/proc/self/smaps").exists():
        need("LINUX_ROOT", "memory is read from /proc (Linux)")
    vectors = unit(2000)
    config, meta = saved(tmp_path, spec, params, vectors)
    data = config.path("a" * 64).with_name(meta["file"])
    index = FaissIndex.load(config.path("a" * 64), meta, params)
    index.search(vectors[:50], index.size)
    mine = mappings(data)
    assert [m["perms"] for m in mine] == ["r--s"]  # shared, and never written
    assert int(mine[0]["Rss"]) >= data.stat().st_size // 1024 // 2  # searched where it lies, not copied
    np.save(tmp_path / "queries.npy", vectors[:50])
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(config.path("a" * 64)), params, str(tmp_path / "queries.npy")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "searched"
        theirs = mappings(data, child.pid)
        assert [m["perms"] for m in theirs] == ["r--s"]
        assert int(theirs[0]["Shared_Clean"]) + int(theirs[0]["Shared_Dirty"]) > 0
        assert int(theirs[0]["Pss"]) < int(theirs[0]["Rss"])
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("spec", "params"), [("HNSW16", "efSearch=2000"), ("HNSW16,SQ8", "efSearch=2000"), ("IVF4,Flat", "nprobe=4")])
def test_faces_added_and_removed_after_the_map_are_searched_as_a_flat_index_would(tmp_path, spec, params):
    """The mapped file is never written: faces added since go to the index's own flat part, removed
    ones are skipped while searching; the answers are a flat index's over the same faces (the search
    wide enough to be exhaustive), before and after the merged state is saved and mapped again."""
    vectors, more = unit(600), unit(80, seed=7)
    config, meta = saved(tmp_path, spec, params, vectors)
    path = config.path("a" * 64)
    data = path.with_name(meta["file"])
    before = data.read_bytes()
    index = FaissIndex.load(path, meta, params)
    assert isinstance(index.base, MappedIndex)  # the saved file, not a copy of this process's
    index.add(np.arange(5000, 5080), more)
    gone = np.r_[np.arange(1000, 1090), np.arange(5000, 5010)]
    assert index.remove(gone) == 100 and index.size == 580
    flat = FaissIndex(16)
    flat.add(np.arange(1000, 1600), vectors)
    flat.add(np.arange(5000, 5080), more)
    flat.remove(gone)
    queries = np.r_[vectors[:120], more[:30]]

    def same_answers(searched: FaissIndex) -> None:
        expected_scores, expected = flat.search(queries, 20)
        scores, found = searched.search(queries, 20)
        assert not np.isin(found, gone).any()
        if spec.endswith("SQ8"):  # codes: the best face found from them, but for the quantizer's error (16-d here)
            assert (found[:, 0] == expected[:, 0]).mean() > 0.9
        else:
            np.testing.assert_array_equal(found, expected)
            np.testing.assert_allclose(scores, expected_scores, atol=1e-5)

    same_answers(index)
    assert data.read_bytes() == before
    save_index(config, index, "a" * 64, {"faces": [580]})
    again = FaissIndex.load(path, read_meta(path), params)
    assert again.size == 580 and sorted(again.sample_ids(1000, np.random.default_rng(0))) == sorted(
        np.setdiff1d(np.r_[np.arange(1000, 1600), np.arange(5000, 5080)], gone)
    )
    same_answers(again)


def test_the_recall_check_tunes_widens_and_hides_faces_in_the_mapped_index(tmp_path):
    """tune and widen set the mapped graph's efSearch (what it searches with); a face hidden for the
    check is hidden in a copy, the mapped file untouched, with the faces added since searched beside
    it: the answers of the graph it was saved from, searched hiding the same faces."""
    vectors, more = unit(300), unit(20, seed=3)
    config, meta = saved(tmp_path, "HNSW16", "", vectors)
    index = FaissIndex.load(config.path("a" * 64), meta, "")
    hnsw = faiss.downcast_index(index._searched.index).hnsw
    assert index.tune() == "efSearch=64" and hnsw.efSearch == 64
    assert index.widen() == "efSearch=128" and hnsw.efSearch == 128
    index.widen(), index.widen()  # 512: every face of 320 reached
    private = FaissIndex(16, "HNSW16", "efSearch=512")
    for searched in (index, private):
        if searched is private:
            searched.add(np.arange(1000, 1300), vectors)
        searched.add(np.arange(7000, 7020), more)
        searched.remove(np.array([1001, 7001]))
    before = config.path("a" * 64).with_name(meta["file"]).read_bytes()
    queries, hidden = np.r_[vectors[:30], more[:10]], np.r_[np.arange(1000, 1030), np.arange(7000, 7010)]
    found = index.search_hiding(queries, 8, hidden)
    np.testing.assert_array_equal(found, private.search_hiding(queries, 8, hidden))
    assert not np.isin(found, [1001, 7001]).any() and not (found == hidden[:, None]).any()
    fresh, plain = FaissIndex.load(config.path("a" * 64), meta, "efSearch=512"), FaissIndex(16, "HNSW16", "efSearch=512")
    plain.add(np.arange(1000, 1300), vectors)
    alone = fresh.search_hiding(vectors[:5], 8, hidden[:5])  # nothing added since: the graph's answers alone
    assert alone is not None and alone.dtype == np.int64
    np.testing.assert_array_equal(alone, plain.search_hiding(vectors[:5], 8, hidden[:5]))
    assert config.path("a" * 64).with_name(meta["file"]).read_bytes() == before


def anonymous_kib() -> int:
    """This process's resident anonymous memory (RssAnon): its heap and its private pages."""
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon:"))


def test_the_check_hides_faces_in_the_mapped_graph_without_a_copy_of_the_file(tmp_path, monkeypatch):
    """A face hidden for the recall check is zeroed in a copy-on-write mapping of the graph's file,
    not in a copy read into the process (the file's size, 755 MiB at 1M faces, in every worker at
    once): while the hidden graph lives, the process's anonymous memory has grown by the pages of the
    faces hidden and the graph's small arrays, well below the file's size."""
    if not Path("/proc/self/status").exists():
        need("LINUX_ROOT", "memory is read from /proc (Linux)")
    vectors = unit(40_000, 64)  # a 15 MiB file: the graph's own arrays (ids, levels) under 1 MiB
    config = IndexConfig("HNSW16", "", tmp_path)
    built = FaissIndex(64, "HNSW16")
    built.add(np.arange(1000, 41_000), vectors)
    save_index(config, built, "a" * 64, {"faces": [40_000]})
    del built
    release_freed()  # the build's heap given back: a copy of the file would not reuse it unseen
    meta = read_meta(config.path("a" * 64))
    file_kib = (tmp_path / meta["file"]).stat().st_size // 1024
    index = FaissIndex.load(config.path("a" * 64), meta, "efSearch=64")
    queries, hidden = vectors[:20], np.arange(1000, 1020)
    index.search(queries, 9)
    hiding, inside = index_module.hiding, []

    def measured(*args, **kwargs):
        found = hiding(*args, **kwargs)
        inside.append(anonymous_kib())  # the hidden graph still lives
        return found

    monkeypatch.setattr(index_module, "hiding", measured)
    before = anonymous_kib()
    found = index.search_hiding(queries, 8, hidden)
    assert found is not None and not (found == hidden[:, None]).any() and (found >= 0).all()
    assert inside[0] - before < file_kib // 4, (inside[0] - before, file_kib)


def test_workers_saving_their_mapped_index_at_once_leave_one_consistent_file(tmp_path):
    """Workers that map one file and each added faces of their own save in turn under the file lock:
    one data file is left, and it holds the saved faces and one worker's additions, whole."""
    config, meta = saved(tmp_path, "HNSW16", "efSearch=500", unit(300))
    path = config.path("a" * 64)
    workers = [FaissIndex.load(path, meta, "efSearch=500") for _ in range(5)]
    assert all(isinstance(index.base, MappedIndex) for index in workers)
    added = [unit(40, seed=10 + i) for i in range(len(workers))]
    for i, index in enumerate(workers):
        index.add(np.arange(10_000 * (i + 1), 10_000 * (i + 1) + 40), added[i])
        index.remove(np.array([1000 + i]))
    start = threading.Barrier(len(workers))

    def save(i: int) -> None:
        start.wait()
        save_index(config, workers[i], "a" * 64, {"faces": [i]})

    threads = [threading.Thread(target=save, args=(i,)) for i in range(len(workers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    meta = read_meta(path)
    assert sorted(p.name for p in tmp_path.glob("*.faiss")) == [meta["file"]]
    assert not list(tmp_path.glob(".*"))
    won = meta["faces"][0]
    saved_index = FaissIndex.load(path, meta, "efSearch=500")
    assert saved_index.size == 339 and meta["removed"] == [1000 + won]
    _, ids = saved_index.search(added[won], 1)
    assert (ids[:, 0] == np.arange(10_000 * (won + 1), 10_000 * (won + 1) + 40)).all()
