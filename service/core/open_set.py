"""Open-set identification without a cohort: the margin score, its calibrated table, and the
gallery's own guard (issue 35; docs/api.md, "Identify decisions").

A stranger's best cosine says as much about the probe as about the gallery: some faces score high
against everyone. The margin score uses the gallery itself as the cohort:

    S = s1 + 0.5 · (s1 − mean(s2 … s(k+1))),  k = min(10, N − 1)

where s1 ≥ s2 ≥ … are the probe's cosines to the best face of each of the N enrolled subjects. The
top subject is the match when S ≥ T(N, FPIR):

- `T_sim(N, q)`, the table in the model's manifest (`facegate calibrate-open-set`): the (1 − q)
  quantile of S for strangers in galleries of N calibration identities, interpolated in log N and
  log q (and in faces per subject, between the tables for one face and for several);
- from GUARD_FROM subjects up, a guard from the gallery itself: each enrolled face's S against the
  other subjects (leave one subject out, `LeaveOneOut`) is one sample of a stranger's S in this very
  gallery. Its tail gives T_LOSO(r) (`Tail`), and

      T = min(max(T_sim(N, q), T_LOSO(2q)), 2 · T_sim(N, q) − T_sim(N, 10q)):

  stricter than the table only when the gallery's own faces say strangers would pass at over twice
  the promise (people who look alike), and never more than about a decade stricter.

Below the table's `cosine_below` subjects (31 for the default model: a home's 1-30 people) the best
subject's cosine s1 alone decides, held to the table's cosine rows T_cos(N, q) (calibrated as T_sim,
on s1): next to a handful of other subjects their mean is noise (on LFW the margin found 4.7 points
fewer people than the plain cosine at 2 subjects), and up to 30 the rows on each subject's mean
name fewer strangers (docs/api.md, "Small galleries").
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import pairwise

import faiss
import numpy as np

from service.core.lookups import ById, Names, by_id
from service.core.models.manifest import OpenSetTable

K = 10  # the next subjects the best one is compared with
WEIGHT = 0.5
GUARD_FROM = 100  # subjects: below, too few leave-one-out samples for a tail
TAIL_MIN = 10  # the guard's tail is fitted to the max(TAIL_MIN, ⌈TAIL_SHARE · n⌉) highest samples
TAIL_SHARE = 0.1
LOWEST_RATE = 1e-12  # a score's rate is searched down to here (a calibrated similarity of 1)
BLOCK = 4096  # faces whose leave-one-out lists are searched at once
OWN_FACES = 64  # a subject's faces a leave-one-out search asks for beyond 4 × (K + 1); more: listed by `_lists_exactly`
EXACT_BLOCK = 1024  # rows `_lists_exactly` lists at once
SLICE = 4096  # faces a block of rows is multiplied with at once there (EXACT_BLOCK × SLICE float32: 16 MiB)
SAMPLE_FROM = 50_000  # faces from which the guard lists a seeded sample of them (`sample_share`): below, its exact build costs ≤ 10 s CPU
LISTED = 20_000  # a sampled guard lists LISTED to 2 × LISTED faces: its threshold within 0.005 of the exact one (docs/benchmarks.md)
SEED = 0x5EED_F00D_CAFE_D00D  # which faces a sampled guard lists: a hash of the id, the same in every process


def margin_scores(top: np.ndarray, subjects: int) -> np.ndarray:
    """S of each row of `top` (cosines to the best face of each subject, highest first, the best
    subject in column 0) in a gallery of `subjects`; a row with fewer columns than k + 1 (a search
    that found fewer subjects) averages those it has, and one with a single column is its cosine."""
    top = np.asarray(top, np.float64)
    others = min(K, subjects - 1, top.shape[-1] - 1)
    if others <= 0:
        return top[..., 0]
    return top[..., 0] + WEIGHT * (top[..., 0] - top[..., 1 : others + 1].mean(axis=-1))


def mean_template(faces: np.ndarray) -> np.ndarray:
    """A subject's mean template: its faces' embeddings (the last axis) averaged over the one before
    it, and normalized, so a probe's cosine with it is a dot product as with a face."""
    mean = np.asarray(faces, np.float32).mean(axis=-2)
    return mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)


def candidate_scores(cosines: np.ndarray, subjects: int) -> np.ndarray:
    """Each of a search's candidates (best first) scored against the same next subjects as the
    best: its cosine + 0.5 · (its cosine − mean(s2 … s(k+1))). The best one's is its S; the
    others rank as their cosines do (what the compatibility routes turn into similarities)."""
    cosines = np.asarray(cosines, np.float64)
    others = min(K, subjects - 1, len(cosines) - 1)
    if others <= 0:
        return cosines
    return cosines + WEIGHT * (cosines - cosines[1 : others + 1].mean())


@dataclass(frozen=True)
class Tail:
    """The upper tail of the gallery's leave-one-subject-out scores: its `m` highest of `samples`
    (one per enrolled face) lie above `u`, by `beta` on average (an exponential tail)."""

    samples: int
    subjects: int
    m: int
    u: float
    beta: float

    @classmethod
    def of(cls, scores: np.ndarray, subjects: int) -> Tail | None:
        """The tail of these leave-one-out scores; None below GUARD_FROM subjects."""
        scores = np.asarray(scores, np.float64)
        scores = scores[np.isfinite(scores)]
        n = len(scores)
        m = max(TAIL_MIN, math.ceil(TAIL_SHARE * n))
        if subjects < GUARD_FROM or n <= m:
            return None
        top = np.sort(np.partition(scores, n - m - 1)[n - m - 1 :])[::-1]  # the m + 1 highest, highest first
        u = float(top[m])
        return cls(n, subjects, m, u, max(float(np.mean(top[:m] - u)), 1e-9))

    def threshold(self, rate: float) -> float:
        """T_LOSO(r) = u + β · ln((m / n) / r′), r′ = 1 − (1 − r)^((N − 1) / N): the leave-one-out
        samples are searches of N − 1 subjects, a stranger's of N."""
        rate = min(rate, 1 - 1e-12)
        per = -math.expm1((self.subjects - 1) / self.subjects * math.log1p(-rate))
        return self.u + self.beta * math.log((self.m / self.samples) / per)


@dataclass(frozen=True)
class GalleryShape:
    """What an open-set decision needs to know of the gallery: the subjects and faces searched,
    and its leave-one-out tail (None below GUARD_FROM subjects, or where no guard is kept)."""

    subjects: int
    faces: int
    tail: Tail | None = None

    @property
    def faces_per_subject(self) -> float:
        return self.faces / self.subjects if self.subjects else 1.0


def _interpolate(x: float, xs: list[float], ys: list[float]) -> tuple[float, bool]:
    """Linear in x between the points (xs rising), extended along the last segment beyond the
    last point (True: extrapolated) and held at the first below the first."""
    if x <= xs[0] or len(xs) == 1:
        return ys[0], x > xs[0]
    for (xa, ya), (xb, yb) in pairwise(zip(xs, ys, strict=True)):
        if x <= xb:
            return ya + (yb - ya) * (x - xa) / (xb - xa), False
    (xa, ya), (xb, yb) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
    return yb + (yb - ya) * (x - xb) / (xb - xa), True


def on_cosine(table: OpenSetTable, subjects: int) -> bool:
    """Whether a gallery of this many subjects is decided on the best cosine (the table's cosine rows)."""
    return subjects < table.cosine_below


def table_threshold(
    table: OpenSetTable, subjects: int, fpir: float, faces_per_subject: float = 1.0, cosine: bool = False
) -> tuple[float, bool]:
    """T_sim(N, q) (`cosine`: T_cos(N, q), from the cosine rows): the table's thresholds interpolated
    linearly in ln N and in log10 q (beyond the largest gallery and below the smallest FPIR, along the
    last segment: True), then linearly in faces per subject between the tables (held at the last
    table's beyond it: True)."""
    lx = -math.log10(fpir)  # rising as the fpir falls
    rates = [-math.log10(q) for q in table.fpirs]
    per_table = []
    tables = table.cosine_tables if cosine else table.tables
    for rows in tables:
        by_size = []
        extrapolated = False
        for row in rows.thresholds:
            t, beyond = _interpolate(lx, rates, row)
            by_size.append(t)
            extrapolated |= beyond
        t, beyond = _interpolate(math.log(max(subjects, 1)), [math.log(n) for n in rows.subjects], by_size)
        per_table.append((t, extrapolated or beyond))
    faces = [float(rows.faces_per_subject) for rows in tables]
    if faces_per_subject <= faces[0] or len(faces) == 1:
        t, extrapolated = per_table[0]
        return t, extrapolated or (len(faces) == 1 and faces_per_subject > faces[0])
    for (fa, (ta, ea)), (fb, (tb, eb)) in pairwise(zip(faces, per_table, strict=True)):
        if faces_per_subject <= fb:
            return ta + (tb - ta) * (faces_per_subject - fa) / (fb - fa), ea or eb
    t, extrapolated = per_table[-1]
    return t, True


@dataclass(frozen=True)
class MarginThreshold:
    """How T came about for one FPIR: the table's, the guard's, and the cap."""

    threshold: float
    table: float
    guard: float | None  # T_LOSO(2q); None without a tail
    extrapolated: bool  # the table was read beyond its calibrated sizes, rates or faces per subject
    cosine: bool = False  # the best cosine alone decides (a gallery below the table's cosine_below), T_cos(N, q)


def margin_threshold(table: OpenSetTable, shape: GalleryShape, fpir: float) -> MarginThreshold:
    """T = min(max(T_sim(N, q), T_LOSO(2q)), 2 · T_sim(N, q) − T_sim(N, 10q)), or T_sim(N, q) without a
    tail; below the table's cosine_below subjects T_cos(N, q) (the guard's samples are margin scores)."""
    f = shape.faces_per_subject
    cosine = on_cosine(table, shape.subjects)
    sim, extrapolated = table_threshold(table, shape.subjects, fpir, f, cosine)
    if shape.tail is None or cosine:
        return MarginThreshold(sim, sim, None, extrapolated, cosine)
    loose, _ = table_threshold(table, shape.subjects, min(10 * fpir, table.fpirs[0]), f)
    guard = shape.tail.threshold(2 * fpir)
    return MarginThreshold(min(max(sim, guard), 2 * sim - loose), sim, guard, extrapolated)


def rate_knots(table: OpenSetTable, shape: GalleryShape) -> tuple[list[float], list[float]]:
    """log10 q at the table's FPIRs (with the guard, a decade below each too: where T_sim(N, 10q)
    bends), between LOWEST_RATE and its largest, rising, and T there, falling: what `margin_rate`
    inverts, read once per decision (`Margin.knots`)."""
    low, high = math.log10(LOWEST_RATE), math.log10(table.fpirs[0])
    bends = [math.log10(q) for q in table.fpirs]
    if shape.tail is not None and not on_cosine(table, shape.subjects):
        bends += [lq - 1 for lq in bends]
    logs = sorted({low, high, *(lq for lq in bends if low < lq < high)})
    return logs, [margin_threshold(table, shape, 10**lq).threshold for lq in logs]


def margin_rate(table: OpenSetTable, shape: GalleryShape, score: float, knots: tuple[list[float], list[float]] | None = None) -> float:
    """The FPIR whose threshold is `score` (the inverse of `margin_threshold` in q, which falls as
    q rises): the rate of strangers who score this high, between LOWEST_RATE and the table's largest
    FPIR. Between two knots T_sim(N, q) and T_sim(N, 10q) are linear in log10 q, so without the guard
    (a cosine decision, no tail) T is inverted exactly there, and with it T is one of three curves
    inverted in closed form (a search's candidates ask it once each: bisecting cost ~2 ms a call)."""
    logs, ts = knots or rate_knots(table, shape)
    if score <= ts[-1]:
        return 10 ** logs[-1]
    if score >= ts[0]:
        return 10 ** logs[0]
    i = next(i for i, t in enumerate(ts) if t <= score)  # ts[i - 1] > score >= ts[i]
    low, high = logs[i - 1], logs[i]
    if shape.tail is None or on_cosine(table, shape.subjects):
        return 10 ** (low + (high - low) * (ts[i - 1] - score) / (ts[i - 1] - ts[i]))
    for lq in _guarded_roots(table, shape, score, low, high):
        if low <= lq <= high and abs(margin_threshold(table, shape, 10**lq).threshold - score) <= 1e-9:
            return 10**lq
    while high - low > 1e-12:  # not found (rounding at a bend): bisection in log q
        mid = (low + high) / 2
        if margin_threshold(table, shape, 10**mid).threshold > score:
            low = mid
        else:
            high = mid
    return 10 ** ((low + high) / 2)


def _guarded_roots(table: OpenSetTable, shape: GalleryShape, score: float, low: float, high: float) -> list[float]:
    """Where each curve T = min(max(sim, guard), 2 · sim − loose) is made of reaches `score` between
    two knots (log10 q): sim and loose linear there, the guard's exponential tail in closed form."""
    f, tail = shape.faces_per_subject, shape.tail
    assert tail is not None
    sim = [table_threshold(table, shape.subjects, 10**lq, f)[0] for lq in (low, high)]
    loose = [table_threshold(table, shape.subjects, min(10 ** (lq + 1), table.fpirs[0]), f)[0] for lq in (low, high)]
    roots = []
    for a, b in ((sim[0], sim[1]), (2 * sim[0] - loose[0], 2 * sim[1] - loose[1])):
        if a != b:
            roots.append(low + (high - low) * (a - score) / (a - b))
    per = (tail.m / tail.samples) * math.exp(-(score - tail.u) / tail.beta)  # Tail.threshold read backwards, at 2q
    if 0 < per < 1:
        roots.append(math.log10(-math.expm1(tail.subjects / (tail.subjects - 1) * math.log1p(-per)) / 2))
    return roots


def sample_share(faces: int) -> float:
    """The share of a gallery's faces whose leave-one-out lists the guard keeps: all below
    SAMPLE_FROM faces, else 2^-k, the largest keeping at least LISTED of them (a power of two: a
    gallery grown past the next halving drops half its sampled faces, and nothing is listed anew).
    The sample's tail reads the threshold within 0.005 of the exact one down to q = 1e-4 (80k and
    100k synthetic faces, 8 seeds; 10,000 listed: 0.009), for the sample × N products where the exact
    guard costs N² (docs/benchmarks.md, "A sampled guard"; module constants read at each call: tests lower them)."""
    if faces < SAMPLE_FROM:
        return 1.0
    return 2.0 ** -max(0, math.floor(math.log2(faces / LISTED)))


def sampled(ids: np.ndarray, share: float) -> np.ndarray:
    """Which of these face ids a guard keeping `share` of the faces lists: a seeded hash of each id
    (splitmix64) below the share, so that the sample is the faces', whatever order they came in,
    and a face keeps its place in it as others come and go."""
    z = np.asarray(ids, np.int64).reshape(-1).astype(np.uint64)
    if share >= 1:
        return np.ones(len(z), bool)
    z = z + np.uint64(SEED)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) < share * 2.0**53


class Roster:
    """Which subject each searchable face belongs to, kept in step with the gallery's index: the
    N and faces a decision is read for, without the guard (FACEGATE_OPEN_SET_GUARD=false). Its faces'
    subject codes by id, the subjects' names and the faces per subject code are arrays (`ById`,
    `Names`: a snapshot's, mapped copy-on-write)."""

    def __init__(self, by_id: ById | None = None, names: Names | None = None, counts: np.ndarray | None = None):
        self._lock = threading.Lock()
        self._by_id = ById() if by_id is None else by_id
        self._names = Names() if names is None else names
        self._counts = np.empty(0, np.int64) if counts is None else counts  # faces per subject code
        self._faces, self._subjects = int(self._counts.sum()), int(np.count_nonzero(self._counts))

    @classmethod
    def of(cls, ids: np.ndarray, subjects: Iterable[str]) -> Roster:
        """These faces (unique ids) of these subjects."""
        names, codes = np.unique(np.array(list(subjects), object), return_inverse=True)
        codes = codes.reshape(-1)
        faces = ById.of(np.asarray(ids, np.int64).reshape(-1), codes)
        return cls(faces, Names.of(names.tolist()), np.bincount(codes, minlength=len(names)).astype(np.int64))

    def arrays(self) -> dict[str, np.ndarray]:
        """Its faces' ids, sorted, and their subject codes, the faces per code and the names by code:
        for a `Roster` of them in another process (gallery/snapshot.py)."""
        with self._lock:
            ids, codes = self._by_id.arrays()
            return {"ids": ids, "subject": codes, "counts": self._counts, **self._names.arrays()}

    def add(self, ids: np.ndarray, subjects: Iterable[str], vectors: np.ndarray | None = None) -> None:
        with self._lock:
            for face_id, subject in zip(np.asarray(ids).reshape(-1).tolist(), list(subjects), strict=True):
                if self._by_id.get(face_id) < 0:
                    code = self._names.coded(subject)
                    if code >= len(self._counts):
                        self._counts = _grown(self._counts, max(64, 2 * len(self._counts)), 0)
                    self._by_id.set(face_id, code)
                    self._subjects += int(self._counts[code] == 0)
                    self._counts[code] += 1
                    self._faces += 1

    def remove(self, ids: np.ndarray) -> None:
        with self._lock:
            for face_id in np.asarray(ids).reshape(-1).tolist():
                code = self._by_id.pop(face_id)
                if code >= 0:
                    self._counts[code] -= 1
                    self._subjects -= int(self._counts[code] == 0)
                    self._faces -= 1

    def shape(self) -> GalleryShape:
        with self._lock:
            return GalleryShape(self._subjects, self._faces)

    def ids(self) -> np.ndarray:
        """The faces it holds (what a follower past the log compares with the store's)."""
        with self._lock:
            return self._by_id.arrays()[0]


class LeaveOneOut:
    """Each enrolled face's margin score against the other subjects, kept exact as faces are added
    and removed, and the tail the guard reads from them.

    Per face it keeps the cosines to the best face of its K + 1 most similar other subjects. A new
    face costs one product with every listed face (the lists it enters) and, listed itself, with
    every face (its own list); a removed face
    recomputes the lists that named its subject. The state depends only on the set of faces (and,
    sampled, the largest size since its build), not on the order they came in: every replica that
    applied the same changes holds the same.

    From SAMPLE_FROM faces (with `sample`) it keeps the lists of a seeded sample of the faces only
    (`sample_share`, `sampled`), each searched against every face: the build costs the sample × N
    products, not N², and the tail is read from the sample's scores. The share is the build's,
    lowered as the gallery grows (never raised before the next build: a gallery grown and shrunk
    again keeps the smaller share); `nearest_others(subject=…)` lists any subject's faces exactly.
    Thread-safe: writes and reads take its lock.
    """

    def __init__(self, dim: int, sample: bool = True):
        self.dim, self.width, self.sample = dim, K + 1, sample
        self.share = 1.0  # of the faces whose lists are kept (`sampled`)
        self._lock = threading.Lock()
        self._n = 0
        self._vectors = np.empty((0, dim), np.float32)
        self._ids = np.empty(0, np.int64)
        self._subject = np.empty(0, np.int32)  # subject codes
        self._top = np.empty((0, self.width), np.float32)  # cosines to the best face of the nearest other subjects, highest first
        self._top_subject = np.empty((0, self.width), np.int32)  # their codes (-1: none)
        self._score = np.empty(0, np.float64)
        self._on = np.empty(0, bool)  # the row's face is in the sample: its list is kept (derived from the ids, never saved)
        self._by_id = ById()  # face id → row
        self._names = Names()  # subject code ↔ subject
        self._counts = np.empty(0, np.int64)  # faces per subject code
        self._subjects = 0
        self._tail: Tail | None = None
        self._tail_current = True
        self._readers = 0  # subjects' scorings reading its vectors, ids and subject codes with the lock released

    @classmethod
    def build(
        cls, ids: np.ndarray, subjects: Iterable[str], vectors: np.ndarray, sample: bool = True, share: float | None = None
    ) -> LeaveOneOut:
        """The state of these faces, computed a block of faces at a time (`sample` False: every face
        listed, at any size; `share`: that share listed, not the size's: 0 for none, the faces kept for
        `nearest_others(subject=…)` alone)."""
        vectors = np.asarray(vectors, np.float32)
        ids = np.asarray(ids, np.int64).reshape(-1)
        state = cls(vectors.shape[1], sample)
        with state._lock:
            state.share = share if share is not None else sample_share(len(ids)) if sample else 1.0
            state._append(ids, list(subjects), vectors)
            state._by_id = ById.of(ids, np.arange(len(ids)))
            rows = np.flatnonzero(state._on[: state._n])
            state._relist(rows)
            state._rescore(rows)
        return state

    def arrays(self, capacity: int) -> dict[str, np.ndarray]:
        """Its state as arrays of `capacity` rows (at least its faces), for `restore` in another
        process: the rows past the faces are room for faces added there without growing
        (gallery/snapshot.py); with its rows by face id and its subjects' names (`ById`, `Names`)."""
        with self._lock:
            return self._arrays(capacity)

    @classmethod
    def restore(cls, n: int, arrays: dict[str, np.ndarray], share: float = 1.0, sample: bool = True) -> LeaveOneOut:
        """The state `arrays` (of a first `n` faces, by `arrays()`, listing `share` of them) hold, in
        place: arrays mapped copy-on-write stay shared with the other processes mapping them until a
        change writes a page, and no Python object is made per face or subject (`ById`, `Names`)."""
        state = cls(arrays["vectors"].shape[1], sample)
        if arrays["top"].shape[1:] != (state.width,):
            raise ValueError(f"the arrays list {arrays['top'].shape[1:]} other subjects a face, this guard {state.width}")
        for name in (*_ROWS, "counts"):
            setattr(state, f"_{name}", arrays[name])
        state._n, state.share = n, share
        state._by_id, state._names = ById(arrays["sorted_ids"], arrays["sorted_rows"]), Names.restore(arrays)
        state._on = _grown(sampled(arrays["ids"][:n], share), len(arrays["ids"]), False)
        state._subjects = int(np.count_nonzero(arrays["counts"][: len(state._names)]))
        state._tail_current = False
        return state

    def copy(self, locked: bool = True) -> LeaveOneOut:
        """Its state now, in arrays of its own (what is saved while this one goes on changing).
        `locked=False`: read without its lock, by a caller that keeps every change out meanwhile
        (the gallery follower's lock): its readers are not held while it is copied."""
        with self._lock if locked else nullcontext():
            n, arrays, share = self._n, self._arrays(self._n), self.share
        return LeaveOneOut.restore(n, arrays, share, self.sample)

    def ids(self) -> np.ndarray:
        with self._lock:
            return self._ids[: self._n].copy()

    def shape(self) -> GalleryShape:
        with self._lock:
            if not self._tail_current:
                self._tail = Tail.of(self._score[: self._n], self._subjects)
                self._tail_current = True
            return GalleryShape(self._subjects, self._n, self._tail)

    @property
    def complete(self) -> bool:
        """Every face's list is kept (not a sample): `nearest_others` reads them all."""
        return self.share >= 1

    def nearest_others(
        self, at_least: float = -np.inf, by_cosine: bool = False, subject: str | None = None
    ) -> list[tuple[int, str, str, float, float]]:
        """Per face whose score (`by_cosine`: whose cosine with the most similar other subject) is at
        least `at_least`: (face id, its subject, that other subject, its best face's cosine, the face's
        score). Of every listed face (a sampled guard's: the sample's), picked in one vectorized pass
        over the arrays, the lock held for Python work on the faces kept only (what `facegate gallery
        duplicates` and GET /gallery/duplicates list, at their threshold); or (`subject`) of that
        subject's faces, listed here and now by an exact search of each against every face, sampled or
        not, with the lock released: searches and changes go on meanwhile (`_subject_lists`)."""
        if subject is not None:
            ids, own, top, top_subject, names, subjects = self._subject_lists(subject)
            return _picked(ids, own, top, top_subject, _scores(top, subjects), names, at_least, by_cosine)
        with self._lock:
            n = self._n
            return _picked(
                self._ids[:n], self._subject[:n], self._top[:n], self._top_subject[:n], self._score[:n], self._names, at_least, by_cosine
            )

    def _subject_lists(self, subject: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Names, int]:
        """A subject's faces (ids and codes), their lists searched from every face, the names by code
        and the subjects, as of one moment: under the lock only the faces' arrays are taken (and
        `_readers` counted: a change that would write them in place copies them first, `_unshare`);
        the search runs with the lock released."""
        with self._lock:
            n, vectors = self._n, self._vectors
            rows = np.flatnonzero(self._subject[:n] == self._names.code(subject))
            faces = Faces(vectors[:n], self._subject[:n], self._counts.copy(), self.width)
            ids, own, names, subjects = self._ids[rows], self._subject[rows], self._names, self._subjects
            self._readers += 1
        try:
            top, top_subject = faces.lists(rows)
        finally:
            with self._lock:
                if self._vectors is vectors:  # not replaced since (`_unshare`, grown): still counted
                    self._readers -= 1
        return ids, own, top, top_subject, names, subjects

    def add(self, ids: np.ndarray, subjects: Iterable[str], vectors: np.ndarray | None = None) -> None:
        """New faces (`subjects`: each one's subject id): each enters the lists of the faces it is now
        among the nearest other subjects of, and gets its own from one product with every face."""
        if vectors is None:
            raise ValueError("the guard keeps every face's embedding")
        ids, vectors = np.asarray(ids, np.int64).reshape(-1), np.asarray(vectors, np.float32).reshape(-1, self.dim)
        with self._lock:
            before = self._subjects
            for face_id, subject, vector in zip(ids.tolist(), list(subjects), vectors, strict=True):
                if self._by_id.get(face_id) >= 0:
                    continue
                self._append(np.array([face_id], np.int64), [subject], vector[None])
                row, code = self._n - 1, self._subject[self._n - 1]
                self._by_id.set(face_id, row)
                kept = np.flatnonzero(self._on[:row])  # the lists it may enter: a sampled guard's, a product with those faces only
                cosines = self._vectors[: self._n] @ vector if self._on[row] else None
                changed = self._enter(kept, self._vectors[kept] @ vector if cosines is None else cosines[kept], code)
                if cosines is not None:  # in the sample: its own list, from every face
                    own = self._subject[: self._n] == code
                    self._top[row], self._top_subject[row] = _nearest_subjects(
                        np.where(own, -np.inf, cosines), self._subject[: self._n], self.width
                    )
                    changed = np.append(changed, row)
                self._rescore(changed)
            self._after(before)

    def remove(self, ids: np.ndarray) -> None:
        """Faces gone: the lists that named one of their subjects are computed again."""
        with self._lock:
            before = self._subjects
            rows = sorted((row for i in np.asarray(ids).reshape(-1).tolist() if (row := self._by_id.pop(i)) >= 0), reverse=True)
            if not rows:
                return
            if self._readers:  # a subject's scoring reads the arrays the rows move in
                self._unshare()
            touched = np.unique(self._subject[rows])
            for row in rows:  # the last row moves into each freed one
                code = self._subject[row]
                self._counts[code] -= 1
                self._subjects -= int(self._counts[code] == 0)
                last = self._n - 1
                if row != last:
                    for array in (self._vectors, self._ids, self._subject, self._top, self._top_subject, self._score, self._on):
                        array[row] = array[last]
                    self._by_id.set(int(self._ids[row]), row)
                self._n = last
            stale = np.flatnonzero(np.isin(self._top_subject[: self._n], touched).any(axis=1))
            self._relist(stale)
            self._rescore(stale)
            self._after(before)

    # internals (the lock held)

    def _unshare(self) -> None:
        """Arrays of its own for the rows a change writes in place: the ones a scoring reads stay as
        they were (its references keep them until it ends)."""
        self._vectors, self._ids, self._subject = self._vectors.copy(), self._ids.copy(), self._subject.copy()
        self._readers = 0

    def _arrays(self, capacity: int) -> dict[str, np.ndarray]:
        rows = max(capacity, self._n)
        out = {name: _grown(getattr(self, f"_{name}")[: self._n], rows, fill) for name, fill in _ROWS.items()}
        out["counts"] = _grown(self._counts[: len(self._names)], max(rows, len(self._names), 64), 0)
        out["sorted_ids"], out["sorted_rows"] = by_id(self._ids[: self._n], np.arange(self._n))
        return {**out, **self._names.arrays()}

    def _append(self, ids: np.ndarray, subjects: list[str], vectors: np.ndarray) -> None:
        needed = self._n + len(ids)
        if needed > len(self._ids):
            capacity = max(needed, 2 * len(self._ids), 64)
            self._vectors = _grown(self._vectors, capacity)
            self._ids = _grown(self._ids, capacity)
            self._subject = _grown(self._subject, capacity)
            self._top = _grown(self._top, capacity, -np.inf)
            self._top_subject = _grown(self._top_subject, capacity, -1)
            self._score = _grown(self._score, capacity, -np.inf)
            self._readers = 0  # new arrays: a scoring under way reads the old ones
        if needed > len(self._on):
            self._on = _grown(self._on, len(self._ids), False)
        codes = np.array([self._code(s) for s in subjects], np.int32)
        new = slice(self._n, needed)
        self._vectors[new], self._ids[new], self._subject[new] = vectors, ids, codes
        self._top[new], self._top_subject[new], self._score[new] = -np.inf, -1, -np.inf
        self._on[new] = sampled(ids, self.share)
        for code in codes.tolist():
            self._subjects += int(self._counts[code] == 0)
            self._counts[code] += 1
        self._n = needed

    def _code(self, subject: str) -> int:
        code = self._names.coded(subject)
        if code >= len(self._counts):
            self._counts = _grown(self._counts, max(64, 2 * len(self._counts)), 0)
        return code

    def _enter(self, rows: np.ndarray, cosines: np.ndarray, code: int) -> np.ndarray:
        """Put subject `code`, whose new face has `cosines` with the faces of `rows` (lists kept),
        into those of their lists it now belongs to (as a new entry, or raising its entry); the rows changed."""
        top, top_subject = self._top[rows], self._top_subject[rows]
        listed = top_subject == code
        has = listed.any(axis=1)
        current = np.where(listed, top, -np.inf).max(axis=1)
        other = self._subject[rows] != code
        raised = np.flatnonzero(other & has & (cosines > current))
        entered = np.flatnonzero(other & ~has & (cosines > top[:, -1]))
        for i in raised:
            top[i, listed[i]] = cosines[i]
        top[entered, -1], top_subject[entered, -1] = cosines[entered], code
        changed = np.concatenate([raised, entered])
        if len(changed):
            order = np.argsort(-top[changed], axis=1, kind="stable")
            self._top[rows[changed]] = np.take_along_axis(top[changed], order, axis=1)
            self._top_subject[rows[changed]] = np.take_along_axis(top_subject[changed], order, axis=1)
        return rows[changed]

    def _relist(self, rows: np.ndarray) -> None:
        self._top[rows], self._top_subject[rows] = self._lists(rows)

    def _lists(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return Faces(self._vectors[: self._n], self._subject[: self._n], self._counts, self.width).lists(rows)

    def _rescore(self, rows: np.ndarray) -> None:
        if len(rows):
            self._score[rows] = _scores(self._top[rows], self._subjects)
        self._tail_current = False

    def _after(self, before: int) -> None:
        """k = min(K, N − 2) for a leave-one-out score changes with N in small galleries: score every
        listed face again. A gallery grown past twice its sample: half the sample's lists dropped."""
        share = min(self.share, sample_share(self._n)) if self.sample else 1.0
        if share < self.share:
            self.share = share
            dropped = np.flatnonzero(self._on[: self._n] & ~sampled(self._ids[: self._n], share))
            self._on[dropped], self._top[dropped], self._top_subject[dropped], self._score[dropped] = False, -np.inf, -1, -np.inf
        if self._subjects != before and min(self._subjects, before) <= K + 2:
            self._rescore(np.flatnonzero(self._on[: self._n]))
        self._tail_current = False


@dataclass(frozen=True)
class Faces:
    """The faces a guard's lists are computed from, as of one moment: its vectors, their subjects'
    codes and the faces per code. A guard's own updates read its arrays under its lock; a subject's
    scoring (`nearest_others(subject=…)`) reads them with the lock released, arrays no change
    writes in place meanwhile (`LeaveOneOut._readers`), so that searches and changes do not wait for it."""

    vectors: np.ndarray
    subject: np.ndarray
    counts: np.ndarray
    width: int

    def lists(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The lists of `rows` (cosines and codes, a row each) computed from every face: FAISS's exact
        search for each row's nearest faces, a block at a time, then their subjects. The faces asked
        for per row are bounded (4 × width + at most OWN_FACES of its own subject's), whatever the
        subjects' sizes: the rows whose nearest faces held too few subjects are listed again by
        `lists_exactly`."""
        n = len(self.vectors)
        vectors, subject = self.vectors, self.subject
        take = min(n, 4 * self.width + min(int(self.counts.max(initial=0)), OWN_FACES))  # enough for `width` subjects, usually
        top = np.full((len(rows), self.width), -np.inf, np.float32)
        top_subject = np.full((len(rows), self.width), -1, np.int32)
        where = np.zeros(n, np.int64)  # a row's place in `rows` (a search may yield its blocks in any order)
        where[rows] = np.arange(len(rows))
        short: list[np.ndarray] = []
        for block, values, faces in _nearest(vectors, rows, take):
            values[subject[faces] == subject[block][:, None]] = -np.inf  # the face's own subject
            top[where[block]], top_subject[where[block]] = _best_subjects(values, subject[faces], self.width)
            if take < n:  # fewer than `width` subjects among the faces asked for: more faces may hold more
                short.append(block[(top_subject[where[block]] < 0).any(axis=1)])
        again = np.concatenate([np.empty(0, np.int64), *short])
        top[where[again]], top_subject[where[again]] = self.lists_exactly(again)
        return top, top_subject

    def lists_exactly(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The lists of rows whose nearest faces were crowded by a few subjects' many faces, exact in
        bounded memory: the subjects with more than OWN_FACES faces ("large") by their best face
        each, from products a block of rows by a slice of their faces at a time; the others from
        FAISS's search of their faces only, for (width + 1) × OWN_FACES faces, which holds the best
        face of the `width` nearest of them (each has at most OWN_FACES, its own subject too)."""
        top = np.full((len(rows), self.width), -np.inf, np.float32)
        top_subject = np.full((len(rows), self.width), -1, np.int32)
        if not len(rows):
            return top, top_subject
        vectors, subject = self.vectors, self.subject
        large = np.flatnonzero(self.counts > OWN_FACES)
        in_large = np.isin(subject, large)
        small = np.flatnonzero(~in_large)
        members = np.flatnonzero(in_large)
        members = members[np.argsort(subject[members], kind="stable")]  # the large subjects' faces, a subject after another
        take = min(len(small), (self.width + 1) * OWN_FACES)
        order = np.argsort(subject[rows], kind="stable")  # a block holds one subject's rows, mostly: its own faces are skipped
        for start in range(0, len(rows), EXACT_BLOCK):
            block = rows[order[start : start + EXACT_BLOCK]]
            own = subject[block][:, None]
            alone = int(own[0, 0]) if (own == own[0, 0]).all() else -1  # the one subject of the block's rows
            values = np.empty((len(block), 0), np.float32)
            codes = np.empty((len(block), 0), np.int32)
            if take:
                heap = faiss.ResultHeap(len(block), take, keep_max=True)
                for first in range(0, len(small), SLICE):
                    part = small[first : first + SLICE]
                    found, at = faiss.knn(vectors[block], vectors[part], min(take, len(part)), metric=faiss.METRIC_INNER_PRODUCT)
                    heap.add_result(found, np.where(at >= 0, part[np.maximum(at, 0)], -1))
                heap.finalize()
                codes = np.where(heap.I >= 0, subject[np.maximum(heap.I, 0)], -1)
                values = np.where((heap.I >= 0) & (codes != own), heap.D, -np.inf).astype(np.float32)
            if len(large):
                best = np.full((len(block), len(large)), -np.inf, np.float32)
                for first in range(0, len(members), SLICE):
                    part = members[first : first + SLICE]
                    if subject[part[0]] == subject[part[-1]] == alone:
                        continue  # the rows' own subject: −inf anyway
                    cosines = vectors[block] @ vectors[part].T
                    starts = np.flatnonzero(np.r_[True, np.diff(subject[part]) != 0])
                    slot = np.searchsorted(large, subject[part][starts])
                    best[:, slot] = np.maximum(best[:, slot], np.maximum.reduceat(cosines, starts, axis=1))
                best[large[None, :] == own] = -np.inf
                values = np.concatenate([values, best], axis=1)
                codes = np.concatenate([codes, np.broadcast_to(large.astype(np.int32), best.shape)], axis=1)
            top[order[start : start + EXACT_BLOCK]], top_subject[order[start : start + EXACT_BLOCK]] = _best_subjects(
                values, codes, self.width
            )
        return top, top_subject


def follow(ids: np.ndarray, subjects: Iterable[str], vectors: np.ndarray, guard: bool) -> Roster | LeaveOneOut:
    """What a gallery keeps beside its index for open-set decisions: the leave-one-out guard of
    these faces, or with `guard` off only which subject each face is."""
    if guard:
        return LeaveOneOut.build(ids, subjects, vectors)
    return Roster.of(ids, subjects)


def _scores(top: np.ndarray, subjects: int) -> np.ndarray:
    """The leave-one-out scores of these lists in a gallery of `subjects` (−inf for a list naming no
    other subject: no sample)."""
    scores = np.full(len(top), -np.inf)
    found = np.isfinite(top[:, 0])
    scores[found] = margin_scores(top[found], subjects - 1)
    return scores


def _picked(
    ids: np.ndarray,
    own: np.ndarray,
    top: np.ndarray,
    top_subject: np.ndarray,
    score: np.ndarray,
    names: Names,
    at_least: float,
    by_cosine: bool,
) -> list[tuple[int, str, str, float, float]]:
    """`nearest_others`' tuples of the faces (a row each) whose score, or best cosine, is at least `at_least`."""
    held = top[:, 0].astype(np.float64) if by_cosine else score
    kept = np.flatnonzero((held >= at_least) & (top_subject[:, 0] >= 0))
    picked = zip(
        ids[kept].tolist(), own[kept].tolist(), top_subject[kept, 0].tolist(), top[kept, 0].tolist(), score[kept].tolist(), strict=True
    )
    return [(face, names[code], names[other], cosine, value) for face, code, other, cosine, value in picked]


Found = Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (rows, their nearest faces' cosines, those faces)


def _nearest(vectors: np.ndarray, rows: np.ndarray, take: int) -> Found:
    """Each row's `take` nearest faces, exactly: its product with every face (BLAS), BLOCK rows at a
    time. A build costs n² products (about an hour of one core at 1M faces); the approximate
    searches tried in its place (FAISS's IVF and HNSW, k-means clusters searched by their nearest
    clusters) saved little, or moved the guard's thresholds down (docs/benchmarks.md, "The guard at
    10k, 100k and 1M faces"). `benchmarks/open_set_guard.py --search` swaps them in here."""
    for start in range(0, len(rows), BLOCK):
        block = rows[start : start + BLOCK]
        values, faces = faiss.knn(vectors[block], vectors, take, metric=faiss.METRIC_INNER_PRODUCT)
        yield block, values, faces


_ROWS = {
    "vectors": 0,
    "ids": 0,
    "subject": 0,
    "top": -np.inf,
    "top_subject": -1,
    "score": -np.inf,
}  # per-face arrays, and what fills a free row


def _grown(array: np.ndarray, capacity: int, fill: float = 0) -> np.ndarray:
    grown = np.full((capacity, *array.shape[1:]), fill, array.dtype)
    grown[: len(array)] = array
    return grown


def _nearest_subjects(cosines: np.ndarray, codes: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """One face's cosines with every face (−inf where a face does not count) and their subjects'
    codes: the `width` best subjects by their best face, highest first, and their codes (−inf and −1
    where there are fewer)."""
    top = np.full(width, -np.inf, np.float32)
    subjects = np.full(width, -1, np.int32)
    best = np.full(int(codes.max(initial=-1)) + 1, -np.inf)
    np.maximum.at(best, codes, cosines)
    ranked = np.argpartition(-best, width - 1)[:width] if len(best) > width else np.arange(len(best))
    ranked = ranked[np.argsort(-best[ranked], kind="stable")]
    ranked = ranked[best[ranked] > -np.inf]
    top[: len(ranked)], subjects[: len(ranked)] = best[ranked], ranked
    return top, subjects


def _best_subjects(values: np.ndarray, codes: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of candidate faces (cosines in any order, −inf where a face does not count, and their
    subjects' codes): the `width` best subjects among them by their best face, highest first, and
    their codes (−inf and −1 where there are fewer). Vectorized: a subject's candidates sorted
    together, all but its best dropped, the rest ranked."""
    by_subject = np.lexsort((-values, codes), axis=1)
    values, codes = np.take_along_axis(values, by_subject, axis=1), np.take_along_axis(codes, by_subject, axis=1)
    values[:, 1:][codes[:, 1:] == codes[:, :-1]] = -np.inf  # a subject once, by its best face
    order = np.argsort(-values, axis=1, kind="stable")[:, :width]
    top = np.full((len(values), width), -np.inf, np.float32)
    subjects = np.full((len(values), width), -1, np.int32)
    found = np.take_along_axis(values, order, axis=1)
    top[:, : found.shape[1]] = found
    subjects[:, : found.shape[1]] = np.where(np.isfinite(found), np.take_along_axis(codes, order, axis=1), -1)
    return top, subjects
