"""The margin score, its table and the gallery's leave-one-out guard (service/core/open_set.py), each
checked against what the test computes itself: the score and the leave-one-out lists by brute
force over every face, the guard's threshold by the issue's formula, the table's interpolation at
points where its closed form is plain."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from service.core import open_set
from service.core.decision import decide_search
from service.core.models.manifest import Manifest, OpenSetRows, OpenSetTable
from service.core.open_set import (
    GalleryShape,
    LeaveOneOut,
    Roster,
    Tail,
    candidate_scores,
    margin_scores,
    margin_threshold,
    sampled,
    table_threshold,
)
from tests.polling import wait_until


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def direct_margin(subject_best: list[float]) -> float:
    """S = s1 + 0.5 · (s1 − mean(s2 … s(k+1))), k = min(10, N − 1), N = len(subject_best): by hand."""
    s = sorted(subject_best, reverse=True)
    k = min(10, len(s) - 1)
    return s[0] if k == 0 else s[0] + 0.5 * (s[0] - sum(s[1 : k + 1]) / k)


def brute_leave_one_out(ids, subjects, vectors) -> dict[int, float]:
    """Each face's S against every other subject (each by its best face), looping over every face."""
    scores = {}
    for i, face in enumerate(ids):
        best: dict[str, float] = {}
        for j in range(len(ids)):
            if subjects[j] != subjects[i]:
                best[subjects[j]] = max(best.get(subjects[j], -2.0), float(vectors[i] @ vectors[j]))
        if best:
            scores[face] = direct_margin(list(best.values()))
    return scores


def test_the_score_is_the_formula():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 11, 12, 40):
        rows = rng.uniform(-1, 1, (20, n))
        top = -np.sort(-rows, axis=1)[:, :11]
        assert margin_scores(top, n) == pytest.approx([direct_margin(list(r)) for r in rows], abs=1e-9)
    cosines = np.array([0.9, 0.8, 0.7, 0.6])
    assert candidate_scores(cosines, 4) == pytest.approx([0.9 + 0.5 * (0.9 - 0.7), 0.8 + 0.5 * (0.8 - 0.7), 0.7, 0.6 + 0.5 * (0.6 - 0.7)])
    assert candidate_scores(cosines[:1], 1) == pytest.approx([0.9])  # one subject: its cosine


def test_leave_one_out_scores_stay_exact_as_faces_come_and_go():
    rng = np.random.default_rng(1)
    n = 160
    subjects = [f"s{rng.integers(0, 50)}" for _ in range(n)]  # 1 to 8 faces per subject
    vectors = unit(rng.normal(size=(n, 12)))
    ids = np.arange(1, n + 1)
    state = LeaveOneOut(12)
    for chunk in np.array_split(rng.permutation(n), 25):
        state.add(ids[chunk], [subjects[i] for i in chunk], vectors[chunk])
    expected = brute_leave_one_out(ids, subjects, vectors)
    got = {face: score for face, _, _, _, score in state.nearest_others()}
    assert got.keys() == expected.keys() and all(got[f] == pytest.approx(v, abs=1e-5) for f, v in expected.items())

    gone = rng.choice(ids, 70, replace=False)
    state.remove(gone[:35])
    state.remove(gone[35:])
    keep = ~np.isin(ids, gone)
    left = [s for s, k in zip(subjects, keep, strict=True) if k]
    expected = brute_leave_one_out(ids[keep], left, vectors[keep])
    got = {face: score for face, _, _, _, score in state.nearest_others()}
    assert got.keys() == expected.keys() and all(got[f] == pytest.approx(v, abs=1e-5) for f, v in expected.items())
    assert (state.shape().subjects, state.shape().faces) == (len(set(left)), int(keep.sum()))
    rebuilt = {face: score for face, _, _, _, score in LeaveOneOut.build(ids[keep], left, vectors[keep]).nearest_others()}
    assert rebuilt == pytest.approx(got, abs=1e-6)  # the state is the faces', whatever order they came in


def test_a_large_gallery_lists_a_seeded_sample_and_its_threshold_stays_near_the_exact_one(monkeypatch):
    """From SAMPLE_FROM faces up the guard searches the lists of a hashed sample of them only (the build
    costs the sample × N products, not N²), and the tail of the sample's scores gives the guard's
    threshold near the exact guard's: within 0.02 at 2,000 listed faces here, the strangers' rate within
    a factor 1.7 (this gallery's tail: β = 0.039; docs/benchmarks.md: within 0.005 at 20,000, LISTED)."""
    rng = np.random.default_rng(11)
    n = 8000
    owner = np.repeat(np.arange(n), rng.integers(1, 11, n))[:n]  # subjects of 1 to 10 faces around a centre each
    vectors = unit(rng.normal(size=(int(owner[-1]) + 1, 32))[owner] + 0.8 * rng.normal(size=(n, 32)))
    ids, subjects = np.arange(1, n + 1), [str(s) for s in owner.tolist()]
    exact = LeaveOneOut.build(ids, subjects, vectors, sample=False).shape().tail
    monkeypatch.setattr(open_set, "SAMPLE_FROM", 4000)
    monkeypatch.setattr(open_set, "LISTED", 2000)
    searched: list[np.ndarray] = []
    nearest = open_set._nearest

    def recorded(vectors, rows, take):
        searched.append(np.array(rows))
        yield from nearest(vectors, rows, take)

    monkeypatch.setattr(open_set, "_nearest", recorded)
    state = LeaveOneOut.build(ids, subjects, vectors)
    in_sample = sampled(ids, 1 / 4)
    assert state.share == 1 / 4 and 1800 < in_sample.sum() < 2200  # 8,000 faces: 2^-2 keeps at least 2,000 of them, about
    assert np.array_equal(np.sort(ids[np.concatenate(searched)]), ids[in_sample])  # only the sample's lists were searched
    assert {face for face, *_ in state.nearest_others()} == set(ids[in_sample].tolist())
    tail = state.shape().tail
    assert (tail.samples, state.shape().faces) == (in_sample.sum(), n)
    for q in (1e-2, 1e-3):
        assert tail.threshold(2 * q) == pytest.approx(exact.threshold(2 * q), abs=0.02)


def test_a_sampled_guard_keeps_its_sample_exact_as_faces_come_and_go(monkeypatch):
    """A face's place in the sample is its id's: added faces join it or not, the lists of the sample
    stay exact through adds and deletes, a gallery grown past twice its sample drops half of it, and
    any subject's faces are scored exactly on demand, in the sample or not."""
    monkeypatch.setattr(open_set, "SAMPLE_FROM", 20)
    monkeypatch.setattr(open_set, "LISTED", 10)
    rng = np.random.default_rng(5)
    n = 240
    subjects = [f"s{rng.integers(0, 80)}" for _ in range(n)]
    vectors = unit(rng.normal(size=(n, 12)))
    ids = np.arange(1, n + 1)

    def check(state, keep):
        expected = brute_leave_one_out(ids[keep], [s for s, k in zip(subjects, keep, strict=True) if k], vectors[keep])
        got = {face: score for face, _, _, _, score in state.nearest_others()}
        assert got.keys() == {f for f in expected if sampled(np.array([f]), state.share)[0]}
        assert all(got[f] == pytest.approx(expected[f], abs=1e-5) for f in got)
        unsampled = next(s for s, f, k in zip(subjects, ids, keep, strict=True) if k and f not in got and subjects.count(s) == 1)
        ((face, own, _, _, score),) = state.nearest_others(subject=unsampled)
        assert own == unsampled and score == pytest.approx(expected[face], abs=1e-5)

    state = LeaveOneOut.build(ids[:100], subjects[:100], vectors[:100])
    assert state.share == 1 / 8  # 100 faces: at least 10 of them
    for chunk in np.array_split(np.arange(100, n), 7):
        state.add(ids[chunk], [subjects[i] for i in chunk], vectors[chunk])
    assert state.share == 1 / 16  # 240 faces: half the sample dropped
    check(state, np.ones(n, bool))
    gone = rng.choice(ids, 60, replace=False)
    state.remove(gone)
    keep = ~np.isin(ids, gone)
    assert state.share == 1 / 16
    check(state, keep)
    rebuilt = LeaveOneOut.build(ids[keep], [s for s, k in zip(subjects, keep, strict=True) if k], vectors[keep])
    assert rebuilt.share == 1 / 16 and {f: s for f, *_, s in rebuilt.nearest_others()} == pytest.approx(
        {f: s for f, *_, s in state.nearest_others()}, abs=1e-6
    )


def test_a_subjects_scoring_holds_no_lock_searches_and_changes_wait_for(monkeypatch):
    """GET /gallery/duplicates?subject_id= searches the subject's faces against every face: held
    mid-way here, the guard still answers a search's shape and takes adds and deletes (before, they
    waited on its lock for the whole scoring: ~0.5 s at 1M faces), and the scoring reads the faces as
    they were when it began, though the deletes moved rows under it (their arrays copied first)."""
    rng = np.random.default_rng(8)
    n = 120
    subjects = [f"s{i % 40}" for i in range(n)]
    added = ["s3", "s90", "s91", "s92", "s93", "s94"]
    vectors = unit(rng.normal(size=(n + 6, 12)))
    ids = np.arange(1, n + 7)
    state = LeaveOneOut.build(ids[:n], subjects, vectors[:n], sample=False)
    mine = [i for i in range(n) if subjects[i] == "s3"]
    before = brute_leave_one_out(ids[:n], subjects, vectors[:n])
    cosines = vectors[mine] @ vectors[:n].T
    cosines[:, mine] = -2
    nearest = ids[np.unique(cosines.argmax(axis=1))]  # each of its faces' best other face: gone, its score changes
    gone = np.union1d(nearest, ids[[0, 1, n - 1]])  # and rows the last ones move into
    started, release, done = threading.Event(), threading.Event(), threading.Event()
    scorer: list[threading.Thread] = []
    search = open_set._nearest

    def held(vectors, rows, take):
        if threading.current_thread() in scorer:
            started.set()
            release.wait(300)  # set once the search and changes are done, or failed
        yield from search(vectors, rows, take)

    monkeypatch.setattr(open_set, "_nearest", held)
    found: list = []
    scorer.append(threading.Thread(target=lambda: found.extend(state.nearest_others(subject="s3"))))
    scorer[0].start()
    try:
        assert started.wait(30)

        def meanwhile():
            state.shape()
            state.remove(gone)
            state.add(ids[n:], added, vectors[n:])
            done.set()

        threading.Thread(target=meanwhile, daemon=True).start()
        wait_until(done.is_set, "a search, a delete and an add while a subject's scoring is held", timeout=10)
    finally:
        release.set()
        scorer[0].join(30)
    assert {face: score for face, own, _, _, score in found} == pytest.approx({int(ids[i]): before[int(ids[i])] for i in mine}, abs=1e-5)
    keep = ~np.isin(ids, gone)
    left = [s for s, k in zip([*subjects, *added], keep, strict=True) if k]
    after = brute_leave_one_out(ids[keep], left, vectors[keep])
    assert {face: score for face, _, _, _, score in state.nearest_others()} == pytest.approx(after, abs=1e-5)
    assert {face: score for face, *_, score in state.nearest_others(subject="s3")} == pytest.approx(
        {int(f): after[int(f)] for f, s in zip(ids[keep], left, strict=True) if s == "s3"}, abs=1e-5
    )


def test_a_roster_counts_subjects_and_faces():
    roster = Roster()
    roster.add(np.array([1, 2, 3]), ["a", "a", "b"])
    roster.add(np.array([3]), ["b"])  # applied twice (a replayed change): counted once
    assert roster.shape() == GalleryShape(2, 3)
    roster.remove(np.array([1, 2, 9]))
    assert roster.shape() == GalleryShape(1, 1)


def test_the_guard_tail_is_the_issue_formula():
    rng = np.random.default_rng(2)
    scores = rng.gumbel(0.9, 0.01, 500)
    tail = Tail.of(scores, subjects=450)
    m = max(10, math.ceil(0.1 * 500))
    ranked = sorted(scores, reverse=True)
    u = ranked[m]  # S_(m+1)
    beta = sum(s - u for s in ranked[:m]) / m
    assert (tail.m, tail.samples) == (m, 500) and tail.u == pytest.approx(u) and tail.beta == pytest.approx(beta)
    for r in (0.2, 0.02, 0.002):
        per = 1 - (1 - r) ** (449 / 450)
        assert tail.threshold(r) == pytest.approx(u + beta * math.log((m / 500) / per))
    assert Tail.of(scores[:99], subjects=99) is None  # below 100 subjects, no guard
    # the state's tail is the same formula over its own scores
    vectors = unit(rng.normal(size=(120, 8)))
    state = LeaveOneOut.build(np.arange(120), [str(i) for i in range(120)], vectors)
    direct = brute_leave_one_out(list(range(120)), [str(i) for i in range(120)], vectors)
    expected = Tail.of(np.array(list(direct.values())), 120)
    assert state.shape().tail.u == pytest.approx(expected.u, abs=1e-5) and state.shape().tail.beta == pytest.approx(expected.beta, abs=1e-5)


def hand_table() -> OpenSetTable:
    return OpenSetTable(
        fpirs=[0.1, 0.01, 0.001],
        tables=[
            OpenSetRows(
                faces_per_subject=1,
                subjects=[10, 100, 1000],
                thresholds=[[0.90, 0.92, 0.94], [0.91, 0.93, 0.95], [0.92, 0.94, 0.96]],
                samples=[1, 1, 1],
            ),
            OpenSetRows(faces_per_subject=3, subjects=[10, 100], thresholds=[[0.91, 0.93, 0.95], [0.92, 0.94, 0.96]], samples=[1, 1]),
        ],
    )


def test_the_table_interpolates_in_log_size_log_rate_and_faces_per_subject():
    table = hand_table()
    assert table_threshold(table, 100, 0.01) == (pytest.approx(0.93), False)
    assert table_threshold(table, round(10**1.5), 0.01)[0] == pytest.approx(0.92 + 0.01 * math.log10(round(10**1.5)) - 0.01, abs=1e-9)
    assert table_threshold(table, 100, 10**-2.5) == (pytest.approx(0.94), False)
    assert table_threshold(table, 10_000, 0.01) == (pytest.approx(0.95), True)  # along the last decade
    assert table_threshold(table, 100, 1e-4) == (pytest.approx(0.97), True)  # along the last decade of rate
    assert table_threshold(table, 5, 0.01) == (pytest.approx(0.92), False)  # held below the first size
    assert table_threshold(table, 100, 0.01, faces_per_subject=2) == (pytest.approx(0.935), False)  # halfway to 3 faces
    assert table_threshold(table, 100, 0.01, faces_per_subject=5) == (pytest.approx(0.94), True)  # held at the last table


def manifest_with(table: OpenSetTable) -> Manifest:
    """A minimal embedder manifest carrying `table` as its open-set table."""
    return Manifest.model_validate(
        {
            "name": "m",
            "version": "1",
            "task": "embedder",
            "file": {"name": "m.onnx", "sha256": "0" * 64, "bytes": 1},
            "input": {"name": "x", "shape": ["b", 3, 112, 112], "color": "RGB"},
            "outputs": [{"name": "y", "shape": ["b", 8]}],
            "embedding_dim": 8,
            "alignment": "arcface_112",
            "license": {"name": "test"},
            "open_set": table.model_dump(),
        }
    )


def test_the_decision_takes_the_guard_only_where_it_is_stricter_and_never_beyond_a_decade():
    manifest = manifest_with(hand_table())
    small = decide_search(manifest, 0.01, None, None, GalleryShape(100, 100), 0.01)
    assert (small.score, small.threshold, small.far, small.candidates_needed) == ("margin", 0.93, None, 11)
    loose_tail = Tail(samples=1000, subjects=1000, m=100, u=0.90, beta=0.005)  # its own faces: strangers rarely pass
    tight_tail = Tail(samples=1000, subjects=1000, m=100, u=0.93, beta=0.010)  # look-alikes: they would pass often
    wild_tail = Tail(samples=1000, subjects=1000, m=100, u=0.99, beta=0.050)
    for tail, expected in ((loose_tail, 0.94), (tight_tail, None), (wild_tail, 2 * 0.94 - 0.92)):
        decision = decide_search(manifest, 0.01, None, None, GalleryShape(1000, 1000, tail), 0.01)
        guard = tail.u + tail.beta * math.log((100 / 1000) / (1 - (1 - 0.02) ** (999 / 1000)))
        assert decision.margin.detail.guard == pytest.approx(guard)
        assert decision.threshold == pytest.approx(expected if expected is not None else guard, abs=1e-6)
    # a score's rate is the fpir whose threshold it is: the inverse, also where the guard decides
    for shape in (GalleryShape(300, 300), GalleryShape(1000, 1000, tight_tail)):
        for q in (0.05, 0.01, 0.003):
            t = margin_threshold(manifest.open_set, shape, q).threshold
            assert decide_search(manifest, q, None, None, shape, 0.01).rate(t) == pytest.approx(q, rel=1e-6)


def test_a_search_reads_its_rate_curve_once_for_all_its_candidates(monkeypatch):
    """The compatibility routes ask `Decision.rate` once per candidate: the thresholds it inverts are
    read once per decision (bisecting read them ~62 times a call, ~2 ms), the guard's curves inverted
    in closed form, and the inverse stays exact, beyond the table's smallest FPIR too."""
    from pathlib import Path

    from service.core import open_set

    manifest = Manifest.load(Path(__file__).parents[3] / "models" / "dlib-resnet-v1.json")
    tail = Tail(samples=3000, subjects=1000, m=100, u=0.93, beta=0.010)
    reads = []
    original = open_set.margin_threshold
    monkeypatch.setattr(open_set, "margin_threshold", lambda *args: reads.append(args) or original(*args))
    for shape in (GalleryShape(5, 15), GalleryShape(300, 600), GalleryShape(1000, 3000, tail)):
        decision = decide_search(manifest, 0.01, None, None, shape, 0.01)
        rates = np.geomspace(0.05, 1e-9, 25).tolist()
        thresholds = [original(manifest.open_set, shape, q).threshold for q in rates]
        reads.clear()
        assert [decision.rate(t) for t in thresholds] == pytest.approx(rates, rel=1e-6)
        knots = len(manifest.open_set.fpirs) * (2 if shape.tail else 1) + 2
        assert len(reads) <= knots + (3 * len(rates) if shape.tail else 0), (shape, len(reads))  # the guard's: a check per curve


def test_a_small_gallery_is_decided_on_the_best_cosine_held_to_the_cosine_rows():
    """Below the table's cosine_below subjects the best cosine alone decides (score "cosine", no FAR),
    at the cosine rows' threshold for the gallery's size and faces per subject, and its rate is read
    off those rows; from cosine_below up the margin rows decide as before."""
    cosine_rows = OpenSetRows(faces_per_subject=1, subjects=[1, 100], thresholds=[[0.80, 0.85, 0.90], [0.82, 0.87, 0.92]], samples=[1, 1])
    manifest = manifest_with(hand_table().model_copy(update={"cosine_below": 100, "cosine_tables": [cosine_rows]}))
    small = decide_search(manifest, 0.01, None, None, GalleryShape(10, 10), 0.01)
    assert (small.score, small.far, small.candidates_needed) == ("cosine", None, 1)
    assert small.threshold == pytest.approx(0.85 + 0.02 * math.log(10) / math.log(100))  # in ln N between 1 and 100 subjects
    rng = np.random.default_rng(3)
    probe = unit(rng.normal(size=8))
    faces = unit(rng.normal(size=(3, 8)))
    from service.core.decision import Candidate

    candidates = [Candidate(str(i), str(i), float(probe @ f), i, f) for i, f in enumerate(faces)]
    assert small.scores(probe, candidates).tolist() == pytest.approx([c.similarity for c in candidates])  # the cosines themselves
    assert small.rate(small.threshold) == pytest.approx(0.01, rel=1e-6)
    assert decide_search(manifest, 0.01, None, None, GalleryShape(100, 100), 0.01).score == "margin"
    with pytest.raises(ValueError, match="cosine_below needs cosine_tables"):
        OpenSetTable.model_validate({**hand_table().model_dump(), "cosine_below": 100})


def exact_lists(subjects: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each face's cosines to the best face of its 11 nearest other subjects, highest first (−inf
    where there are fewer), from the whole cosine matrix: the brute force, vectorized."""
    order = np.argsort(subjects, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(subjects[order]) != 0])
    best = np.maximum.reduceat((vectors @ vectors[order].T), starts, axis=1)  # per face, per subject
    best[subjects[:, None] == subjects[order][starts][None, :]] = -np.inf
    top = -np.sort(-best, axis=1)[:, :11]
    return np.pad(top, ((0, 0), (0, 11 - top.shape[1])), constant_values=-np.inf)


def test_a_subject_with_many_faces_builds_in_bounded_memory(monkeypatch):
    """The guard's search asks FAISS for a bounded number of faces per face, whatever its subject's
    size (it asked for 44 + the largest subject's faces: 10k faces in one subject took 2.26 GB), and
    the lists stay exact: two large subjects (3,000 and 300 faces) among small ones."""
    import tracemalloc

    import faiss

    rng = np.random.default_rng(7)
    subjects = np.array(["big"] * 3000 + ["mid"] * 300 + [f"s{i % 150}" for i in range(400)])
    centre = {name: rng.normal(size=16) for name in set(subjects.tolist())}
    vectors = unit(np.stack([centre[s] for s in subjects]) + 1.5 * rng.normal(size=(len(subjects), 16)))
    asked: list[int] = []
    knn = faiss.knn

    def counted(queries, base, k, **kwargs):
        asked.append(k)
        return knn(queries, base, k, **kwargs)

    monkeypatch.setattr(faiss, "knn", counted)
    tracemalloc.start()
    try:
        state = LeaveOneOut.build(np.arange(len(subjects)), subjects.tolist(), vectors)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert max(asked) <= 1000 < 3000  # faces asked for per face, beyond which the subject's size no longer counts
    assert peak < 100e6  # bytes; the lists alone, asked for 44 + 3,000 faces per face, are 3,700 × 3,044 × 12 B = 135 MB
    assert np.allclose(state._top[: len(subjects)], exact_lists(np.unique(subjects, return_inverse=True)[1], vectors), atol=1e-5)
