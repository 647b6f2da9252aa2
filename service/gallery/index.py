"""Nearest-neighbour search over enrolled embeddings: FAISS in this process (exact flat by default,
or an approximate index that FACEGATE_INDEX names by FAISS's own factory string), or a shared
vector database (milvus.py), behind one small `VectorIndex` interface.

An approximate index only proposes candidates: `best_subjects` scores every proposed face again
against the embedding the store holds, so the similarity a decision compares with its threshold is
the exact one, as the flat index would give it for that face.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np
from filelock import FileLock

from service.core.fileio import replacing, write_atomically
from service.core.models.manifest import Manifest
from service.core.settings import Settings
from service.gallery.interface import Candidate

log = logging.getLogger("facegate.gallery.index")

MIN_TRAIN_PER_LIST = 39  # FAISS's k-means wants at least this many points per IVF list
MAX_TRAIN_PER_LIST = 64  # training k-means on more costs minutes at start-up for little recall (FAISS's own cap is 256)
MIN_TRAIN_OTHER = 10_000  # a quantizer outside IVF (HNSW32,SQ8) trains on this many faces, at most 10 ×
REBUILD_REMOVED_FRACTION = 0.2  # an HNSW graph with this share of removed faces is rebuilt at start-up
CANDIDATES = 16  # faces a search asks the index for at least (/identify at top_k=1): max(4 × top_k, 16)
TARGET_RECALL = 0.99  # recall@1 the default search parameters aim at (docs/scaling.md: the benchmark behind them)
MAX_EF_SEARCH = 4096  # the widest efSearch the recall check widens to (8 × the default at 1M faces)
# One face in HELD_BACK (id % HELD_BACK == HELD_BACK - 1): the recall check's faces where an index
# names none of its own (an IVF file saved before `check_faces`, none of them trained on: trained on
# them, IVF1024 at nprobe 1 over-reported by 0.035 on 100k faces, docs/benchmarks.md), and those an
# HNSW graph sets aside once built (faces enrolled since). A store's stride sample leaves them out.
HELD_BACK = 8
# An HNSW graph keeps up to ASIDE faces out of the graph (the store's candidates while it is built, a
# face of each of as many people: sqlite.py CHECK_CANDIDATES), searched flat beside it on every
# search (4,096: 55 µs a query at 128-d): the recall check's faces are then new to the graph as a new
# photo is, which no face in a graph can be made to be (hidden or kept, it shaped its neighbours'
# links: the check read 0.035 low or high of what new photos find, docs/benchmarks.md)
ASIDE = 4096
# The cosine at which an enrolled face counts as a copy of a held-out one where the embedder's manifest
# names none (its `near_copy`, benchmarks/near_copy.py); this one is dlib-resnet-v1's (80 % of the
# mirror images and 85-100 % crops of a training crop reach it; of two LFW photos of one person 4.4 %,
# of the training identities' 1.9 %: such a pair is left out with the face, its best the next photo).
# The 99.9th percentile of same-person pairs (0.989) would miss half the copies (their median: 0.985).
NEAR_COPY = 0.975
# As many of a training sample's candidates as the recall check draws (FACEGATE_INDEX_RECALL_SAMPLE:
# the store's sample brings a face of each of up to ASIDE subjects with another face, from all over the
# gallery, sqlite.py's CHECK_CANDIDATES) are held back with their near copies (a mirror image, a re-crop enrolled
# again), the check's faces (`check_faces`): trained on a face's copies, a list's centroid sits on the
# face the check then searches, as no new photo's does (IVF1024 at nprobe 1 over-reported by 0.035
# over six k-means seeds on 100k faces with four copies of each), and every further face held back
# so takes its copies' weight from the lists around the faces the check draws (with 4,096 of them
# there, it under-reported by 0.02): docs/benchmarks.md, round 9. Copies take at most this share of
# the training.
COPIES_LEFT_OUT = 0.25
CHECK_SAMPLE: int = Settings.model_fields["index_recall_sample"].default  # IndexConfig.check_sample: the setting itself


_search_threads = 0  # FACEGATE_SEARCH_THREADS; 0: OpenMP's own default (every core)


def set_search_threads(threads: int) -> None:
    """FAISS's OpenMP threads for the searches of this process. One is the service's default:
    requests already search in parallel, and OpenMP workers spinning beside onnxruntime's on a small
    CPU made a single 10k-face search 50× slower (benchmarks/search.py --threads). OpenMP keeps the
    number per thread, so each search sets it again in the thread that runs it (`FaissIndex.search`):
    set once, a request thread's searches fanned out over every core, 16 worker processes' at once
    on a 16-core GPU host (docs/sizing.md)."""
    global _search_threads
    _search_threads = threads
    faiss.omp_set_num_threads(threads)


class VectorIndex(Protocol):
    shared: bool  # one index every replica writes and reads (Milvus), not this process's copy
    changes: int  # faces added or removed through this process since it opened (what paces the recall check)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None: ...

    def remove(self, ids: np.ndarray) -> int: ...

    def search(self, queries: np.ndarray, k: int, approximate: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Q×k cosine scores and ids, best first; missing neighbours have id -1. `approximate`: through
        the index even while its answers come from an exact copy (what the recall check measures)."""
        ...

    @property
    def size(self) -> int: ...

    @property
    def exact(self) -> bool:
        """Every search is exhaustive (flat): nothing for a recall check to measure."""
        ...

    def tune(self) -> Any:
        """Set the default search parameters for the gallery's size now, unless they were given."""
        ...

    def widen(self) -> Any:
        """Search wider than now (twice the efSearch or nprobe): the parameters now in force, or None
        where they cannot widen further."""
        ...

    @property
    def answers_exactly(self) -> bool:
        """Every answer is the exact one: searches are answered from an exact copy of the faces
        (`use_exact`), not the index, or the index is searched exhaustively (Milvus's IVF_FLAT at every list)."""
        ...

    def sample_ids(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Up to n distinct ids of faces in the index, at random."""
        ...

    def describe(self) -> dict[str, Any]:
        """What /readyz shows: backend (faiss-flat, faiss-hnsw, faiss-ivf, milvus), parameters, size."""
        ...


def index_kind(spec: str) -> str:
    """faiss-flat, faiss-hnsw or faiss-ivf for a factory string; ValueError for other families."""
    head = spec.split(",")[0].strip().upper()
    if head == "FLAT":
        return "faiss-flat"
    if head.startswith("HNSW"):
        return "faiss-hnsw"
    if head.startswith("IVF"):
        return "faiss-ivf"
    raise ValueError(f"FACEGATE_INDEX={spec!r}: facegate runs Flat, HNSW… and IVF… FAISS indexes")


def default_search_params(index: faiss.Index, size: int) -> str:
    """What FACEGATE_INDEX_SEARCH_PARAMS left empty means: the search parameters that reached
    TARGET_RECALL in benchmarks/gallery_ann.py for this kind of index at this gallery size (FAISS's
    own defaults, efSearch 16 and nprobe 1, lose 40–74 % of top-1 answers at 1M faces). IVF scans
    `nprobe` of its lists; HNSW keeps `efSearch` candidates while walking its graph."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return ivf_params(ivf, default_nprobe(ivf.nlist))
    if is_hnsw(index):
        return f"efSearch={default_ef_search(size)}"
    return ""


def ivf_params(ivf: faiss.IndexIVF, nprobe: int) -> str:
    """`nprobe` lists, and the candidates an HNSW quantizer keeps to find them."""
    hnsw_quantizer = isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW)
    return f"nprobe={nprobe}" + (f",quantizer_efSearch={max(2 * nprobe, 64)}" if hnsw_quantizer else "")


def is_hnsw(index: faiss.Index) -> bool:
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    return isinstance(inner, faiss.IndexHNSW)


def wider_params(index: faiss.Index) -> str | None:
    """Twice the lists (IVF, up to every list) or candidates (HNSW, up to MAX_EF_SEARCH) the index
    searches now; None where it searches them all already."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return None if ivf.nprobe >= ivf.nlist else ivf_params(ivf, min(2 * ivf.nprobe, ivf.nlist))
    if is_hnsw(index):
        ef = int(faiss.downcast_index(index.index).hnsw.efSearch)  # type: ignore[attr-defined]  # an IndexIDMap: the stubs type it a bare Index
        return None if ef >= MAX_EF_SEARCH else f"efSearch={min(2 * ef, MAX_EF_SEARCH)}"
    return None


def default_nprobe(nlist: int) -> int:
    """IVF lists to scan: ¾ × nlist^¾ (48 of 256, 136 of 1,024, 384 of 4,096). On the benchmark's
    Gaussian gallery (128-d) recall@1 reached 0.99 at about 38 of 256 lists, 100–122 of 1,024 and
    245–320 of 4,096, the same at 100k, 300k and 1M faces (and fewer of 4,096 at 10M): it grows
    with the number of lists, the gallery's size only through the lists one chooses for it."""
    return min(nlist, math.ceil(0.75 * nlist**0.75))


def default_ef_search(size: int) -> int:
    """HNSW candidates kept while searching: ½ × √faces, at least 64 (159 at 100k, 274 at 300k, 500
    at 1M). On the benchmark's Gaussian gallery HNSW32 reached recall@1 0.99 at efSearch about 60 at
    100k faces, 220 at 300k and 450 at 1M: a graph's recall falls as it grows."""
    return max(64, math.ceil(0.5 * math.sqrt(size)))


def held_back(ids: np.ndarray) -> np.ndarray:
    """Which of these face ids HELD_BACK names (the recall check's where an index names no faces of its own)."""
    return np.asarray(ids, np.int64) % HELD_BACK == HELD_BACK - 1


def near_copy_of(manifest: Manifest | None) -> float:
    """The embedder's cosine from which one enrolled face is a near copy of another (NEAR_COPY where its manifest names none)."""
    return manifest.near_copy.cosine if manifest is not None and manifest.near_copy is not None else NEAR_COPY


def held_back_with_copies(
    ids: np.ndarray, vectors: np.ndarray, candidate: np.ndarray, near_copy: float, faces: int
) -> tuple[np.ndarray, np.ndarray]:
    """Of a training sample, `faces` of its `candidate` rows at random, held back with their near
    copies among the other rows (`near_copy` or more to one), as many as the copies' budget
    (COPIES_LEFT_OUT of the training) allows: their ids and the rows of their copies."""
    held = np.flatnonzero(candidate)
    held = held[np.random.default_rng(0).permutation(len(held))][:faces]
    rows = np.setdiff1d(np.arange(len(ids)), held)
    if len(held) == 0 or len(rows) == 0:
        return ids[held], np.zeros(0, np.int64)
    pool = faiss.IndexFlatIP(vectors.shape[1])
    pool.add(vectors[held])
    scores, nearest = pool.search(vectors[rows], 1)  # a copy of two held-back faces counts for its nearest
    copy = scores[:, 0] >= near_copy
    of = nearest[copy, 0]
    taken = int(np.searchsorted(np.cumsum(np.bincount(of, minlength=len(held))), COPIES_LEFT_OUT * len(rows), side="right"))
    return ids[held[:taken]], rows[copy][of < taken]


def train_size(spec: str, dim: int) -> int:
    """Vectors the index needs before it can be trained (0: needs no training)."""
    probe = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    if probe.is_trained:
        return 0
    ivf = faiss.try_extract_index_ivf(probe)
    return MIN_TRAIN_PER_LIST * ivf.nlist if ivf is not None else MIN_TRAIN_OTHER


class ReadWriteLock:
    """Many readers at once, or one writer; a waiting writer goes before new readers (so a stream
    of searches cannot starve an enrollment)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writing and not self._readers)
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class MappedIds:
    """The ids of the faces a host's processes share mapped read-only, as saved: a face removed since
    is masked here, never written there (`dead`: nodes of a saved HNSW graph that are no face and
    no removed id, those of an id added again)."""

    def __init__(self, ids: np.ndarray, removed: Iterable[int] = (), dead: int = 0):
        self.ids = ids
        self._sorted = np.sort(ids)  # its own: which ids are here, without a set of every face
        self.removed: set[int] = set(removed)
        self.dead = dead

    @property
    def size(self) -> int:
        return len(self.ids) - len(self.removed) - self.dead

    def remove(self, ids: np.ndarray) -> int:
        at = np.clip(np.searchsorted(self._sorted, ids), 0, max(len(self._sorted) - 1, 0))
        held = set(ids[self._sorted[at] == ids].tolist()) - self.removed if len(self._sorted) else set()
        self.removed |= held
        return len(held)

    def removed_ids(self) -> np.ndarray:
        return np.fromiter(self.removed, np.int64, len(self.removed))

    def sample(self) -> np.ndarray:
        return np.setdiff1d(self.ids, self.removed_ids())


class MappedFaces(MappedIds):
    """A flat index's faces as of a snapshot that every worker of the host maps (snapshot.py):
    searched in place (`faiss.knn` over the mapped rows: nothing copied, one copy per host in the
    page cache), never written. A face removed since is masked; one added goes to the index's own flat part."""

    def __init__(self, ids: np.ndarray, vectors: np.ndarray):
        super().__init__(ids)
        self.vectors = vectors

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each query's k best faces here (−inf and −1 where there are fewer), asking for as many
        more as are masked."""
        take = min(k + len(self.removed), len(self.ids))
        if take <= 0:
            return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
        scores, rows = faiss.knn(queries, self.vectors, take, metric=faiss.METRIC_INNER_PRODUCT)
        found = np.where(rows >= 0, self.ids[np.maximum(rows, 0)], -1)
        if self.removed:
            found[np.isin(found, self.removed_ids())] = -1
        return np.where(found >= 0, scores, -np.inf).astype(np.float32), found


class MappedIndex(MappedIds):
    """An HNSW or IVF index's saved file, memory-mapped read-only by every process of the host that
    opens it (FAISS's IO_FLAG_MMAP_IFC: the graph's links and vectors, or the inverted lists, stay
    in the page cache, one copy per host; FAISS 1.15 aborts on an add to such an index, so it is
    never written). A face removed since is skipped while searching (an IDSelector); one added goes
    to the index's own flat part, and both are merged into the file it saves (`FaissIndex.save`)."""

    def __init__(self, file: Path, removed: Iterable[int] = (), dead: int = 0):
        self._fd = os.open(file, os.O_RDONLY)  # what `private_copy` and `copy_on_write` read once another save unlinked the file
        weakref.finalize(self, os.close, self._fd)
        self.index = faiss.read_index(str(file), faiss.IO_FLAG_MMAP_IFC)
        self.ivf = faiss.try_extract_index_ivf(self.index)
        removed = set(removed)
        super().__init__(stored_ids(self.index), removed, dead - len(removed))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.removed:
            return self.index.search(queries, k)
        return self.index.search(queries, k, params=skipping(self.index, self.removed_ids()))  # type: ignore[call-arg]

    def private_copy(self) -> faiss.Index:
        """The saved index read into this process's memory: what a save adds to and removes from."""
        offset = 0

        def read(size: int) -> bytes:
            nonlocal offset
            chunk = os.pread(self._fd, size, offset)
            offset += len(chunk)
            return chunk

        return faiss.read_index(faiss.PyCallbackIOReader(read))  # type: ignore[attr-defined]  # the stubs lack the callback reader

    @contextmanager
    def copy_on_write(self) -> Iterator[faiss.Index]:
        """The saved index over a private copy-on-write mapping of its file (MAP_PRIVATE, read by
        FAISS in place: its vectors and links are the mapping's pages), valid inside the block: a
        vector written copies its one page into this process, never the file nor another process's
        pages. What the recall check hides a face in, rather than `private_copy` (the file's size)."""
        size = os.fstat(self._fd).st_size
        pages = np.frombuffer(mmap.mmap(self._fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE), np.uint8)
        yield faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(pages), size))  # type: ignore[attr-defined]  # not in the stubs


def stored_ids(index: faiss.Index) -> np.ndarray:
    """The ids of every vector an index holds (an IVF index's lists one after the other)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return faiss.vector_to_array(index.id_map)  # type: ignore[attr-defined]  # an IndexIDMap: the stubs type it a bare Index
    invlists: Any = ivf.invlists  # the stubs allow None, which an IVF index never has
    lists = [faiss.rev_swig_ptr(invlists.get_ids(i), invlists.list_size(i)).copy() for i in range(ivf.nlist) if invlists.list_size(i)]
    return np.concatenate(lists) if lists else np.empty(0, np.int64)


def skipping(index: faiss.Index, removed: np.ndarray) -> faiss.SearchParameters:
    """Search parameters that leave the `removed` ids out while searching (so k are found), at the
    efSearch or nprobe the index is set to."""
    selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(removed))
    ivf = faiss.try_extract_index_ivf(index)
    # faiss's stubs lack SearchParametersHNSW and SearchParametersIVF's keywords, and type downcast_index's IndexHNSW as a bare Index
    params: Any
    if ivf is not None:
        params = faiss.SearchParametersIVF(sel=selector, nprobe=ivf.nprobe)  # type: ignore[call-arg]
    elif isinstance(inner := faiss.downcast_index(index.index), faiss.IndexFlat):  # type: ignore[attr-defined]  # an IndexIDMap over the faces an HNSW graph keeps aside
        params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
    else:
        params = faiss.SearchParametersHNSW(sel=selector, efSearch=inner.hnsw.efSearch)  # type: ignore[attr-defined]
    params.keep_alive = removed  # the selector does not own the array
    return params


def hiding(
    graph: faiss.Index,
    removed: np.ndarray,
    queries: np.ndarray,
    k: int,
    hidden: np.ndarray,
    lock: Callable[[], Any],
) -> tuple[np.ndarray, np.ndarray] | None:
    """`FaissIndex.search_hiding` on `graph` (an IndexIDMap over an HNSW graph over flat vectors; each
    search under `lock()`): scores and ids (−inf and −1 past those found); None where its vectors are codes."""
    storage = faiss.downcast_index(faiss.downcast_index(graph.index).storage)  # type: ignore[attr-defined]  # an IndexIDMap over IndexHNSW
    if not isinstance(storage, faiss.IndexFlat):
        return None
    dim = storage.d
    with lock():
        id_map = faiss.vector_to_array(graph.id_map)  # type: ignore[attr-defined]  # an IndexIDMap: the stubs type it a bare Index
    hidden = hidden.reshape(len(queries), -1)
    scores, out = np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64)
    if not len(id_map):  # every face kept aside
        return scores, out
    order = np.argsort(id_map, kind="stable")
    nodes = order[np.clip(np.searchsorted(id_map[order], hidden, side="right") - 1, 0, None)]  # a re-added id's last node
    for row, (query, node, face) in enumerate(zip(queries, nodes, hidden, strict=True)):
        node = node[id_map[node] == face]  # the row's faces that are in the graph
        with lock():  # one search with vectors changed: nothing else reads the index meanwhile
            xb = faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * dim).reshape(-1, dim)
            kept = xb[node].copy()
            xb[node] = 0
            try:
                params = skipping(graph, removed) if len(removed) else None
                found_scores, found = graph.search(query[None], min(k, int(graph.ntotal)), params=params)  # type: ignore[call-arg]
                scores[row, : found.shape[1]], out[row, : found.shape[1]] = found_scores[0], found[0]
            finally:
                xb[node] = kept
    return scores, out


def best_of(k: int, *found: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The k best of several searches' (scores, ids) of the same queries (an id −1: none)."""
    scores, ids = np.concatenate([f[0] for f in found], axis=1), np.concatenate([f[1] for f in found], axis=1)
    order = np.argsort(np.where(ids >= 0, -scores, np.inf), axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


def flat_search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k best in a flat id-mapped index (as many as it holds, up to k; −inf where an id is −1)."""
    take = min(k, int(index.ntotal))
    if take <= 0:
        return np.full((len(queries), 0), -np.inf, np.float32), np.full((len(queries), 0), -1, np.int64)
    scores, ids = index.search(queries, take)
    return np.where(ids >= 0, scores, -np.inf).astype(np.float32), ids


class FaissIndex:
    """Inner-product search (= cosine on unit vectors) with int64 ids = the store's face ids.

    `spec` is a FAISS index factory string: "Flat" (exact), "HNSW32", "IVF4096,Flat",
    "IVF4096,PQ32"...; `search_params` FAISS's ParameterSpace string ("efSearch=128", "nprobe=32").
    An IVF index keeps the ids itself; the others are wrapped in an id map. HNSW cannot remove a
    vector, so a removed face is remembered and filtered out (and the graph rebuilt at start-up once
    too many are), and up to ASIDE of the recall check's faces (`held_back`) are kept out of the
    graph and searched flat beside it (`aside`). Searches run side by side; a write (not safe beside
    a search) runs alone. A loaded HNSW or IVF index is its saved file mapped (`MappedIndex`), never
    written: this index's own part is then a flat one with the faces added since (those bound for
    the aside among them in `_aside_added`).
    """

    shared = False  # this process's own copy

    def __init__(
        self,
        dim: int,
        spec: str = "Flat",
        search_params: str = "",
        built: faiss.Index | None = None,
        removed: Iterable[int] = (),
        dead: int = 0,
        base: MappedFaces | MappedIndex | None = None,
        held_back: bool = False,
        aside: faiss.Index | MappedIndex | None = None,
        check_faces: np.ndarray | None = None,
    ):
        """A new index, or (`built`) one read from a file with its removed ids and whether its
        training held back the recall check's faces. `search_params` empty: facegate's default for
        the index's kind and size, set by `tune`. `base`: what the host's workers share, searched
        beside this index's own faces: a flat index's faces as of a snapshot, or an HNSW or IVF
        index's mapped file (this index's own part then flat: the faces added since). `aside`: an HNSW
        graph's faces kept out of it, in memory or mapped (a new HNSW index starts an empty one; one
        loaded from a file saved without: none, and the recall check hides its faces instead)."""
        self.dim, self.spec = dim, spec
        self.requested_params = search_params  # FACEGATE_INDEX_SEARCH_PARAMS
        self.search_params = search_params  # in force
        self.kind = index_kind(spec)
        if base is not None and isinstance(base, MappedIndex) == (self.kind == "faiss-flat"):
            raise ValueError("a flat index searches mapped faces, an HNSW or IVF index its mapped file")
        inner: faiss.Index
        if isinstance(base, MappedIndex):
            inner = faiss.IndexFlatIP(dim)
        else:
            inner = built if built is not None else faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
        self._ivf = faiss.try_extract_index_ivf(inner) is not None
        self._removable = self._ivf or self.kind == "faiss-flat" or isinstance(base, MappedIndex)
        if built is not None:
            self._index = built
        else:
            self._index = inner if self._ivf else faiss.IndexIDMap2(inner) if self._removable else faiss.IndexIDMap(inner)
        self._removed: set[int] = set(removed)  # HNSW only: ids whose vector in the graph is no longer a face
        self._dead = dead  # HNSW only: graph nodes that are no longer faces (a re-added id leaves its old node behind)
        self.base = base
        self._searched = base.index if isinstance(base, MappedIndex) else self._index  # what the search parameters are set on
        if search_params:
            # faiss's stubs (1.15) list only the (name, value) overload, not this string one
            faiss.ParameterSpace().set_index_parameters(self._searched, search_params)  # type: ignore[arg-type]
        self.held_back = held_back  # trained without the faces `held_back` names (an index trained before HELD_BACK: on all)
        self.check_faces = check_faces  # of those, the ones trained without their near copies too (None: a file saved before)
        if aside is None and built is None and base is None and self.kind == "faiss-hnsw":
            aside = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self.aside = aside
        self.aside_for: np.ndarray | None = None  # while built: the faces the aside keeps (the store's candidates, a face per person)
        self._aside_added: set[int] = set()  # mapped: the faces added since that the aside keeps (in the own part until saved)
        self._lock = ReadWriteLock()
        self.dirty = False  # changed since it was built or loaded (save_index writes it then)
        self.changes = 0
        self.since_mapped = 0  # faces added or removed since its file was mapped (`remapped` maps a newer one)
        self.saved_as: tuple[Path, dict[str, Any]] | None = None  # a mapped file's metadata path and what names its model
        self.widened_from: str | None = None  # the parameters before the recall check widened them
        self._exact: faiss.IndexIDMap2 | None = None  # a flat copy searches are answered from (use_exact)
        self._journal: list[tuple[np.ndarray, np.ndarray | None]] | None = None  # writes while that copy is read from the store

    def tune(self) -> str | None:
        """Without FACEGATE_INDEX_SEARCH_PARAMS, set the default search parameters for the gallery's
        size now (at start-up, and as it grows: the recall check calls this); the parameters when
        they changed, else None."""
        if self.requested_params or self.widened_from is not None:  # given, or widened for a measured recall: kept
            return None
        params = default_search_params(self._searched, self.size)
        if params == self.search_params:
            return None
        self._set_params(params)
        return params

    def widen(self) -> str | None:
        """Twice the efSearch or nprobe in force (the recall check measured too low a recall@1 with
        them), whoever chose them; the parameters now, or None where the index searches all it can."""
        params = wider_params(self._searched)
        if params is None:
            return None
        if self.widened_from is None:
            self.widened_from = self.search_params
        self._set_params(params)
        return params

    def _set_params(self, params: str) -> None:
        with self._lock.write():  # not beside a search, which reads them
            # faiss's stubs (1.15) list only the (name, value) overload, not this string one
            faiss.ParameterSpace().set_index_parameters(self._searched, params)  # type: ignore[arg-type]
            self.search_params = params

    @property
    def answers_exactly(self) -> bool:
        return self._exact is not None

    def begin_exact(self) -> None:
        """From now on, remember every write, for `use_exact` to replay on a copy read from the store
        meanwhile (a face committed after its page was read, or deleted after it)."""
        with self._lock.write():
            self._journal = []

    def use_exact(self, pages: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
        """Answer searches from a flat copy of these faces (the store's `(ids, vectors)` pages, read
        since `begin_exact`), with the writes since replayed and kept in step, until `stop_exact`:
        every answer is then the flat index's, at a flat scan's cost and its memory (4 × dim bytes a face)."""
        flat = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
        for ids, vectors in pages:
            flat.add_with_ids(np.ascontiguousarray(vectors, np.float32).reshape(-1, self.dim), np.ascontiguousarray(ids, np.int64))  # type: ignore[call-arg]
        with self._lock.write():
            for written, added in self._journal or []:
                flat.remove_ids(written)  # type: ignore[arg-type]  # the Python wrapper's overload takes an id array
                if added is not None:
                    flat.add_with_ids(added, written)  # type: ignore[call-arg]
            self._exact, self._journal = flat, None

    def stop_exact(self) -> None:
        """Answer from the index again (its measured recall meets the minimum)."""
        with self._lock.write():
            self._exact, self._journal = None, None

    @property
    def is_trained(self) -> bool:
        return bool(self._searched.is_trained)

    def train(
        self, ids: np.ndarray, vectors: np.ndarray, candidates: np.ndarray, near_copy: float = NEAR_COPY, check_sample: int = CHECK_SAMPLE
    ) -> None:
        """Train on these faces but `check_sample` of the `candidates` (ids: the store's CHECK_CANDIDATES,
        a face per person) and their near copies (`near_copy` or more; `held_back_with_copies`): the
        faces the recall check draws (`check_faces`)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        drawn, copies = held_back_with_copies(ids, vectors, np.isin(ids, candidates), near_copy, check_sample)
        kept = ~np.isin(ids, drawn)
        kept[copies] = False
        with self._lock.write():
            self._index.train(vectors[kept])
            self.held_back, self.check_faces = True, drawn

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        with self._lock.write():
            graph = np.ones(len(ids), bool)
            if isinstance(self.aside, MappedIndex):  # mapped: every face to the own flat part, the aside's marked
                self._aside_added.difference_update(ids.tolist())
                self._aside_added.update(ids[self._goes_aside(ids)].tolist())
            elif self.aside is not None:
                self.aside.remove_ids(ids)  # type: ignore[arg-type]  # an id added again; the wrapper's overload takes an id array
                graph = ~self._goes_aside(ids)
                if not graph.all():
                    self.aside.add_with_ids(vectors[~graph], ids[~graph])  # type: ignore[call-arg]
            if graph.any():
                self._index.add_with_ids(vectors[graph], ids[graph])
            self._removed.difference_update(ids[graph].tolist())
            self.dirty = True
            self.changes += len(ids)
            self.since_mapped += len(ids)
            self._keep_exact(ids, vectors)

    def remove(self, ids: np.ndarray) -> int:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if len(ids) == 0:
            return 0
        with self._lock.write():
            self.dirty = True
            self.changes += len(ids)
            self.since_mapped += len(ids)
            self._keep_exact(ids, None)
            aside = 0
            if isinstance(self.aside, MappedIndex):
                aside = self.aside.remove(ids)
                self._aside_added.difference_update(ids.tolist())
            elif self.aside is not None:
                aside = int(self.aside.remove_ids(ids))  # type: ignore[arg-type]  # the wrapper's overload takes an id array
            # faiss's stubs type the index as a bare Index: it takes an id array (the Python wrapper's
            # overload), and an HNSW one here is an IndexIDMap, which has id_map
            if self._removable:
                return aside + int(self._index.remove_ids(ids)) + (self.base.remove(ids) if self.base is not None else 0)  # type: ignore[arg-type]
            held = ids[np.isin(ids, faiss.vector_to_array(self._index.id_map))]  # type: ignore[attr-defined]
            present = set(held.tolist()) - self._removed
            self._removed.update(present)
            self._dead += len(present)
            return aside + len(present)

    def _goes_aside(self, ids: np.ndarray) -> np.ndarray:
        """Which of these new faces the aside keeps, while it has room: the recall check's candidates
        while the index is built from its store (`aside_for`: a face per person), else those
        `held_back` names (faces enrolled since)."""
        room = ASIDE - self._aside_count()
        if self.aside is None or room <= 0:
            return np.zeros(len(ids), bool)
        keep = held_back(ids) if self.aside_for is None else np.isin(ids, self.aside_for)
        keep[np.flatnonzero(keep)[room:]] = False
        return keep

    def _aside_count(self) -> int:
        if isinstance(self.aside, MappedIndex):
            return self.aside.size + len(self._aside_added)
        return 0 if self._own_aside is None else int(self._own_aside.ntotal)

    @property
    def _own_aside(self) -> faiss.Index | None:
        """The aside in this process's memory (an index not mapped from a file)."""
        return None if isinstance(self.aside, MappedIndex) else self.aside

    def held_out_of(self, ids: np.ndarray) -> np.ndarray:
        """Which of these faces the index was made without, as without a new photo: kept out of its
        graph (HNSW's aside), or never in its training (IVF's lists or codes, `held_back`): the recall
        check's to draw. Every face where the index has neither (a flat one, an older file)."""
        if self.aside is not None:
            with self._lock.read():
                if isinstance(self.aside, MappedIndex):
                    kept = np.union1d(self.aside.sample(), np.fromiter(self._aside_added, np.int64, len(self._aside_added)))
                else:
                    kept = faiss.vector_to_array(self.aside.id_map)  # type: ignore[attr-defined]  # an IndexIDMap2
            return np.isin(ids, kept)
        if self.check_faces is not None:
            return np.isin(ids, self.check_faces)
        return held_back(ids) if self.held_back else np.ones(len(ids), bool)

    def _keep_exact(self, ids: np.ndarray, vectors: np.ndarray | None) -> None:
        """A write (vectors None: a removal) also to the exact copy, or remembered until it exists."""
        if self._journal is not None:
            self._journal.append((ids, vectors))
        if self._exact is not None:
            self._exact.remove_ids(ids)  # type: ignore[arg-type]  # the Python wrapper's overload takes an id array
            if vectors is not None:
                self._exact.add_with_ids(vectors, ids)  # type: ignore[call-arg]

    def search(self, queries: np.ndarray, k: int, approximate: bool = False) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        if _search_threads:
            faiss.omp_set_num_threads(_search_threads)  # OpenMP's count is per thread: this one's, as the process's
        with self._lock.read():  # FAISS searches are safe side by side and release the GIL
            k = min(k, self.size)
            if k <= 0:
                return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
            if self._exact is not None and not approximate:
                return self._exact.search(queries, k)
            if self.base is not None:
                return self._merged(queries, k)
            if not self._removed:
                found = self._index.search(queries, k)
            else:
                found = self._index.search(queries, k, params=skipping(self._index, self._removed_ids()))  # type: ignore[call-arg]
            return found if self._own_aside is None else best_of(k, found, flat_search(self._own_aside, queries, k))

    def _merged(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best of the mapped faces or index, its mapped aside, and this index's own (the faces added since)."""
        assert self.base is not None
        found = [self.base.search(queries, k), flat_search(self._index, queries, k)]
        if isinstance(self.aside, MappedIndex):
            found.append(self.aside.search(queries, k))
        return best_of(k, *found)

    def search_hiding(self, queries: np.ndarray, k: int, hidden: np.ndarray) -> np.ndarray | None:
        """Ids of each query's k neighbours found through an HNSW graph with the face `hidden[i]` (or
        the row of faces, -1 for none) out of the way: their vectors zeroed in the graph's flat storage for that one search (under the write
        lock, restored before it is released), so it neither answers nor draws the search to it, as a
        face that was never enrolled would not (a face the aside keeps is in no graph: only its near
        copies are hidden). None for other indexes (and an HNSW graph over codes), where a query's own
        vector has no such pull or cannot be hidden. A mapped graph is never written: it is hidden in
        a copy-on-write mapping of its file (a page per face hidden). The faces searched flat beside
        the graph (added since, kept aside) are searched without the row's."""
        if self.kind != "faiss-hnsw":
            return None
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        hidden = hidden.reshape(len(queries), -1)
        if _search_threads:
            faiss.omp_set_num_threads(_search_threads)
        wider = k + hidden.shape[1]  # room for the row's faces, left out below
        if not isinstance(self.base, MappedIndex):
            found = hiding(self._index, self._removed_ids(), queries, k, hidden, self._lock.write)
            with self._lock.read():
                beside = [] if self._own_aside is None else [flat_search(self._own_aside, queries, wider)]
        else:
            with self.base.copy_on_write() as graph:
                with self._lock.read():
                    removed = self.base.removed_ids()
                    if self.search_params:
                        faiss.ParameterSpace().set_index_parameters(graph, self.search_params)  # type: ignore[arg-type]  # the string overload
                    beside = [flat_search(self._index, queries, wider)]
                    if isinstance(self.aside, MappedIndex):
                        beside.append(self.aside.search(queries, wider))
                found = hiding(graph, removed, queries, k, hidden, nullcontext)
        if found is None:
            return None
        beside = [(np.where((ids[:, :, None] == hidden[:, None, :]).any(2), -np.inf, scores), ids) for scores, ids in beside]
        scores, ids = best_of(k, found, *beside)
        return np.where(np.isfinite(scores), ids, -1)

    def _removed_ids(self) -> np.ndarray:
        return np.fromiter(self._removed, np.int64, len(self._removed))

    @property
    def size(self) -> int:
        aside = 0 if self._own_aside is None else int(self._own_aside.ntotal)
        mapped = sum(part.size for part in (self.base, self.aside) if isinstance(part, MappedIds))
        return int(self._index.ntotal) - self._dead + aside + mapped

    @property
    def exact(self) -> bool:
        return self.kind == "faiss-flat"

    def sample_ids(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Ids at n distinct random places in the index (an IVF one's lists one after the other; a
        removed HNSW face drawn is left out), reading only the ids drawn."""
        if self.base is not None:  # flat: every id at hand
            with self._lock.read():
                parts = [self.base.sample(), faiss.vector_to_array(self._index.id_map)]  # type: ignore[attr-defined]
                if isinstance(self.aside, MappedIndex):
                    parts.append(self.aside.sample())
                held = np.concatenate(parts)
            return rng.choice(held, min(n, len(held)), replace=False)
        with self._lock.read():
            graph = int(self._index.ntotal)
            own_aside = self._own_aside
            total = graph + (0 if own_aside is None else int(own_aside.ntotal))
            places = np.sort(rng.choice(total, min(n, total), replace=False))
            beside = [own_aside.id_map.at(int(p) - graph) for p in places[places >= graph]] if own_aside is not None else []  # type: ignore[attr-defined]
            places = places[places < graph]
            ivf = faiss.extract_index_ivf(self._index) if self._ivf else None
            if ivf is not None:
                invlists: Any = ivf.invlists  # the stubs lack get_single_id and allow None, which an IVF index never has
                sizes = np.array([invlists.list_size(i) for i in range(ivf.nlist)], np.int64)
                lists = np.searchsorted(np.cumsum(sizes), places, side="right")
                offsets = places - (np.cumsum(sizes) - sizes)[lists]
                drawn = [invlists.get_single_id(int(i), int(o)) for i, o in zip(lists, offsets, strict=True)]
            else:
                id_map = self._index.id_map  # type: ignore[attr-defined]  # an IndexIDMap: the stubs type it a bare Index
                drawn = [id_map.at(int(p)) for p in places]
        return np.concatenate([np.setdiff1d(np.array(drawn, np.int64), self._removed_ids()), np.array(beside, np.int64)])

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.kind,
            "factory": self.spec,
            "search_params": self.search_params,
            "search_params_source": self._params_source(),
            **({} if self.requested_params or self.exact else {"target_recall": TARGET_RECALL}),
            **({} if self.widened_from is None else {"widened_from": self.widened_from}),
            **({"answers": "exact"} if self._exact is not None else {}),
            **({} if self.aside is None else {"kept_aside": self._aside_count()}),
            "size": self.size,
            "trained": self.is_trained,
        }

    def _params_source(self) -> str:
        if self.widened_from is not None:
            return "widened"  # by the recall check, from widened_from
        return "FACEGATE_INDEX_SEARCH_PARAMS" if self.requested_params else "default"

    def save(self, path: Path, meta: dict[str, Any]) -> None:
        """Write the index next to `path` and then `path` itself (JSON: `meta` + the index file's
        name), each with the one atomic write: a crash leaves the previous pair or the new one,
        never a mix. The caller holds the index's file lock (`save_index`): the data files no
        metadata names (another writer's, or a crashed one's) are removed after the switch (a process
        mapping one keeps it until it maps another: Linux frees an unlinked file's pages then)."""
        name = f"{path.stem}.{uuid.uuid4().hex[:12]}"
        data, beside = path.with_name(f"{name}.faiss"), path.with_name(f"{name}.aside")  # the aside: a FAISS file too
        with (
            replacing(data, suffix=".faiss") as tmp,
            replacing(beside, suffix=".aside") if self.aside is not None else nullcontext() as tmp_aside,
        ):
            with self._lock.write():  # dirty is reset: no change may slip in between
                index, removed, dead, aside = self._whole()
                faiss.write_index(index, str(tmp))
                if aside is not None:
                    faiss.write_index(aside, str(tmp_aside))
                record = {
                    **meta,
                    "file": data.name,
                    "spec": self.spec,
                    "dim": self.dim,
                    "removed": sorted(removed),
                    "dead": dead,
                    "held_back": self.held_back,
                    **({} if self.check_faces is None else {"check_faces": self.check_faces.tolist()}),
                    **({} if aside is None else {"aside": beside.name}),
                }
                self.dirty = False
        write_atomically(path, json.dumps(record).encode())
        named = {data.name, record.get("aside")}
        for orphan in (
            *path.parent.glob(f"{path.stem}.*.faiss"),
            *path.parent.glob(f"{path.stem}.*.aside"),
            *path.parent.glob(f".{path.stem}.*"),
        ):  # and a killed writer's temporaries
            if orphan.name not in named:
                orphan.unlink(missing_ok=True)

    def take_over(self, other: FaissIndex) -> None:
        """What `other`, the index this one replaces, was searched with: the parameters in force (as the
        recall check widened them), the exact copy it answered from; marked to be saved at shutdown."""
        if other.search_params != self.search_params:
            self._set_params(other.search_params)
        self.widened_from, self.changes, self.since_mapped = other.widened_from, other.changes, 0
        self._exact, self._journal = other._exact, other._journal
        self.dirty = True

    def _whole(self) -> tuple[faiss.Index, set[int], int, faiss.Index | None]:
        """The index to save, its removed ids, dead nodes and aside: this one, or (a mapped file) the
        files read into this process with the faces removed and added since (under the write lock)."""
        if not isinstance(self.base, MappedIndex):
            return self._index, self._removed, self._dead, self._own_aside
        index, base = self.base.private_copy(), self.base
        added = faiss.vector_to_array(self._index.id_map)  # type: ignore[attr-defined]  # an IndexIDMap2 over the faces added since
        vectors = self._index.index.reconstruct_n(0, len(added)) if len(added) else np.zeros((0, self.dim), np.float32)  # type: ignore[attr-defined]
        aside = None
        kept = np.zeros(len(added), bool)
        if isinstance(self.aside, MappedIndex):
            aside = self.aside.private_copy()
            aside.remove_ids(self.aside.removed_ids())  # type: ignore[arg-type]  # the wrapper's overload takes an id array
            kept = np.isin(added, np.fromiter(self._aside_added, np.int64, len(self._aside_added)))
            if kept.any():
                aside.add_with_ids(vectors[kept], added[kept])  # type: ignore[call-arg]
        added, vectors = added[~kept], vectors[~kept]
        removed = set(base.removed) - set(added.tolist())  # a removed face added again: its new node answers, the old stays dead
        dead = base.dead + len(base.removed)
        if base.ivf is not None:  # an IVF index removes for good
            index.remove_ids(base.removed_ids())  # type: ignore[arg-type]  # the Python wrapper's overload takes an id array
            removed, dead = set(), 0
        if len(added):
            index.add_with_ids(vectors, added)  # type: ignore[call-arg]
        return index, removed, dead, aside

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any], search_params: str) -> FaissIndex:
        """The saved index: an HNSW or IVF one mapped (`MappedIndex`), what every process of the host
        then shares; a flat one (an IVF index with too few faces to train yet) read."""
        file = path.with_name(meta["file"])
        drawn = np.array(meta["check_faces"], np.int64) if "check_faces" in meta else None
        if index_kind(meta["spec"]) != "faiss-flat":
            base = MappedIndex(file, meta.get("removed", []), meta.get("dead", 0))
            aside = MappedIndex(path.with_name(meta["aside"])) if meta.get("aside") else None
            index = cls(
                meta["dim"], meta["spec"], search_params, base=base, held_back=meta.get("held_back", False), aside=aside, check_faces=drawn
            )
            index.saved_as = (path, {"model_sha256": meta.get("model_sha256"), "requested": meta.get("requested")})
            return index
        built = faiss.read_index(str(file))
        return cls(
            meta["dim"],
            meta["spec"],
            search_params,
            built,
            meta.get("removed", []),
            meta.get("dead", 0),
            held_back=meta.get("held_back", False),
            check_faces=drawn,
        )


def read_meta(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class IndexConfig:
    """FACEGATE_INDEX, FACEGATE_INDEX_SEARCH_PARAMS and where a non-flat index is kept; or, with
    FACEGATE_MILVUS_URI, the Milvus collection every replica shares (milvus.py)."""

    spec: str = "Flat"
    search_params: str = ""
    directory: Path | None = None
    milvus_uri: str = ""
    milvus_token: str = ""
    milvus_index: str = "AUTOINDEX"
    milvus_consistency: str = "Strong"
    milvus_timeout: float = 5.0
    milvus_index_params: dict[str, Any] = field(default_factory=dict)
    milvus_search_params: dict[str, Any] = field(default_factory=dict)
    near_copy: float = NEAR_COPY  # the embedder's (`near_copy_of`): a trained index holds the check's faces back with their copies
    check_sample: int = CHECK_SAMPLE  # FACEGATE_INDEX_RECALL_SAMPLE: how many faces that is

    @property
    def shared(self) -> bool:
        """One index for every replica (Milvus), written by whoever writes the store."""
        return bool(self.milvus_uri)

    def path(self, model_sha256: str) -> Path | None:
        """The metadata file of this embedder's persisted index; None: not persisted (flat rebuilds as fast as it loads)."""
        if self.directory is None or index_kind(self.spec) == "faiss-flat":
            return None
        slug = "".join(c if c.isalnum() else "_" for c in self.spec)
        return self.directory / f"{model_sha256[:16]}-{slug}.json"


def saves(path: Path | None) -> Any:
    """The index's file lock: the processes sharing a folder save (and map) one at a time."""
    if path is None:
        return nullcontext()
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path.with_suffix(".lock"))


def loaded(
    path: Path | None,
    meta: dict[str, Any] | None,
    config: IndexConfig,
    dim: int,
    model_sha256: str,
    count: int,
    needed: int,
    is_current: Callable[[dict[str, Any]], bool],
) -> FaissIndex | None:
    """The persisted index (mapped) when its file matches, else None (the caller holds `saves`)."""
    if not (
        path is not None
        and meta
        and meta.get("dim") == dim
        and meta.get("model_sha256") == model_sha256
        and meta.get("requested") == config.spec
        and (meta.get("spec") == config.spec or count < needed)  # still too few faces to train: flat was right
        and meta.get("dead", 0) <= REBUILD_REMOVED_FRACTION * max(count, 1)
        and is_current(meta)
    ):
        return None
    try:
        started = time.monotonic()
        index = FaissIndex.load(path, meta, config.search_params if meta["spec"] == config.spec else "")
        log.info("gallery index %s: %d faces loaded from %s in %.1f s", index.spec, index.size, path.name, time.monotonic() - started)
        return index
    except RuntimeError as exc:  # a damaged or truncated file: build instead
        log.warning("gallery index %s unreadable (%s): rebuilding", path, exc)
        return None


def open_index(
    config: IndexConfig,
    dim: int,
    model_sha256: str,
    count: int,
    is_current: Callable[[dict[str, Any]], bool],
    sample: Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray]],
    rows: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]],
) -> tuple[FaissIndex, dict[str, Any] | None]:
    """The persisted index when its file matches (`is_current` judges the store's side: face count,
    change sequence), else one built from `rows` (ids, vectors batches) — trained first on
    `sample(n)` (ids, vectors, the recall check's candidates) when it needs training and the store holds enough faces; with fewer it stays
    exact (flat) until a restart finds enough. Returns the index and the metadata it was loaded
    with (None when built)."""
    path = config.path(model_sha256)
    try:
        needed = train_size(config.spec, dim)
    except RuntimeError as exc:  # FAISS's own message says what it could not parse
        raise ValueError(f"FACEGATE_INDEX={config.spec!r} is not a FAISS index factory string for {dim}-d embeddings: {exc}") from None
    with saves(path):  # mapped before another save may remove it
        meta = read_meta(path) if path else None
        index = loaded(path, meta, config, dim, model_sha256, count, needed, is_current)
    if index is not None and meta is not None:
        return tuned(index), meta
    spec = config.spec if count >= needed else "Flat"
    if spec != config.spec:
        log.info(
            "gallery index %s needs %d faces to train, the gallery has %d: searching exactly until a restart finds enough",
            config.spec,
            needed,
            count,
        )
    index = FaissIndex(dim, spec, config.search_params if spec == config.spec else "")
    started, candidates = time.monotonic(), None
    if not index.is_trained:
        ivf = faiss.try_extract_index_ivf(index._index)
        n = min(count, MAX_TRAIN_PER_LIST * ivf.nlist if ivf is not None else 10 * MIN_TRAIN_OTHER)
        ids, vectors, candidates = sample(n)
        index.train(ids, vectors, candidates, config.near_copy, config.check_sample)
    if index.aside is not None:  # an HNSW graph keeps a face per person out of it for the recall check, as drawn for IVF
        index.aside_for = sample(0)[2] if candidates is None else candidates
    for ids, vectors in rows():
        index.add(ids, vectors)
    index.aside_for = None
    if path:
        log.info("gallery index %s: %d faces built in %.1f s", spec, index.size, time.monotonic() - started)
    return tuned(index), None


def tuned(index: FaissIndex) -> FaissIndex:
    """`index` with its default search parameters set (none given), and what it searches with logged."""
    if index.tune() is not None:
        log.info(
            "gallery index %s: search parameters %s, facegate's default for %d faces (aiming at recall@1 %.2f; "
            "FACEGATE_INDEX_SEARCH_PARAMS overrides it)",
            index.spec,
            index.search_params,
            index.size,
            TARGET_RECALL,
        )
    elif index.search_params:
        log.info("gallery index %s: search parameters %s (FACEGATE_INDEX_SEARCH_PARAMS)", index.spec, index.search_params)
    return index


def save_index(config: IndexConfig, index: FaissIndex, model_sha256: str, state: dict[str, Any]) -> None:
    """Persist `index` with what it reflects (`state`: the store's face count or change sequence),
    when it is a kind that is persisted and changed since it was built or loaded. The processes
    sharing a folder (`--workers N`) save under one file lock, one at a time: the one holding it
    owns the files, and a process that finds the state it holds already saved writes nothing."""
    path = config.path(model_sha256)
    if path is None or not index.dirty:
        return
    meta = {**state, "model_sha256": model_sha256, "requested": config.spec}
    with saves(path):
        saved = read_meta(path)
        if saved is not None and saved.get("spec") == index.spec and all(saved.get(k) == v for k, v in meta.items()):
            log.info("gallery index %s: the state it reflects is saved already (%s)", index.spec, path.name)
            return
        started = time.monotonic()
        index.save(path, meta)
    log.info("gallery index %s: %d faces saved to %s in %.1f s", index.spec, index.size, path.name, time.monotonic() - started)


def saved_and_mapped(config: IndexConfig, index: FaissIndex, model_sha256: str, state: dict[str, Any]) -> FaissIndex:
    """A built index saved (`save_index`), and the file saved for `state` mapped in its place: the
    builder too searches the host's one copy, not one of its own. `index` itself where none is
    saved for that state (no folder, a flat index)."""
    save_index(config, index, model_sha256, state)
    path = config.path(model_sha256)
    with saves(path):  # mapped before another save may remove it
        meta = read_meta(path) if path is not None else None
        if path is None or meta is None or meta.get("spec") != index.spec or any(meta.get(k) != v for k, v in state.items()):
            return index
        mapped = FaissIndex.load(path, meta, index.requested_params)
    return tuned(mapped)


def remapped(
    index: FaissIndex,
    applied: int,
    mapped_at: int,
    replay: Callable[[FaissIndex, int], bool],
    stamp: Callable[[], dict[str, Any] | None] = lambda: None,
) -> FaissIndex | None:
    """`index` (its file mapped as of change `mapped_at`, the changes since in its own part, as of
    `applied`) as a file mapped anew, under the index's file lock: the host's file saved by another
    process as of a later change, up to `applied`, with `replay(fresh, change)` applying the log
    since (False: the log no longer reaches it); else this index saved as of `applied` (its faces
    merged into a new file, which the other processes then map), with `stamp()`: what the store's
    start checks a persisted index by, as of `applied` (None: not known now, so a start uses the
    file only once a shutdown's save has stamped it). None: the host's file is newer than `applied`
    (this process maps it once it caught up)."""
    if index.saved_as is None:
        return None
    path, names = index.saved_as
    with saves(path):
        meta = read_meta(path)
        saved = meta.get("applied", -1) if meta and meta.get("spec") == index.spec and meta.get("dim") == index.dim else -1
        if saved > applied:
            return None
        fresh = FaissIndex.load(path, meta, index.requested_params) if mapped_at < saved and meta is not None else None
        if fresh is None or not replay(fresh, saved):
            index.save(path, {**names, "applied": applied, **(stamp() or {})})
            fresh = FaissIndex.load(path, read_meta(path) or {}, index.requested_params)
    fresh.take_over(index)
    return fresh


def best_subjects(
    index: VectorIndex, query: np.ndarray, top_k: int, faces: Callable[[list[int]], dict[int, tuple[str, str, np.ndarray]]]
) -> list[Candidate]:
    """The top_k subjects by their best face's similarity, best first; each subject once.

    The index ranks faces, so it is asked for more neighbours until top_k distinct subjects are
    found or the whole index has been seen. `faces` maps face ids to (subject id, name, embedding)
    as the store has them now: faces it no longer has (deleted meanwhile, or made by another
    embedder) are dropped, and each similarity is recomputed from the stored embedding, so an
    approximate index's estimate never reaches a decision.
    """
    query = np.asarray(query, np.float32).reshape(-1)
    k = max(4 * top_k, CANDIDATES)
    while True:
        size = index.size
        _, ids = index.search(query[None], min(k, size))
        best = ranked(query, faces(list(dict.fromkeys(int(i) for i in ids[0] if i >= 0))))
        if len(best) >= top_k or k >= size:
            return best[:top_k]
        k *= 4


def ranked(query: np.ndarray, found: dict[int, tuple[str, str, np.ndarray]]) -> list[Candidate]:
    """Each subject once, by its best face among `found` (face id: subject id, name, stored embedding),
    scored against `query` from the stored embedding, best first (a tie: the lower face id)."""
    scored = sorted(
        ((float(np.dot(v, query)), face_id, owner, name) for face_id, (owner, name, v) in found.items()), key=lambda t: (-t[0], t[1])
    )
    best: dict[str, Candidate] = {}
    for score, face_id, owner, name in scored:
        if owner not in best:
            best[owner] = Candidate(owner, name, score, face_id, found[face_id][2])
    return list(best.values())
