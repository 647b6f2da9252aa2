"""Whether the approximate index still finds what an exact search finds: an index searched with too
small an efSearch or nprobe loses top-1 answers without an error anywhere, so a background check
measures it, and acts on it. At start-up, after every FACEGATE_INDEX_RECALL_EVERY faces added or
removed, and whenever the store replaces its index (a rebuild), it searches held-out queries as
/identify searches (CANDIDATES faces from the index, re-scored from the stored embeddings) and
exactly, by one pass over the store's embeddings. recall@1 is the share of queries whose best
candidate is as similar as the exact best.

The queries are enrolled faces of subjects with another face, each searched with itself left out:
another photo of an enrolled person, as /identify's mated searches are (a gallery's own faces
searched for themselves are found almost always, whatever the index, and over-report it). A face is
searched without its near copies too (`without_copies`: every face at NEAR_COPY or more to it, its
mirror image or a re-crop enrolled again), which a new photo has none of: its best would be a copy
the index all but always finds (on 100k faces with four copies of each training crop the check read
0.722 at IVF256 nprobe 1 where LFW's held-out photos found 0.436; 0.514 without the copies). Where the
index was trained (IVF lists, codes), only faces its training held back with their near copies
(index.py `check_faces`; an HNSW graph's: those it keeps out, its aside): a face, or a copy of it,
that trained the k-means pulled a list's centroid to itself, which a new photo never did. Both are
the store's candidates, a face per person (sqlite.py CHECK_CANDIDATES): drawn per face, the people
with many photos, whose new photos are found more easily, made up the check (0.14-0.15 high at IVF1024
nprobe 1, 0.04 at HNSW32 efSearch 16, on 100k faces: docs/benchmarks.md round 10). Where
the gallery has too few such faces, near copies make up the sample: a face's stored chip mirrored
and embedded again where chips are kept, else its embedding moved slightly along the directions in
which faces differ.

That synthetic sample only stands in for what the goal names, /identify's own mated searches: an
HNSW graph still holds a left-out face's links (it under-reported by 0.03 at small efSearch), and
the gallery's people are not its callers'. So the check also shadows live traffic: a seeded share
(FACEGATE_INDEX_RECALL_LIVE) of /identify's query embeddings, with the decision each was made with,
is kept in a bounded window (`LiveQueries`: `offer` is a draw and an append, nothing else on the
request path), and each check searches them again, exactly and through the index, on its own
thread. Those whose exact best passes their decision (mated: a face /identify should have matched)
are the sample once there are FACEGATE_INDEX_RECALL_SAMPLE / 2 of them: recall@1 of new photos
itself, its only error the sampling. /readyz says which sample it is (`source`: live or held-out).

Under FACEGATE_MIN_INDEX_RECALL the check widens the search (twice the efSearch or nprobe, measured
again on the same queries) until the minimum is met; where it cannot, the index's searches are
answered from an exact flat copy of the faces until a later check meets it. Both are logged and
shown in /readyz.

It runs on its own thread, never on the event loop nor a request's: it reads the store a page at a
time and searches the index under its read lock, as requests do. An exact (flat) index is not
sampled: its recall is 1 by construction.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import faiss
import numpy as np

from service.core.decision import Decision
from service.core.errors import FacegateError
from service.core.models.embedder import FaceEmbedder
from service.core.open_set import K
from service.core.settings import Settings
from service.gallery.index import CANDIDATES, NEAR_COPY, FaissIndex, VectorIndex, best_of, near_copy_of, ranked
from service.gallery.interface import GalleryStore

log = logging.getLogger("facegate.gallery.recall")

PAGE = 10_000  # faces read from the store at a time during the exact pass
POLL_SECONDS = 5.0  # how often the thread looks at the index's change count
# A perturbed copy's cosine to its face, calibrated on benchmarks/gallery_ann.py's 1M gallery so that
# copies are found about as often as its LFW queries' best faces (IVF1024,SQ8 at nprobe 32, 64, 136:
# copies 0.850, 0.925, 0.985; LFW queries 0.914, 0.962, 0.994: docs/benchmarks.md). A mirrored chip
# is nearer (cosine 0.99 with dlib-resnet-v1; two LFW photos of one person: 0.95).
PERTURBED_COSINE = 0.97
COPIES = 15  # near copies left out with a held-out face at most (a face with more is not drawn)
TIE = 1e-5  # float32 dot products of one pair differ in the last bits between FAISS and numpy
LIVE_INTERVAL = 60.0  # seconds at least between two checks that live queries alone make due
# ... and at least the last check's own seconds / LIVE_DUTY: such checks take a tenth of one core at most
# (726 live queries' exact pass over 1M faces: 18.6 s on the shared 2-core VM, docs/benchmarks.md)
LIVE_DUTY = 0.1
Z95 = 1.959964  # the standard normal's 97.5th percentile: a two-sided 95 % interval
LIVE_TOP = max(4 * (K + 1), CANDIDATES)  # exact faces per live query, to rank the subjects its decision reads (the margin's K next)


@dataclass(frozen=True)
class Probe:
    """Held-out queries with their exact answer, measured once and searched at each parameter tried."""

    queries: np.ndarray
    left_out: np.ndarray  # the face each query is (searched with it left out); -1 for a near copy
    mirrored: int  # near copies made from a stored chip; the other near copies are perturbed embeddings
    best: np.ndarray  # the exact best similarity over the store, the left-out face excluded
    live: bool = False  # /identify's own queries whose exact best passed their decision (left_out all -1)
    sampled: int = 0  # live queries kept, the mated and the others
    copies: np.ndarray | None = None  # per query, the faces left out with it as its near copies (-1: none), one row each

    @property
    def mated(self) -> int:
        return int((self.left_out >= 0).sum())

    @property
    def leaving(self) -> np.ndarray:
        """Per query, every face it is searched without: itself and its near copies (-1: none)."""
        return self.left_out[:, None] if self.copies is None else np.column_stack([self.left_out, self.copies])


@dataclass(frozen=True)
class RecallResult:
    recall_at_1: float  # over every query
    mated: float | None  # over the enrolled faces searched with themselves left out (None: none)
    mated_bounds: tuple[float, float] | None  # HNSW: with the face hidden / kept in the graph; `mated` is the hidden one
    near_copies: float | None  # over the near copies that made up the sample (None: none needed)
    queries: int
    mated_queries: int
    mirrored: int  # near copies made from a stored chip; the rest were perturbed embeddings
    faces: int  # in the index when checked
    index: str  # its backend and kind, e.g. "faiss-ivf IVF1024,SQ8"
    search_params: str
    answers: str  # "index", or "exact": searches answered from a flat copy (the minimum unmet at the widest search)
    checked_at: float  # time.time()
    seconds: float
    source: str = "held-out"  # the sample: "live" (/identify's mated queries, searched again) or "held-out" (the gallery's own faces)
    live_sampled: int = 0  # live queries kept when checked (the mated among them are the sample where source is live)
    interval: tuple[float, float] = (0.0, 1.0)  # recall_at_1's 95 % interval from its sampling alone (`wilson`)


class LiveQueries:
    """A seeded share of /identify's query embeddings and the decision each was searched for, the
    last `window` kept for the check to search again (never written anywhere: memory only)."""

    def __init__(self, share: float, window: int, seed: int = 0):
        self.share, self.window = share, window
        self.seen = 0  # kept since start
        self._rng = np.random.default_rng(seed)
        self._kept: deque[tuple[np.ndarray, Decision]] = deque(maxlen=max(window, 1))
        self._lock = threading.Lock()

    def offer(self, embedding: np.ndarray, decision: Decision) -> None:
        """On the request's path: a draw, and a copy of 4 × dim bytes appended when drawn."""
        if self.share <= 0 or self.window <= 0:
            return
        with self._lock:
            if self._rng.random() < self.share:
                self._kept.append((np.array(embedding, np.float32).reshape(-1), decision))
                self.seen += 1

    def taken(self) -> tuple[np.ndarray, list[Decision]]:
        """The queries kept now and their decisions."""
        with self._lock:
            kept = list(self._kept)
        if not kept:
            return np.zeros((0, 0), np.float32), []
        return np.stack([q for q, _ in kept]), [d for _, d in kept]


class RecallCheck:
    """Runs the check on a daemon thread and keeps its last result for /readyz and /metrics."""

    def __init__(
        self,
        store: GalleryStore,
        index: Callable[[], VectorIndex | None],
        sample: int,
        every: int,
        minimum: float,
        embed: Callable[[np.ndarray], np.ndarray] | None = None,
        template: str | None = None,
        poll: float = POLL_SECONDS,
        live: float = 0.0,
        live_interval: float = LIVE_INTERVAL,
        near_copy: float = NEAR_COPY,
    ):
        """`index`: the store's index now (a store replaces it when it rebuilds; the check follows).
        `embed` and `template`: the active embedder and its alignment, to embed mirrored chips
        (None: every near copy is a perturbed embedding). `sample` 0 turns the check off. `live`: the
        share of /identify's queries kept (the last 2 × `sample`), 0: none; a check is due once
        `sample` / 2 more were kept, `live_interval` seconds after the last at the soonest, and ten
        times as long as the last took (LIVE_DUTY). `near_copy`: the embedder's cosine from which an
        enrolled face is a near copy of a held-out one, left out with it."""
        self.store, self.follow, self.sample, self.every, self.minimum = store, index, sample, every, minimum
        self.near_copy = near_copy
        self.embed, self.template, self.poll = embed, template, poll
        self.live, self.live_interval = LiveQueries(live, 2 * sample), live_interval
        self._live_at = (0, -math.inf)  # live queries kept, and time.monotonic(), at the last check
        self.last: RecallResult | None = None
        self.error: str | None = None
        self.running = False
        self._checked: tuple[VectorIndex | None, int] = (None, 0)  # the index last checked and its change count then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="facegate-index-recall", daemon=True)

    @classmethod
    def from_settings(
        cls, settings: Settings, store: GalleryStore, index: Callable[[], VectorIndex | None], embedder: FaceEmbedder | None
    ) -> RecallCheck:
        """The check of the service's gallery: mirrored chips are embedded by its embedder, and near
        copies start at its manifest's `near_copy`."""
        return cls(
            store,
            index,
            settings.index_recall_sample,
            settings.index_recall_every,
            settings.min_index_recall,
            embedder.embed if embedder else None,
            embedder.manifest.alignment if embedder else None,
            live=settings.index_recall_live,
            near_copy=near_copy_of(embedder.manifest if embedder else None),
        )

    def offer(self, embedding: np.ndarray, decision: Decision) -> None:
        """An /identify query and its decision, kept or not by the seeded draw (the request's path)."""
        if self.enabled:
            self.live.offer(embedding, decision)

    @property
    def index(self) -> VectorIndex | None:
        return self.follow()

    @property
    def enabled(self) -> bool:
        index = self.index
        return index is not None and self.sample > 0 and not index.exact

    def start(self) -> None:
        if self.sample > 0 and self.index is not None:  # a flat index may be replaced by an approximate one
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            if self.due():
                self.run()
            if self._stop.wait(self.poll):
                return

    def due(self) -> bool:
        """Never checked, the store replaced its index since, enough changes to this one, or enough
        live queries kept since the last check (and `live_interval` passed, and the last check's
        seconds / LIVE_DUTY)."""
        index, changes = self._checked
        now = self.index
        seen, at = self._live_at
        wait = max(self.live_interval, (self.last.seconds if self.last else 0.0) / LIVE_DUTY)
        fresh = self.live.seen - seen >= max(self.sample // 2, 1) and time.monotonic() - at >= wait
        return self.enabled and (now is not index or now is not None and (now.changes - changes >= self.every or fresh))

    def run(self) -> RecallResult | None:
        """One check now, on the calling thread (the daemon's, or a test's); None when it failed (logged)."""
        index = self.index
        if index is None or index.exact:
            return None
        self.running = True
        try:
            self._checked = (index, index.changes)
            if (params := index.tune()) is not None:  # the gallery grew or shrank: the default for its size
                log.info("gallery index: search parameters now %s (facegate's default for %d faces)", params, index.size)
            started = time.monotonic()
            self._live_at = (self.live.seen, started)
            probe = live_probe(self.store, *self.live.taken())
            if len(probe.queries) < max(self.sample // 2, 1):  # too few live mated queries yet: the gallery's own faces stand in
                probe = replace(
                    held_out(self.store, index, self.sample, self.embed, self.template, near_copy=self.near_copy), sampled=probe.sampled
                )
            result = measured(self.store, index, probe, started)
            if result.recall_at_1 < self.minimum:
                result = self._raise_recall(index, probe, result, started)
            elif index.answers_exactly and isinstance(index, FaissIndex):
                index.stop_exact()
                log.warning(
                    "gallery index recall@1 %.3f meets FACEGATE_MIN_INDEX_RECALL again: answering from the index", result.recall_at_1
                )
                result = replace(result, answers="index")
            self.last, self.error = result, None
            level = logging.WARNING if result.recall_at_1 < self.minimum else logging.INFO
            log.log(level, "gallery index recall@1 %.3f over %d queries (%s)", result.recall_at_1, result.queries, result)
        except (FacegateError, OSError, RuntimeError, ValueError) as exc:  # a store outage, a model error: try at the next change
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("gallery index recall check failed: %s", self.error)
        finally:
            self.running = False
        return self.last if self.error is None else None

    def _raise_recall(self, index: VectorIndex, probe: Probe, result: RecallResult, started: float) -> RecallResult:
        """Widen the search until the minimum is met; where it cannot be, answer exactly."""
        while result.recall_at_1 < self.minimum and (params := index.widen()) is not None:
            low = result.recall_at_1
            result = measured(self.store, index, probe, started)
            log.warning(
                "gallery index recall@1 %.3f under FACEGATE_MIN_INDEX_RECALL=%s: search widened to %s, recall@1 now %.3f",
                low,
                self.minimum,
                params,
                result.recall_at_1,
            )
        if result.recall_at_1 >= self.minimum:
            if index.answers_exactly and isinstance(index, FaissIndex):
                index.stop_exact()
                log.warning(
                    "gallery index recall@1 %.3f meets FACEGATE_MIN_INDEX_RECALL again: answering from the index", result.recall_at_1
                )
            return replace(result, answers="exact" if index.answers_exactly else "index")  # Milvus: IVF_FLAT at every list
        if not isinstance(index, FaissIndex):  # Milvus: nothing to answer from but its index (milvus.py: answers_exactly)
            log.warning(
                "gallery index recall@1 %.3f at its widest search (%s), under FACEGATE_MIN_INDEX_RECALL=%s: Milvus keeps no exact "
                "copy, identifications may miss the enrolled face that matches best",
                result.recall_at_1,
                result.search_params,
                self.minimum,
            )
        elif not index.answers_exactly:
            index.begin_exact()
            index.use_exact(pages(self.store))
            log.warning(
                "gallery index recall@1 %.3f at its widest search (%s), under FACEGATE_MIN_INDEX_RECALL=%s: answering from an "
                "exact copy of the %d faces (a flat scan per search) until a check meets the minimum",
                result.recall_at_1,
                result.search_params,
                self.minimum,
                index.size,
            )
        return replace(result, answers="exact" if index.answers_exactly else "index")

    def report(self) -> dict[str, Any] | None:
        """`gallery.index.recall` of /readyz: the last result, or why there is none."""
        index = self.index
        if index is None:
            return None
        if index.exact:
            return {"recall_at_1": 1.0, "exact": True}
        if self.sample <= 0:
            return {"recall_at_1": None, "disabled": "FACEGATE_INDEX_RECALL_SAMPLE=0"}
        out: dict[str, Any] = {"minimum": self.minimum, "running": self.running, "every_changes": self.every, "live_share": self.live.share}
        out |= asdict(self.last) if self.last else {"recall_at_1": None}
        if self.error:
            out["error"] = self.error
        return out

    def recall(self) -> float:
        """For /metrics: the last recall@1, 1 for an exact index, NaN before the first check."""
        index = self.index
        if index is not None and index.exact:
            return 1.0
        return self.last.recall_at_1 if self.last else math.nan

    def problems(self) -> list[dict[str, str]]:
        """A /readyz problem while the last measured recall@1 is under FACEGATE_MIN_INDEX_RECALL
        (from the last result alone: /readyz never waits on the index or the store)."""
        if self.last is None or self.last.recall_at_1 >= self.minimum:
            return []
        kind = "efSearch (ef on Milvus)" if "hnsw" in self.last.index.lower() else "nprobe"
        milvus = self.last.index.startswith("milvus")
        answered = (
            "every search is answered from an exact copy of the faces (a flat scan: slower, and the faces' memory again)"
            if self.last.answers == "exact"
            else "identifications may miss the enrolled face that matches best"
            + (" (Milvus has no exact search beside this index type)" if milvus else "")
        )
        exact = "FACEGATE_MILVUS_INDEX=IVF_FLAT (exact at its widest nprobe) or FLAT" if milvus else "FACEGATE_INDEX=Flat"
        return [
            {
                "model": "gallery index",
                "name": self.last.index,
                "error": (
                    f"recall@1 {self.last.recall_at_1:.3f} ({self.last.source} queries) with search parameters "
                    f"{self.last.search_params or 'none'} (widened as far as they go), "
                    f"under FACEGATE_MIN_INDEX_RECALL={self.minimum}: {answered}"
                ),
                "fix": (
                    f"an index with finer codes or more links (the widest {kind} did not reach it), a lower FACEGATE_MIN_INDEX_RECALL, "
                    f"or {exact}; benchmarks/gallery_ann.py measures the trade-off (docs/scaling.md)"
                ),
            }
        ]


def held_out(
    store: GalleryStore,
    index: VectorIndex,
    sample: int,
    embed: Callable[[np.ndarray], np.ndarray] | None = None,
    template: str | None = None,
    seed: int | None = None,
    near_copy: float | None = None,
) -> Probe:
    """`sample` queries: enrolled faces of subjects with another, each to be searched with itself and
    its near copies left out (`near_copy`: their cosine, NEAR_COPY if None), made up where too few
    with near copies of faces drawn from the index; and their exact answer."""
    rng = np.random.default_rng(seed)
    ids, subjects = store.mated_faces()
    if isinstance(index, FaissIndex):  # the faces it was made without (kept out of its graph, or of its training), as a new photo
        new = index.held_out_of(ids)
        ids, subjects = ids[new], subjects[new]
    faces = store.lookup_faces(one_per_subject(ids, subjects, sample, rng).tolist())
    left_out = np.array(sorted(faces), np.int64)
    vectors = [np.stack([faces[int(i)][2] for i in left_out])] if len(left_out) else []
    mirrored = 0
    if (wanted := sample - len(left_out)) > 0:
        drawn = store.lookup_faces(index.sample_ids(wanted, rng).tolist())
        ids = np.array(sorted(drawn), np.int64)
        if len(ids):
            own = np.stack([drawn[int(i)][2] for i in ids]).astype(np.float32)
            near = perturbed(own, rng)
            if embed is not None and template is not None:
                chips = store.face_chips(ids.tolist())
                if chips:
                    rows = [k for k, i in enumerate(ids) if int(i) in chips]
                    near[rows] = embed(np.stack([chips[int(ids[k])].align(template)[:, ::-1] for k in rows]))
                    mirrored = len(rows)
            vectors.append(near)
            left_out = np.concatenate([left_out, np.full(len(near), -1, np.int64)])
    if not vectors:
        raise ValueError("the index holds no face the store has: nothing to sample")
    queries = np.concatenate(vectors).astype(np.float32)
    probe = Probe(queries, left_out, mirrored, np.zeros(len(queries), np.float32))
    return without_copies(store, probe, NEAR_COPY if near_copy is None else near_copy)


def without_copies(store: GalleryStore, probe: Probe, bound: float) -> Probe:
    """`probe` with its exact answers, each enrolled face searched without its near copies too: the
    faces at `bound` or more to it, whatever their subject (a mirrored or re-cropped enrolment of the
    same photo), which a new photo has none of; a face with more than COPIES of them is dropped."""
    scores, ids = exact_top(store, probe.queries, COPIES + 1, probe.left_out)
    mated = probe.left_out >= 0
    copy = (scores >= bound) & mated[:, None]
    first = np.argmin(copy, axis=1)  # the best that is not a copy
    kept = ~copy.all(1)
    best = scores[np.arange(len(scores)), first]
    copies = np.where(copy, ids, -1)[:, : max(int(copy[kept].sum(1).max(initial=0)), 1)]  # as wide as the most copies kept
    return replace(probe, queries=probe.queries[kept], left_out=probe.left_out[kept], best=best[kept], copies=copies[kept])


def one_per_subject(ids: np.ndarray, subjects: np.ndarray, sample: int, rng: np.random.Generator) -> np.ndarray:
    """`sample` of `ids` at random, a face of as many subjects as there are before a second of any:
    a new photo is of a person, whatever how many photos they enrolled (drawn face by face, a few
    people with hundreds of near-identical photos would make the index look better than it is)."""
    if len(ids) == 0:
        return ids
    order = rng.permutation(len(ids))
    code = np.unique(subjects[order], return_inverse=True)[1]
    by_subject = np.argsort(code, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(code[by_subject]) != 0])
    rank = np.empty(len(ids), np.int64)
    rank[by_subject] = np.arange(len(ids)) - np.repeat(starts, np.diff(np.r_[starts, len(ids)]))  # the face's place among its subject's
    return np.sort(ids[order[np.argsort(rank, kind="stable")[:sample]]])


def measured(store: GalleryStore, index: VectorIndex, probe: Probe, started: float | None = None) -> RecallResult:
    """recall@1 of `index` (its approximate search, at the parameters in force) on `probe` (`started`:
    when the check began, for the seconds it reports; None: now). An HNSW index's faces for the
    check are in no graph (its aside): only their near copies are hidden in it, and both searches
    agree where there are none. A face in a graph (an HNSW file saved before the aside) still draws
    the search to itself, next to its subject's other faces, and over-reports; hidden, it leaves a
    hole a new photo's graph has not (0.035 low at efSearch 16 on 100k faces). The hidden figure is
    the one reported, the lower: under the minimum it widens the search sooner, which costs time,
    not answers; both are kept (docs/benchmarks.md)."""
    started = time.monotonic() if started is None else started
    mated = probe.left_out >= 0
    if not len(probe.queries):
        raise ValueError("no query to search")
    found = index_best(store, index, probe.queries, probe.leaving)
    assert found is not None  # not hidden: every index answers
    hit = found >= probe.best - TIE
    hidden = index_best(store, index, probe.queries[mated], probe.leaving[mated], hide=True) if mated.any() else None
    bounds = None
    if hidden is not None:
        bounds = (float(np.mean(hidden >= probe.best[mated] - TIE)), float(hit[mated].mean()))
        hit[mated] = hidden >= probe.best[mated] - TIE
    described = index.describe()
    return RecallResult(
        recall_at_1=float(hit.mean()),
        mated=float(hit[mated].mean()) if mated.any() else None,
        mated_bounds=bounds,
        near_copies=float(hit[~mated].mean()) if (~mated).any() and not probe.live else None,
        queries=len(hit),
        mated_queries=int(mated.sum()),
        mirrored=probe.mirrored,
        faces=int(described.get("size", 0)),
        index=f"{described.get('backend')} {described.get('factory') or described.get('index_type') or ''}".strip(),
        search_params=str(described.get("search_params", "")),
        answers="exact" if index.answers_exactly else "index",
        checked_at=time.time(),
        seconds=round(time.monotonic() - started, 3),
        source="live" if probe.live else "held-out",
        live_sampled=probe.sampled,
        interval=wilson(int(hit.sum()), len(hit)),
    )


def wilson(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of the share `hits` / `n` (95 % by default): where the recall of the
    kind of query sampled lies, given the sampling alone. Not the normal one (± z standard errors),
    which shrinks to nothing at a share of 1 and runs past 1 near the minimum's 0.97. Written here: the
    serving image has no SciPy (`binomtest(...).proportion_ci(method="wilson")`, which the tests hold it to)."""
    if n <= 0:
        return (0.0, 1.0)
    share, spread = hits / n, z * z / n
    centre = (share + spread / 2) / (1 + spread)
    half = z * math.sqrt(share * (1 - share) / n + spread / (4 * n)) / (1 + spread)
    return (round(max(centre - half, 0.0), 4), round(min(centre + half, 1.0), 4))


def live_probe(store: GalleryStore, queries: np.ndarray, decisions: list[Decision]) -> Probe:
    """The live queries whose exact best passes the decision they were searched for (mated: the
    match /identify owed them), with that best; the others (strangers) are left out: where the
    answer is no match whatever the index finds, its recall does not matter."""
    if not decisions:
        return Probe(np.zeros((0, 0), np.float32), np.zeros(0, np.int64), 0, np.zeros(0, np.float32), live=True)
    mated, best = passing(store, queries, decisions)
    kept = queries[mated]
    return Probe(kept, np.full(len(kept), -1, np.int64), 0, best[mated], live=True, sampled=len(queries))


def passing(store: GalleryStore, queries: np.ndarray, decisions: list[Decision]) -> tuple[np.ndarray, np.ndarray]:
    """Whether each query's exact answer passes its decision (its best subject's score, ranked as
    /identify ranks them, at or above the threshold), and its exact best similarity."""
    scores, ids = exact_top(store, queries, LIVE_TOP)
    stored = store.lookup_faces(sorted(set(ids[ids >= 0].tolist())))
    mated = np.zeros(len(queries), bool)
    for row, (query, decision) in enumerate(zip(queries, decisions, strict=True)):
        candidates = ranked(query, {int(i): stored[int(i)] for i in ids[row] if int(i) in stored})[: max(decision.candidates_needed, 1)]
        mated[row] = bool(candidates) and float(decision.scores(query, candidates)[0]) >= decision.threshold
    return mated, scores[:, 0]


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


def pages(store: GalleryStore) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Every face of the active embedder, a page of (ids, vectors) at a time, in id order."""
    after = 0
    while True:
        ids, vectors = store.embeddings_after(after, PAGE)
        if len(ids) == 0:
            return
        yield ids, vectors
        after = int(ids[-1])


def exact_best(store: GalleryStore, queries: np.ndarray, left_out: np.ndarray | None = None) -> np.ndarray:
    """Each query's highest similarity over every face the store holds for the active embedder but
    the one it leaves out."""
    return exact_top(store, queries, 1, left_out)[0][:, 0]


def exact_top(store: GalleryStore, queries: np.ndarray, k: int, left_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each query's k most similar faces of the store's (the active embedder's) but those it leaves
    out (a face, or a row of them; -1: none), best first: scores and ids (−inf and −1 past the faces there are), a page at a time (FAISS's
    brute-force search: one thread, the GIL released)."""
    left_out = np.full((len(queries), 1), -1, np.int64) if left_out is None else left_out.reshape(len(queries), -1)
    best = np.full((len(queries), k), -np.inf, np.float32)
    best_ids = np.full((len(queries), k), -1, np.int64)
    for ids, vectors in pages(store):
        scores, places = faiss.knn(
            queries, np.ascontiguousarray(vectors, np.float32), min(k + left_out.shape[1], len(ids)), metric=faiss.METRIC_INNER_PRODUCT
        )
        found = np.where(places >= 0, ids[np.maximum(places, 0)], -1)
        scores[(found[:, :, None] == left_out[:, None, :]).any(2) | (found < 0)] = -np.inf
        best, best_ids = best_of(k, (best, best_ids), (scores, found))
    return best, np.where(np.isfinite(best), best_ids, -1)


def index_best(
    store: GalleryStore, index: VectorIndex, queries: np.ndarray, left_out: np.ndarray | None = None, hide: bool = False
) -> np.ndarray | None:
    """Each query's highest similarity among the CANDIDATES faces the index proposes (those it leaves
    out dropped: a face, or a row of them), re-scored from the store's embeddings: what /identify's search would rank first. `hide`:
    with each query's own face hidden in an HNSW graph while it is searched (None where the index
    cannot hide it)."""
    left_out = np.full((len(queries), 1), -1, np.int64) if left_out is None else left_out.reshape(len(queries), -1)
    hider = index if isinstance(index, FaissIndex) else None
    if hide and hider is None:
        return None
    counts = (left_out >= 0).sum(1)
    ids = np.full((len(queries), CANDIDATES + counts.max(initial=0)), -1, np.int64)
    for count in np.unique(counts):  # CANDIDATES once those left out are dropped: no more (an HNSW search's k widens its efSearch)
        rows = np.flatnonzero(counts == count)
        asked = CANDIDATES + int(count)
        found = (
            hider.search_hiding(queries[rows], asked, left_out[rows])
            if hide and hider
            else index.search(queries[rows], asked, approximate=True)[1]
        )
        if found is None:  # not an HNSW graph over flat vectors: nothing to hide
            return None
        ids[rows, : found.shape[1]] = found  # fewer columns where the index holds fewer faces
    proposed = [[int(i) for i in row if i >= 0 and i not in skip][:CANDIDATES] for row, skip in zip(ids, left_out.tolist(), strict=True)]
    stored = store.lookup_faces(sorted({i for row in proposed for i in row}))
    best = np.full(len(queries), -np.inf, np.float32)
    for row, (query, candidates) in enumerate(zip(queries, proposed, strict=True)):
        vectors = [stored[i][2] for i in candidates if i in stored]
        if vectors:
            best[row] = float(np.max(np.stack(vectors) @ query))
    return best
