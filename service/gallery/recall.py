"""Whether the approximate index still finds what an exact search finds: an index searched with too
small an efSearch or nprobe loses top-1 answers without an error anywhere, so a background check
measures it. At start-up and after every FACEGATE_INDEX_RECALL_EVERY faces added or removed, a
sample of the gallery's own faces and a near copy of each (its stored chip mirrored and embedded
again where chips are kept, else its embedding slightly perturbed: near but not equal, as a new
photo of the person would be) is searched as /identify searches (CANDIDATES faces from the index,
re-scored from the stored embeddings) and exactly, by one pass over the store's embeddings.
recall@1 is the share of queries whose best candidate is as similar as the exact best; /readyz and
/metrics report it, and /readyz lists a problem under FACEGATE_MIN_INDEX_RECALL.

It runs on its own thread, never on the event loop nor a request's: it reads the store a page at a
time and searches the index under its read lock, as requests do. An exact (flat) index is not
sampled: its recall is 1 by construction.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import faiss
import numpy as np

from service.core.errors import FacegateError
from service.core.models.embedder import FaceEmbedder
from service.core.settings import Settings
from service.gallery.index import CANDIDATES, VectorIndex
from service.gallery.interface import GalleryStore

log = logging.getLogger("facegate.gallery.recall")

PAGE = 10_000  # faces read from the store at a time during the exact pass
POLL_SECONDS = 5.0  # how often the thread looks at the index's change count
# A perturbed copy's cosine to its face, calibrated on benchmarks/gallery_ann.py's 1M gallery so that
# copies are found about as often as its LFW queries' best faces (IVF1024,SQ8 at nprobe 32, 64, 136:
# copies 0.850, 0.925, 0.985; LFW queries 0.914, 0.962, 0.994: docs/benchmarks.md). A mirrored chip
# is nearer (cosine 0.99 with dlib-resnet-v1; two LFW photos of one person: 0.95).
PERTURBED_COSINE = 0.97
TIE = 1e-5  # float32 dot products of one pair differ in the last bits between FAISS and numpy


@dataclass(frozen=True)
class RecallResult:
    recall_at_1: float  # over every query
    own_faces: float  # the gallery's faces searched for themselves
    near_copies: float  # their mirrored or perturbed copies
    queries: int
    mirrored: int  # near copies made from a stored chip; the rest were perturbed embeddings
    faces: int  # in the index when checked
    index: str  # its backend and kind, e.g. "faiss-ivf IVF1024,SQ8"
    search_params: str
    checked_at: float  # time.time()
    seconds: float


class RecallCheck:
    """Runs the check on a daemon thread and keeps its last result for /readyz and /metrics."""

    def __init__(
        self,
        store: GalleryStore,
        index: VectorIndex | None,
        sample: int,
        every: int,
        minimum: float,
        embed: Callable[[np.ndarray], np.ndarray] | None = None,
        template: str | None = None,
        poll: float = POLL_SECONDS,
    ):
        """`embed` and `template`: the active embedder and its alignment, to embed mirrored chips
        (None: every near copy is a perturbed embedding). `sample` 0 turns the check off."""
        self.store, self.index, self.sample, self.every, self.minimum = store, index, sample, every, minimum
        self.embed, self.template, self.poll = embed, template, poll
        self.last: RecallResult | None = None
        self.error: str | None = None
        self.running = False
        self._checked_changes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="facegate-index-recall", daemon=True)

    @classmethod
    def from_settings(
        cls, settings: Settings, store: GalleryStore, index: VectorIndex | None, embedder: FaceEmbedder | None
    ) -> RecallCheck:
        """The check of the service's gallery: mirrored chips are embedded by its embedder."""
        return cls(
            store,
            index,
            settings.index_recall_sample,
            settings.index_recall_every,
            settings.min_index_recall,
            embedder.embed if embedder else None,
            embedder.manifest.alignment if embedder else None,
        )

    @property
    def enabled(self) -> bool:
        return self.index is not None and self.sample > 0 and not self.index.exact

    def start(self) -> None:
        if self.enabled:
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        assert self.index is not None  # started only when enabled
        first = True
        while first or not self._stop.wait(self.poll):
            if first or self.index.changes - self._checked_changes >= self.every:
                self.run()
            first = False

    def run(self) -> RecallResult | None:
        """One check now, on the calling thread (the daemon's, or a test's); None when it failed (logged)."""
        assert self.index is not None
        self.running = True
        try:
            self._checked_changes = self.index.changes
            if (params := self.index.tune()) is not None:  # the gallery grew or shrank: the default for its size
                log.info("gallery index: search parameters now %s (facegate's default for %d faces)", params, self.index.size)
            self.last, self.error = measure(self.store, self.index, self.sample, self.embed, self.template), None
            level = logging.WARNING if self.last.recall_at_1 < self.minimum else logging.INFO
            log.log(level, "gallery index recall@1 %.3f over %d queries (%s)", self.last.recall_at_1, self.last.queries, self.last)
        except (FacegateError, OSError, RuntimeError, ValueError) as exc:  # a store outage, a model error: try at the next change
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("gallery index recall check failed: %s", self.error)
        finally:
            self.running = False
        return self.last if self.error is None else None

    def report(self) -> dict[str, Any] | None:
        """`gallery.index.recall` of /readyz: the last result, or why there is none."""
        if self.index is None:
            return None
        if self.index.exact:
            return {"recall_at_1": 1.0, "exact": True}
        if self.sample <= 0:
            return {"recall_at_1": None, "disabled": "FACEGATE_INDEX_RECALL_SAMPLE=0"}
        out: dict[str, Any] = {"minimum": self.minimum, "running": self.running, "every_changes": self.every}
        out |= asdict(self.last) if self.last else {"recall_at_1": None}
        if self.error:
            out["error"] = self.error
        return out

    def recall(self) -> float:
        """For /metrics: the last recall@1, 1 for an exact index, NaN before the first check."""
        if self.index is not None and self.index.exact:
            return 1.0
        return self.last.recall_at_1 if self.last else math.nan

    def problems(self) -> list[dict[str, str]]:
        """A /readyz problem while the last measured recall@1 is under FACEGATE_MIN_INDEX_RECALL
        (from the last result alone: /readyz never waits on the index or the store)."""
        if self.last is None or self.last.recall_at_1 >= self.minimum:
            return []
        kind = "efSearch (ef on Milvus)" if "hnsw" in self.last.index.lower() else "nprobe"
        return [
            {
                "model": "gallery index",
                "name": self.last.index,
                "error": (
                    f"recall@1 {self.last.recall_at_1:.3f} with search parameters {self.last.search_params or 'none'}, "
                    f"under FACEGATE_MIN_INDEX_RECALL={self.minimum}: identifications may miss the enrolled face that matches best"
                ),
                "fix": (
                    f"raise {kind} in FACEGATE_INDEX_SEARCH_PARAMS (or FACEGATE_MILVUS_SEARCH_PARAMS), or leave it empty for "
                    "facegate's default for the gallery's size; benchmarks/gallery_ann.py measures the trade-off (docs/scaling.md)"
                ),
            }
        ]


def measure(
    store: GalleryStore,
    index: VectorIndex,
    sample: int,
    embed: Callable[[np.ndarray], np.ndarray] | None = None,
    template: str | None = None,
    seed: int | None = None,
) -> RecallResult:
    """recall@1 of `index` against the exact answer over `store`, on `sample` of its faces and a
    near copy of each."""
    started = time.monotonic()
    rng = np.random.default_rng(seed)
    faces = store.lookup_faces(index.sample_ids(sample, rng).tolist())
    if not faces:
        raise ValueError("the index holds no face the store has: nothing to sample")
    ids = np.array(sorted(faces), np.int64)
    own = np.stack([faces[i][2] for i in ids]).astype(np.float32)
    near, mirrored = perturbed(own, rng), 0
    if embed is not None and template is not None:
        chips = store.face_chips(ids.tolist())
        if chips:
            rows = [k for k, i in enumerate(ids) if int(i) in chips]
            near[rows] = embed(np.stack([chips[int(ids[k])].align(template)[:, ::-1] for k in rows]))
            mirrored = len(rows)
    queries = np.concatenate([own, near])
    best = exact_best(store, queries)
    found = index_best(store, index, queries)
    hit = found >= best - TIE
    half = len(own)
    described = index.describe()
    return RecallResult(
        recall_at_1=float(hit.mean()),
        own_faces=float(hit[:half].mean()),
        near_copies=float(hit[half:].mean()),
        queries=len(queries),
        mirrored=mirrored,
        faces=int(described.get("size", 0)),
        index=f"{described.get('backend')} {described.get('factory') or described.get('index_type') or ''}".strip(),
        search_params=str(described.get("search_params", "")),
        checked_at=time.time(),
        seconds=round(time.monotonic() - started, 3),
    )


def perturbed(vectors: np.ndarray, rng: np.random.Generator, cosine: float = PERTURBED_COSINE) -> np.ndarray:
    """Unit vectors at `cosine` to each of `vectors`, moved along the directions in which the sample
    itself varies (a random mix of its faces' differences from their mean, less its part along the
    face), as another photo of a person moves: a random direction of all dimensions moves a copy
    where hardly any index loses it, whatever its parameters."""
    centred = vectors - vectors.mean(0)
    noise = rng.standard_normal((len(vectors), len(vectors))).astype(np.float32) @ centred
    noise += 1e-6 * rng.standard_normal(vectors.shape).astype(np.float32)  # a sample of one face has no spread
    noise -= (noise * vectors).sum(1, keepdims=True) * vectors
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    out = cosine * vectors + math.sqrt(1 - cosine**2) * noise
    return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def exact_best(store: GalleryStore, queries: np.ndarray) -> np.ndarray:
    """Each query's highest similarity over every face the store holds for the active embedder,
    a page at a time (FAISS's brute-force search: one thread, the GIL released)."""
    best = np.full(len(queries), -np.inf, np.float32)
    after = 0
    while True:
        ids, vectors = store.embeddings_after(after, PAGE)
        if len(ids) == 0:
            return best
        scores, _ = faiss.knn(queries, np.ascontiguousarray(vectors, np.float32), 1, metric=faiss.METRIC_INNER_PRODUCT)
        best = np.maximum(best, scores[:, 0])
        after = int(ids[-1])


def index_best(store: GalleryStore, index: VectorIndex, queries: np.ndarray) -> np.ndarray:
    """Each query's highest similarity among the faces the index proposes, re-scored from the
    store's embeddings: what /identify's search would rank first."""
    _, ids = index.search(queries, CANDIDATES)
    stored = store.lookup_faces(sorted({int(i) for i in ids.ravel() if i >= 0}))
    best = np.full(len(queries), -np.inf, np.float32)
    for row, (query, candidates) in enumerate(zip(queries, ids, strict=True)):
        vectors = [stored[int(i)][2] for i in candidates if int(i) in stored]
        if vectors:
            best[row] = float(np.max(np.stack(vectors) @ query))
    return best
