"""The FAISS index behind the VectorIndex interface: ids are the caller's, removal is exact."""

import numpy as np

from service.gallery.index import FaissIndex


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
