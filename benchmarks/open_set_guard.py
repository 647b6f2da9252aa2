"""What the open-set guard costs a gallery (service/core/open_set.py, LeaveOneOut): building it (at
start-up: an exact search of each listed face's nearest faces, n² products, or from
open_set.SAMPLE_FROM faces the sample's × n), one enrollment (a product with the listed faces, the
lists it enters), one delete (the lists that named its subject, searched again), reading the tail
a decision needs, and scoring one subject's faces exactly (GET /gallery/duplicates?subject_id=,
wall, the mean of five subjects), and a search's wall alone ("search ms") and begun while
such a scoring runs on a thread ("scoring"; "guard ms" its read of the guard: the wait on the
guard's lock, if held). With the machine, the CPU time of the build and of an enrollment beside
their wall time, which a shared machine inflates, and the peak memory of the process that built it
(each size is built in a process of its own: its ru_maxrss, and what it held before the build).

Synthetic L2-normalized 128-d embeddings. `--layout one`: one face per subject (the cost depends on
size and dimension, hardly on the data); `--layout realistic`: subjects of 1 to 10 faces, each
face its subject's centre plus noise (cosine about 0.6 between a subject's faces); `--largest N`:
N of each size's faces in one subject (what bounds the build's memory).

`--search` replaces the build's exact search by an approximate one, to see what it would save
where the exact build takes too long (1M faces): `ivf` (FAISS's IVF index, as the gallery's, 4 · √n
lists, `--probed` of them scanned per face), `hnsw` (HNSW32, efSearch = `--probed` × 1,000),
`clustered` (√n k-means clusters, each cluster's faces multiplied at once with the faces of the
`--probed` share of clusters nearest its centre); the exact search's cost is then timed on 4,096
faces and scaled. `--search compare` builds the exact guard and each approximate one at a size and
prints how far their scores and thresholds are, and the thresholds from a sample of the exact
scores (10 %: what a guard that lists only sampled faces would read). `--search sample` builds
nothing: it times the exact search of 4,096 faces against all and scales it to the size (what a
1M build would cost, without waiting an hour).

    .venv/bin/python benchmarks/open_set_guard.py                  # 10k and 100k faces, one per subject
    .venv/bin/python benchmarks/open_set_guard.py --layout realistic --sizes 10000 100000
    .venv/bin/python benchmarks/open_set_guard.py --layout realistic --sizes 100000 1000000 --search sample
    .venv/bin/python benchmarks/open_set_guard.py --layout realistic --sizes 100000 --search compare
    .venv/bin/python benchmarks/open_set_guard.py --sizes 20000 --largest 10000
    .venv/bin/python benchmarks/open_set_guard.py --layout realistic --sizes 100000 --search shares

The guard lists a seeded sample of the faces from open_set.SAMPLE_FROM faces up (`sample_share`); `--exact`
builds the exact guard at every size. `--search shares` builds the exact
guard once and reads the tail of the faces a guard sampling 1/2, 1/4, ... of them would list, under
`--seeds` seeds of the hash each (the sampled faces' lists are the exact build's: each is searched
against every face), against the exact tail: the error of a sampled guard's threshold by its size.
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import faiss
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from benchmarks.search import rss_mib  # noqa: E402
from service.core import open_set  # noqa: E402
from service.core.open_set import LeaveOneOut, Tail  # noqa: E402
from service.gallery.index import set_search_threads  # noqa: E402

FPIRS = (1e-2, 1e-3, 1e-4)  # the guard's thresholds compared, T_LOSO(2q)
SHARES = (1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64)  # `--search shares`
SAMPLE = 4096  # faces whose exact search is timed where the build is approximate
SAMPLED = 0.1  # the share of the exact scores whose tail `--search compare` reads too
NEAREST = open_set._nearest  # the service's exact search


def gallery(size: int, dim: int, layout: str, largest: int) -> tuple[np.ndarray, list[str]]:
    """`size` faces and their subjects: the first `largest` in subject "big", the rest one per
    subject, or (realistic) subjects of 1–10 faces around a centre each."""
    rng = np.random.default_rng(size)
    rest = size - largest
    if layout == "one":
        owner = np.arange(rest)
        vectors = rng.standard_normal((size, dim), dtype=np.float32)
    else:
        owner = np.repeat(np.arange(rest), rng.integers(1, 11, rest))[:rest]  # subjects of 1–10 faces
        centres = rng.standard_normal((int(owner[-1]) + 1 if rest else 0, dim), dtype=np.float32)
        vectors = rng.standard_normal((size, dim), dtype=np.float32) * 0.8
        vectors[largest:] += centres[owner]
        vectors[:largest] += rng.standard_normal(dim, dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, ["big"] * largest + [str(s) for s in owner.tolist()]


def measure(size: int, args: argparse.Namespace) -> str:
    """One size's row, built in this (fresh) process."""
    set_search_threads(args.threads)
    vectors, subjects = gallery(size + args.writes, args.dim, args.layout, args.largest)
    before = rss_mib()
    started = time.perf_counter()
    state, built_cpu = built(size, args, args.search, vectors, subjects)
    wall = time.perf_counter() - started
    grew, peak = rss_mib() - before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(size, size + args.writes):
        state.add(np.array([i]), [f"new{i}"], vectors[i : i + 1])
    enroll, enroll_cpu = (time.perf_counter() - started) / args.writes, (time.process_time() - cpu) / args.writes
    started = time.perf_counter()
    state.shape()
    tail = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(size, size + args.writes):
        state.remove(np.array([i]))
    delete = (time.perf_counter() - started) / args.writes
    started = time.perf_counter()
    rest = subjects[args.largest : size]  # five subjects of 1–10 faces, not the largest
    five = list(dict.fromkeys(rest[len(rest) // 2 :]))[:5]
    for subject in five:  # one subject's faces scored exactly (GET /gallery/duplicates?subject_id=)
        state.nearest_others(subject=subject)
    per_subject = (time.perf_counter() - started) / 5
    alone, during, guard = searches_while_scoring(state, vectors[:size], five)
    shape = state.shape()
    listed = len(state.nearest_others())
    thresholds = ", ".join(f"{shape.tail.threshold(2 * q):.4f}" for q in FPIRS) if shape.tail else "none"
    row = (
        f"{size:>9,} {shape.subjects:>9,} {listed:>9,} {wall:>8.1f} {built_cpu:>8.1f} {1000 * enroll:>7.1f} "
        f"{1000 * enroll_cpu:>7.1f} {1000 * delete:>9.1f} {1000 * tail:>7.1f} {before:>7.0f} {grew:>7.0f} {peak:>7.0f} "
        f"{1000 * per_subject:>9.1f} {1000 * alone:>9.1f} {1000 * during:>9.1f} {1000 * guard:>8.1f}   T {thresholds}"
    )
    if args.search != "exact":
        row += f"   ({exact_cost(vectors[:size], args)})"
    if args.vs_exact and shape.tail and state.share < 1:
        truth = LeaveOneOut.build(np.arange(size), subjects[:size], vectors[:size], sample=False).shape().tail
        assert truth is not None
        row += "; the exact guard's T: " + ", ".join(f"{truth.threshold(2 * q):.4f}" for q in FPIRS)
        row += " (sampled − exact: " + ", ".join(f"{shape.tail.threshold(2 * q) - truth.threshold(2 * q):+.4f}" for q in FPIRS) + ")"
    return row


def searches_while_scoring(state: LeaveOneOut, vectors: np.ndarray, subjects: list[str]) -> tuple[float, float, float]:
    """A search's wall — what /identify reads of the guard (`shape`: its N and tail) and a flat search
    of one face — alone, and begun while a subject's faces are being scored (GET
    /gallery/duplicates?subject_id=, on a thread, caught inside its search), and of the latter the
    guard's part (its lock waited for, if held): the medians over these subjects."""

    def search() -> tuple[float, float]:
        started = time.perf_counter()
        state.shape()
        read = time.perf_counter()
        faiss.knn(vectors[:1], vectors, 10, metric=faiss.METRIC_INNER_PRODUCT)
        return read - started, time.perf_counter() - started

    alone = statistics.median(search()[1] for _ in subjects)
    inside = threading.Event()

    def entered(vectors: np.ndarray, rows: np.ndarray, take: int) -> open_set.Found:
        inside.set()
        yield from NEAREST(vectors, rows, take)

    open_set._nearest = entered
    during = []
    for subject in subjects:
        inside.clear()
        scoring = threading.Thread(target=state.nearest_others, kwargs={"subject": subject})
        scoring.start()
        inside.wait()
        during.append(search())
        scoring.join()
    open_set._nearest = NEAREST
    return alone, statistics.median(total for _, total in during), statistics.median(guard for guard, _ in during)


def exact_cost(vectors: np.ndarray, args: argparse.Namespace) -> str:
    """What the build's exact search costs: SAMPLE faces' searched against all, timed and scaled."""
    largest = max(args.largest, 10 if args.layout == "realistic" else 1)
    take = 4 * (open_set.K + 1) + min(largest, open_set.OWN_FACES)  # as LeaveOneOut._relist asks
    cpu = time.process_time()
    for block in range(0, SAMPLE, open_set.BLOCK):
        faiss.knn(vectors[block : block + open_set.BLOCK], vectors, take, metric=faiss.METRIC_INNER_PRODUCT)
    return f"the exact search: {(time.process_time() - cpu) * len(vectors) / SAMPLE:,.0f} s CPU, scaled from {SAMPLE:,} faces"


def sample(size: int, args: argparse.Namespace) -> str:
    """`--search sample`: no build, only the exact search's cost at this size."""
    set_search_threads(args.threads)
    vectors, _ = gallery(size, args.dim, args.layout, args.largest)
    return f"{size:>9,}: {exact_cost(vectors, args)}"


def compare(size: int, args: argparse.Namespace) -> str:
    """Each approximate guard's scores and thresholds against the exact guard's, at one size."""
    set_search_threads(args.threads)
    vectors, subjects = gallery(size, args.dim, args.layout, args.largest)
    args.exact = True  # every guard here lists every face
    truth, seconds = built(size, args, "exact", vectors, subjects)
    scores = {face: score for face, *_, score in truth.nearest_others()}
    tail = truth.shape().tail
    assert tail is not None
    lines = [f"{size:,} faces: exact build {seconds:.1f} s CPU; T_LOSO(2q) at q = " + ", ".join(f"{q:g}" for q in FPIRS)]
    lines.append("  exact: " + ", ".join(f"{tail.threshold(2 * q):.4f}" for q in FPIRS))
    faces = np.array(list(scores.values()))
    sampled = Tail.of(np.random.default_rng(0).choice(faces, round(SAMPLED * len(faces)), replace=False), tail.subjects)
    if sampled:
        lines.append(
            f"  {SAMPLED:.0%} of the exact scores: " + ", ".join(f"{sampled.threshold(2 * q) - tail.threshold(2 * q):+.4f}" for q in FPIRS)
        )
    for search in ("ivf", "hnsw", "clustered"):
        state, seconds = built(size, args, search, vectors, subjects)
        got = {face: score for face, *_, score in state.nearest_others()}
        delta = np.array([got.get(face, -np.inf) - score for face, score in scores.items()])
        other = state.shape().tail
        lines.append(
            f"  {search} ({args.probed:g}): {seconds:.1f} s CPU, {np.mean(delta < -1e-6):.1%} of faces scored lower, "
            f"{np.mean(delta > 1e-6):.1%} higher; thresholds "
            + (", ".join(f"{other.threshold(2 * q) - tail.threshold(2 * q):+.4f}" for q in FPIRS) if other else "none")
        )
    return "\n".join(lines)


def shares(size: int, args: argparse.Namespace) -> str:
    """`--search shares`: the exact guard's tail against those of the faces a sampled guard lists."""
    set_search_threads(args.threads)
    vectors, subjects = gallery(size, args.dim, args.layout, args.largest)
    args.exact = True
    truth, seconds = built(size, args, "exact", vectors, subjects)
    listed = truth.nearest_others()
    ids, scores = np.array([face for face, *_ in listed]), np.array([score for *_, score in listed])
    tail = truth.shape().tail
    assert tail is not None
    exact_t = np.array([tail.threshold(2 * q) for q in FPIRS])
    lines = [
        f"{size:,} faces: exact build {seconds:.1f} s CPU; T_LOSO(2q) at q = " + ", ".join(f"{q:g}" for q in FPIRS),
        "  exact: " + ", ".join(f"{t:.4f}" for t in exact_t),
        f"  {'share':>6} {'listed':>8}  worst |error| over {args.seeds} seeds (mean error), per q",
    ]
    for share in SHARES:
        errors, counts = [], []
        for seed in range(args.seeds):  # another seed: the ids shifted before the hash
            picked = open_set.sampled(ids + seed * 2**40, share)
            sample = Tail.of(scores[picked], tail.subjects)
            assert sample is not None
            errors.append([sample.threshold(2 * q) for q in FPIRS] - exact_t)
            counts.append(int(picked.sum()))
        e = np.array(errors)
        lines.append(
            f"  1/{round(1 / share):<4} {round(np.mean(counts)):>8,}  "
            + ", ".join(f"{np.abs(e[:, i]).max():.4f} ({e[:, i].mean():+.4f})" for i in range(len(FPIRS)))
        )
    return "\n".join(lines)


def exact(vectors: np.ndarray, rows: np.ndarray, take: int, probed: float) -> open_set.Found:
    return NEAREST(vectors, rows, take)


def ivf(vectors: np.ndarray, rows: np.ndarray, take: int, probed: float) -> open_set.Found:
    """FAISS's IVF index of the faces (4 · √n lists, `probed` of them scanned), a face at a time."""
    n, dim = vectors.shape
    lists = 2 ** round(math.log2(4 * math.sqrt(n)))
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors[:: max(1, n // (64 * lists))])
    index.add(vectors)
    index.nprobe = math.ceil(probed * lists)
    yield from found(index, vectors, rows, take)


def hnsw(vectors: np.ndarray, rows: np.ndarray, take: int, probed: float) -> open_set.Found:
    """FAISS's HNSW32 graph of the faces, efSearch `probed` × 1,000."""
    index = faiss.IndexHNSWFlat(vectors.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    index.hnsw.efSearch = max(take, round(1000 * probed))
    yield from found(index, vectors, rows, take)


def found(index: faiss.Index, vectors: np.ndarray, rows: np.ndarray, take: int) -> open_set.Found:
    for start in range(0, len(rows), open_set.BLOCK):
        block = rows[start : start + open_set.BLOCK]
        values, faces = index.search(vectors[block], take)
        yield block, np.where(faces < 0, -np.inf, values).astype(np.float32), np.maximum(faces, 0)


def clustered(vectors: np.ndarray, rows: np.ndarray, take: int, probed: float) -> open_set.Found:
    """√n k-means clusters; each cluster's faces multiplied at once (BLAS, as the exact search) with
    the faces of the `probed` share of clusters nearest its centre."""
    n, dim = vectors.shape
    clusters = 2 ** round(math.log2(math.sqrt(n)))
    kmeans = faiss.Kmeans(dim, clusters, niter=10, seed=1, spherical=True, max_points_per_centroid=64)
    kmeans.train(vectors)
    _, assigned = kmeans.index.search(vectors, 1)
    _, probes = kmeans.index.search(kmeans.centroids, math.ceil(probed * clusters))
    order = np.argsort(assigned[:, 0], kind="stable")
    bounds = np.searchsorted(assigned[order, 0], np.arange(clusters + 1))
    members = [order[bounds[c] : bounds[c + 1]] for c in range(clusters)]
    wanted = np.isin(np.arange(n), rows)
    for cluster in range(clusters):
        mine = members[cluster][wanted[members[cluster]]]
        near = np.sort(np.concatenate([members[c] for c in probes[cluster] if c >= 0]))
        for start in range(0, len(mine), open_set.BLOCK):
            block = mine[start : start + open_set.BLOCK]
            values, at = faiss.knn(vectors[block], vectors[near], min(take, len(near)), metric=faiss.METRIC_INNER_PRODUCT)
            yield block, np.where(at < 0, -np.inf, values).astype(np.float32), near[np.maximum(at, 0)]


SEARCHES = {"exact": exact, "ivf": ivf, "hnsw": hnsw, "clustered": clustered}


def built(size: int, args: argparse.Namespace, search: str, vectors: np.ndarray, subjects: list[str]) -> tuple[LeaveOneOut, float]:
    """The guard of the first `size` faces, its build's search replaced by `search`; and its CPU seconds."""
    open_set._nearest = functools.partial(SEARCHES[search], probed=args.probed)  # type: ignore[assignment]
    cpu = time.process_time()
    state = LeaveOneOut.build(np.arange(size), subjects[:size], vectors[:size], sample=not args.exact)
    open_set._nearest = NEAREST
    return state, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--writes", type=int, default=20, help="Enrollments and deletes timed per size.")
    parser.add_argument("--threads", type=int, default=1, help="FAISS threads (the service's FACEGATE_SEARCH_THREADS).")
    parser.add_argument("--layout", choices=("one", "realistic"), default="one", help="One face per subject, or 1–10 (see above).")
    parser.add_argument("--largest", type=int, default=0, help="Faces of one subject among each size's.")
    parser.add_argument("--search", choices=(*SEARCHES, "compare", "sample", "shares"), default="exact")
    parser.add_argument(
        "--exact", action="store_true", help="The exact guard at every size (else sampled from open_set.SAMPLE_FROM faces)."
    )
    parser.add_argument("--vs-exact", action="store_true", help="A sampled guard's thresholds against the exact guard's, built after it.")
    parser.add_argument("--seeds", type=int, default=5, help="`--search shares`: seeds of the sample's hash per share.")
    parser.add_argument(
        "--probed", type=float, default=0.1, help="The share of lists or clusters an approximate search scans (HNSW: efSearch / 1,000)."
    )
    args = parser.parse_args()
    print("\n".join(machine_lines()))
    print(
        f"dim {args.dim}, layout {args.layout}, {args.largest:,} faces in one subject, {args.threads} FAISS thread(s), "
        f"the build's search {args.search}"
        + ("" if args.search == "exact" else f" ({args.probed:g} probed)")
        + "; one process per size; "
        + ("exact at every size" if args.exact else f"sampled from {open_set.SAMPLE_FROM:,} faces up, {open_set.LISTED:,} listed at least")
    )
    if args.search not in ("compare", "sample", "shares"):
        print(
            f"{'faces':>9} {'subjects':>9} {'listed':>9} {'build s':>8} {'CPU s':>8} {'add ms':>7} {'CPU ms':>7} "
            f"{'delete ms':>9} {'tail ms':>7} {'MiB':>7} {'grew':>7} {'peak':>7} {'subject ms':>9} {'search ms':>9} "
            f"{'scoring':>9} {'guard ms':>8}   T_LOSO(2q) at q = " + ", ".join(f"{q:g}" for q in FPIRS)
        )
    context = multiprocessing.get_context("spawn")
    for size in args.sizes:
        with context.Pool(1) as pool:  # a process per size: its peak memory is this size's
            print(pool.apply({"compare": compare, "sample": sample, "shares": shares}.get(args.search, measure), (size, args)), flush=True)


if __name__ == "__main__":
    main()
