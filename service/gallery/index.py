"""Nearest-neighbour search over enrolled embeddings, behind a small interface so another engine
(IVF, HNSW, a vector database) can replace the exact in-memory FAISS index later."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import faiss
import numpy as np

from service.gallery.interface import Candidate


def set_search_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the whole process. One is the service's default: requests
    already search in parallel, and OpenMP workers spinning beside onnxruntime's on a small CPU
    made a single 10k-face search 50× slower (benchmarks/search.py --threads)."""
    faiss.omp_set_num_threads(threads)


class VectorIndex(Protocol):
    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None: ...

    def remove(self, ids: np.ndarray) -> int: ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Q×k cosine scores and ids, best first; missing neighbours have id -1."""
        ...

    @property
    def size(self) -> int: ...


class FaissIndex:
    """Exact inner-product search (= cosine on unit vectors) with int64 ids = SQLite face row ids.

    FAISS indexes are not safe for concurrent writes and reads, so one lock serializes them.
    """

    def __init__(self, dim: int):
        self.dim = dim
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._lock = threading.Lock()

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        with self._lock:
            self._index.add_with_ids(vectors, ids)

    def remove(self, ids: np.ndarray) -> int:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0:
            return 0
        with self._lock:
            return int(self._index.remove_ids(ids))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        with self._lock:
            k = min(k, self._index.ntotal)
            if k <= 0:
                return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
            return self._index.search(queries, k)

    @property
    def size(self) -> int:
        return int(self._index.ntotal)


def best_subjects(index: VectorIndex, query: np.ndarray, top_k: int, owners: Callable[[list[int]], dict[int, tuple[str, str]]]) -> list[Candidate]:
    """The top_k subjects by their best face's similarity, best first; each subject once.

    The index ranks faces, so it is asked for more neighbours until top_k distinct subjects are
    found or the whole index has been seen. `owners` maps face ids to (subject id, name) as the
    store has them now: faces it no longer has (deleted meanwhile) are dropped.
    """
    k = max(4 * top_k, 16)
    while True:
        size = index.size
        scores, ids = index.search(query[None], min(k, size))
        owner_of = owners([int(i) for i in ids[0] if i >= 0])
        best: dict[str, Candidate] = {}
        for score, face_id in zip(scores[0], ids[0]):
            owner = owner_of.get(int(face_id))
            if owner and owner[0] not in best:
                best[owner[0]] = Candidate(owner[0], owner[1], float(score), int(face_id))
        if len(best) >= top_k or k >= size:
            return list(best.values())[:top_k]
        k *= 4
