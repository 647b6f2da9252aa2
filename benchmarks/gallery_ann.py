"""Gallery search at 100k–10M faces: each FAISS index the service can run (FACEGATE_INDEX), with
the exact re-scoring of its candidates that the service does, against the exact flat search.

Faces: real embeddings (the active embedder, dlib-resnet-v1 by default: 128-d) of the photos under
$FACEGATE_TEST_DATA/train (training identities) and $FACEGATE_TEST_DATA/lfw, each photo's largest
face aligned through the service's pipeline (decode → detect → align) once and kept, with the
embeddings, under FACEGATE_MODEL_CACHE/bench/gallery_ann (`--real` names other folders of photos in
person/image.jpg folders; `--aligned` takes them as crops already aligned for the embedder).
Queries are held-out images of the last folder (LFW) whose person has other images in the gallery
(mated searches). The rest of the gallery is distractors, either

- `--distractors gaussian` (the default): drawn from a Gaussian with the real embeddings' mean and
  covariance, L2-normalized. A Gaussian has none of real faces' structure (many near-duplicates of
  one person, look-alikes, ages, image qualities): IVF's lists are more even and the graph's
  neighbourhoods more uniform than in a real gallery; or
- `--distractors faces`: real faces, every training crop (never a query's person: LFW stays out)
  in `--augment` near copies (its mirror image, and crops of 85–100 % of it resized back, every
  other one mirrored), embedded like the rest: clusters of near-duplicates, as real galleries hold.
  The gallery can be at most the real faces plus these copies.

Prints the machine, then per index and search parameters (FACEGATE_INDEX_SEARCH_PARAMS; '' is
facegate's default for that index at that size, printed as resolved): build time, index size (its
file's; in memory it is the same), restart (read the persisted file), search p50/p99 at concurrency
1 and 8 (16 candidates from the index + exact re-scoring, as /identify top_k=1 asks), recall@1 and
recall@10 against the exact search, mate@1, and the service's recall check on the run's gallery: its
held-out sample (`check`) and its live one (`live`: a seeded share of the queries offered as /identify
offers them, those whose exact best passes the default decision; beside it `R@1 ok`, R@1 of every
query whose exact best passes it); with `--new-photos`, the truth of the index the check measures: a
photo of each of half its people searched as a new photo (`photos`), beside the check over the other
half's (`chk/2`). Run from the checkout after `make test`, with
FACEGATE_TEST_DATA and FACEGATE_MODEL_CACHE set as for the tests (docs/benchmarks.md gives every
command and how long it takes on 2 cores):

    nice -n 10 .venv/bin/python benchmarks/gallery_ann.py --size 1000000 --indexes Flat HNSW32 "IVF1024,SQ8"
    nice -n 10 .venv/bin/python benchmarks/gallery_ann.py --size 100000 --distractors faces --indexes HNSW32 "IVF256,Flat"
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import faiss
import numpy as np

from service.core.decision import decide_search
from service.core.errors import FacegateError
from service.core.open_set import GalleryShape
from service.core.pipeline import FacePipeline
from service.core.settings import Settings
from service.gallery.index import (
    ASIDE,
    CANDIDATES,
    MAX_TRAIN_PER_LIST,
    NEAR_COPY,
    FaissIndex,
    IndexConfig,
    held_back,
    read_meta,
    set_search_threads,
    train_size,
)
from service.gallery.recall import TIE, LiveQueries, Probe, held_out, index_best, live_probe, measured, one_per_subject, passing
from service.gallery.sqlite import ID_HASH
from training.near_copy import near_copies

PHOTOS = {".jpg", ".jpeg", ".png"}
RECALL_SAMPLE = Settings.model_fields["index_recall_sample"].default  # the service's recall check, as configured by default
EMBED_BATCH = 64


def fail(message: str) -> None:
    """One line on stderr, exit status 2: what is missing and how to give it."""
    sys.exit(f"gallery_ann.py: {message}")


def peak_rss_gib() -> float:
    """The process's peak resident memory (VmHWM), the gallery file's cached pages included."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def data_folders(real: list[Path] | None) -> list[Path]:
    """--real, else FACEGATE_TEST_DATA's train/ and lfw/; each must be a folder."""
    if real is None:
        root = os.environ.get("FACEGATE_TEST_DATA")
        if not root:
            fail("FACEGATE_TEST_DATA is not set (the folder holding train/ and lfw/, as for the tests); or pass --real FOLDER...")
        real = [Path(root) / "train", Path(root) / "lfw"]
    for folder in real:
        if not folder.is_dir():
            fail(f"no folder {folder} (photos in person/image.jpg folders: set FACEGATE_TEST_DATA or pass --real FOLDER...)")
    return real


def photos_of(folder: Path) -> list[Path]:
    found = sorted(p for p in folder.glob("*/*") if p.suffix.lower() in PHOTOS)
    if not found:
        fail(f"no photos in {folder} (expected {folder}/<person>/<image>.jpg)")
    return found


class Progress:
    """A line on stderr every 30 s and at the end: the first run aligns and embeds for minutes."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.started, self.shown = what, total, time.perf_counter(), time.perf_counter()

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if done == self.total or now - self.shown > 30:
            self.shown = now
            print(f"  {self.what}: {done:,} of {self.total:,} ({done / (now - self.started):.0f}/s)", file=sys.stderr, flush=True)


def aligned(pipeline: FacePipeline, photo: Path) -> np.ndarray | None:
    """The photo's largest face aligned for the embedder (RGB), or None where none is found."""
    try:
        image = pipeline.decode(photo.read_bytes())
        faces = pipeline.detect(image)
    except FacegateError:
        return None
    return pipeline.align(image, faces[:1])[0] if faces else None


def aligned_crops(folder: Path, pipeline: FacePipeline, cache: Path) -> tuple[Path, list[str]]:
    """The largest face of every photo under `folder`, aligned for the embedder through the service's
    pipeline and kept as JPEG under `cache` once (an interrupted run goes on where it stopped); the
    crops' folder and their paths in it (person/image.jpg). Photos without a face are left out."""
    out = cache / "crops" / f"{folder.name}-{hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:8]}-{pipeline.template}"
    listing = out / "crops.txt"
    if listing.exists():
        return out, listing.read_text().splitlines()
    photos, kept = photos_of(folder), []
    shown = Progress(f"aligning {folder.name}", len(photos))
    for n, photo in enumerate(photos, 1):
        rel = f"{photo.parent.name}/{photo.stem}.jpg"
        if not (out / rel).exists():
            if (crop := aligned(pipeline, photo)) is None:
                continue
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(out / rel), crop[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
        kept.append(rel)
        shown(n)
    listing.write_text("\n".join(kept))
    return out, kept


def embed_folder(folder: Path, pipeline: FacePipeline, cache: Path, aligned: bool, copies: int = 0) -> tuple[np.ndarray, list[str]]:
    """Embeddings of the folder's faces (with `copies`, of that many near copies of each instead),
    computed once into `cache`, and their names (folder:person/image)."""
    embedder = pipeline.require_embedder()
    if aligned:
        root, crops = folder, [f"{p.parent.name}/{p.name}" for p in photos_of(folder)]
    else:
        root, crops = aligned_crops(folder, pipeline, cache)
    key = hashlib.sha256(f"{root.resolve()} {embedder.manifest.file.sha256} {copies}".encode()).hexdigest()[:12]
    path = cache / "embeddings" / f"{folder.name}-{'copies' if copies else 'faces'}-{key}.npy"
    names = [f"{folder.name}:{c}" for c in crops for _ in range(max(copies, 1))]
    if path.exists():
        return np.load(path), names
    rng, out, batch = np.random.default_rng(0), [], []
    shown = Progress(f"embedding {folder.name}{f' in {copies} near copies each' if copies else ''}", len(crops))
    for n, crop in enumerate(crops, 1):
        image = cv2.imread(str(root / crop))[..., ::-1]
        if image.shape[:2] != embedder.size:
            fail(f"{root / crop} is {image.shape[1]}x{image.shape[0]}, not an aligned crop for {embedder.manifest.name} (drop --aligned)")
        batch += near_copies(image, copies, rng) if copies else [image]
        if len(batch) >= EMBED_BATCH or n == len(crops):
            out.append(embedder.embed(np.stack(batch)))
            batch = []
            shown(n)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.concatenate(out))
    return np.load(path), names


def split_queries(
    names: list[str], vectors: np.ndarray, count: int, rng: np.random.Generator, folder: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(gallery part, queries, the gallery rows' identities, the queries'): one image of `count`
    people of `folder` that have several, held out."""
    people: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        people.setdefault(name.split("/")[0], []).append(i)
    several = [rows for person, rows in people.items() if len(rows) > 1 and person.startswith(f"{folder}:")]
    if not several:
        fail(f"no person in {folder} has two images: the queries are held-out images of people with several")
    chosen = [several[i][0] for i in rng.permutation(len(several))[:count]]
    keep = np.ones(len(vectors), bool)
    keep[chosen] = False
    identity = np.array([name.split("/")[0] for name in names])
    return vectors[keep], vectors[chosen], identity[keep], identity[chosen]


def gallery_file(real: np.ndarray, size: int, path: Path, faces: np.ndarray | None, seed: int = 0) -> np.memmap:
    """`real`, then distractors: `faces` (shuffled) or, without, draws from a Gaussian with `real`'s
    mean and covariance, unit length; in a float32 file (the page cache holds it, not this process:
    the service reads its embeddings from the store)."""
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, "w+", np.float32, (size, real.shape[1]))
    out[: len(real)] = real
    if faces is not None:
        out[len(real) :] = faces[rng.permutation(len(faces))[: size - len(real)]]
        out.flush()
        return out
    mean, cov = real.mean(0), np.cov(real, rowvar=False)
    chol = np.linalg.cholesky(cov + 1e-9 * np.eye(len(mean)))
    for start in range(len(real), size, 500_000):
        n = min(500_000, size - start)
        x = (rng.standard_normal((n, len(mean)), dtype=np.float32) @ chol.T.astype(np.float32)) + mean
        out[start : start + n] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    return out


class ArrayGallery:
    """The part of a gallery store the recall check reads (service/gallery/recall.py), over the run's
    gallery file: face id = row, subject = a code of the real face's identity (each distractor its own)."""

    def __init__(self, vectors: np.ndarray, who: np.ndarray):
        self.vectors, self.who = vectors, who

    def mated_faces(self) -> tuple[np.ndarray, np.ndarray]:
        _, first, counts = np.unique(self.who, return_inverse=True, return_counts=True)
        mated = np.flatnonzero(counts[first] > 1).astype(np.int64)
        return mated, self.who[mated]

    def lookup_faces(self, face_ids: list[int]) -> dict[int, tuple[str, str, np.ndarray]]:
        rows = np.unique(np.asarray(face_ids, np.int64))
        rows = rows[(rows >= 0) & (rows < len(self.vectors))]
        return {int(i): (str(self.who[i]), "", v) for i, v in zip(rows, np.asarray(self.vectors[rows]), strict=True)}

    def face_chips(self, face_ids: list[int]) -> dict:
        return {}

    def embeddings_after(self, after_id: int, limit: int) -> tuple[np.ndarray, np.ndarray]:
        start = after_id + 1 if after_id else 0
        return np.arange(start, min(start + limit, len(self.vectors)), dtype=np.int64), np.asarray(self.vectors[start : start + limit])


def photos_to_come(vectors: np.ndarray, who: np.ndarray, count: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(their embeddings, the rows taken out, their subjects): a face of each of up to `count` of half
    the gallery's people with another face (drawn at random), taken out of the gallery before any
    index is built, with their near copies (NEAR_COPY or more to one, whatever the subject: a new photo
    has none enrolled); their rows are zeroed in the gallery file: no index holds them and no exact
    answer is one of them. New photos of enrolled people, searched through the very index the check
    measures: the truth for that index, where `new` is another training's. Half the people, so that the
    check's faces of the other half (`chk/2`) are drawn from a gallery these did not change: a person
    left with one face by them is no longer the check's to draw, and the people it draws are then
    those with more faces (found more easily)."""
    rng = np.random.default_rng(seed)
    _, first, counts = np.unique(who, return_inverse=True, return_counts=True)
    mated = np.flatnonzero(counts[first] > 1)
    people = np.unique(who[mated])
    half = rng.permutation(people)[: min(len(people) // 2, count)]
    among = mated[np.isin(who[mated], half)]
    rows = one_per_subject(among, who[among], len(half), rng)  # one each: a second would leave its person none
    photos = np.asarray(vectors[rows]).copy()
    out = [rows]
    for start in range(0, len(vectors), 200_000):
        near = (photos @ np.asarray(vectors[start : start + 200_000]).T >= NEAR_COPY).any(0)
        out.append(np.flatnonzero(near) + start)
    taken = np.unique(np.concatenate(out))
    vectors[taken] = 0
    return photos, taken, half


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Ids of the exact top-k per query, by chunks of the gallery."""
    best_s = np.full((len(queries), k), -np.inf, np.float32)
    best_i = np.full((len(queries), k), -1, np.int64)
    for start in range(0, len(vectors), 200_000):
        scores = queries @ np.asarray(vectors[start : start + 200_000]).T
        top = np.argpartition(-scores, k, axis=1)[:, :k]
        s = np.concatenate([best_s, np.take_along_axis(scores, top, 1)], 1)
        i = np.concatenate([best_i, top + start], 1)
        order = np.argsort(-s, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(s, order, 1), np.take_along_axis(i, order, 1)
    return best_i


def rescored(index: FaissIndex, vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The service's search: the index's candidates, re-scored from the stored embeddings, best first."""
    _, ids = index.search(query[None], CANDIDATES)
    ids = np.sort(ids[0][ids[0] >= 0])  # sorted reads, like the store's lookup
    scores = np.asarray(vectors[ids]) @ query
    return ids[np.argsort(-scores, kind="stable")]


def latencies(index: FaissIndex, vectors: np.ndarray, queries: np.ndarray, concurrency: int) -> np.ndarray:
    def one(q: np.ndarray) -> float:
        t = time.perf_counter()
        rescored(index, vectors, q)
        return (time.perf_counter() - t) * 1000

    with ThreadPoolExecutor(concurrency) as pool:
        return np.array(list(pool.map(one, queries)))


def build(
    spec: str, vectors: np.ndarray, dim: int, who: np.ndarray, leave_out: np.ndarray | None = None, seed: int | None = None
) -> FaissIndex:
    """The index as the store builds it (face id = row), or as a gallery without the faces `leave_out`
    would have it: trained on the same sample but them, none of them added. `who`: each face's
    subject (the recall check's candidates are a face of each of those with another). `seed`: its IVF
    k-means seed (None: FAISS's own), which alone moves recall at a small nprobe by a few hundredths."""
    index = FaissIndex(dim, spec)
    if seed is not None and (ivf := faiss.try_extract_index_ivf(index._index)) is not None:
        ivf.cp.seed = seed
    if not index.is_trained:
        needed = train_size(spec, dim)
        ivf = faiss.try_extract_index_ivf(index._index)
        n = min(len(vectors), MAX_TRAIN_PER_LIST * ivf.nlist if ivf is not None else needed)
        rows = np.arange(len(vectors))[:: max(len(vectors) // n, 1)]
        rows = rows[~held_back(rows)][:n]  # the store's sample (sqlite.py's TRAINING_FACES), and beside it its CHECK_CANDIDATES
        rows = rows if leave_out is None else np.setdiff1d(rows, leave_out)
        candidates = check_candidates(who, leave_out)
        rows = np.union1d(rows, candidates)
        index.train(rows, np.asarray(vectors[rows]), candidates, check_sample=RECALL_SAMPLE)
    if index.aside is not None:  # an HNSW graph keeps the candidates out of it (index.py `open_index`)
        index.aside_for = check_candidates(who, leave_out)
    for start in range(0, len(vectors), 200_000):
        rows = np.arange(start, min(start + 200_000, len(vectors)))
        rows = rows if leave_out is None else np.setdiff1d(rows, leave_out)
        index.add(rows, np.asarray(vectors[rows]))
    index.aside_for = None
    return index


def check_candidates(who: np.ndarray, leave_out: np.ndarray | None = None) -> np.ndarray:
    """sqlite.py's CHECK_CANDIDATES over the run's gallery (face id = row; `leave_out`: not in it): per
    subject with another face, its face first in ID_HASH's order; the subjects in the hashed order
    of their first face's id; the first ASIDE."""
    ids = np.arange(len(who), dtype=np.int64)
    ids = ids if leave_out is None else np.setdiff1d(ids, leave_out)
    order = np.lexsort((ids * ID_HASH % 2**32, who[ids]))  # by subject, then hash
    ranked, subjects = ids[order], who[ids][order]
    starts = np.flatnonzero(np.r_[True, subjects[1:] != subjects[:-1]])
    several = np.diff(np.r_[starts, len(ranked)]) > 1
    first = np.minimum.reduceat(ranked, starts)[several]
    return ranked[starts][several][np.argsort(first * ID_HASH % 2**32, kind="stable")][:ASIDE]


def new_photos_found(
    spec: str, vectors: np.ndarray, who: np.ndarray, probe: Probe, seed: int | None = None, gone: np.ndarray | None = None
) -> Callable[[str], float]:
    """What the recall check estimates, measured: its held-out faces searched as new photos through
    the index of the gallery without them (`build`'s `leave_out`, with `gone`: rows no index of the
    run holds), against their exact best there; recall@1 at the search parameters given (FaissIndex's,
    '' for the default)."""
    leaving = probe.leaving[probe.left_out >= 0]  # each face and its near copies
    mated = np.unique(leaving[leaving >= 0])
    queries = probe.queries[probe.left_out >= 0]
    set_search_threads(2)  # built as the index it stands beside was
    index = build(spec, vectors, vectors.shape[1], who, mated if gone is None else np.union1d(mated, gone), seed)
    set_search_threads(1)
    best = np.full(len(queries), -np.inf, np.float32)
    for start in range(0, len(vectors), 200_000):
        scores = queries @ np.asarray(vectors[start : start + 200_000]).T
        scores[:, mated[(mated >= start) & (mated < start + 200_000)] - start] = -np.inf
        best = np.maximum(best, scores.max(1))

    def found(params: str) -> float:
        nonlocal index
        index = FaissIndex(vectors.shape[1], spec, params, index._index, aside=index.aside)
        index.tune()
        top = np.array(
            [float(np.asarray(vectors[f[0]]) @ q) if len(f) else -np.inf for f, q in ((rescored(index, vectors, q), q) for q in queries)]
        )
        return float(np.mean(top >= best - 1e-6))

    return found


def store_restart(vectors: np.ndarray, who: np.ndarray, spec: str, params: str, folder: Path) -> None:
    """Restart to ready through the SQLite store: the first open builds (and persists) the index, the
    second loads it; both include the store's start-up checks (counts, fingerprint). Then the
    service's recall check (service/gallery/recall.py) on that store: its recall@1 and what it costs.
    Without the open-set guard: its build is an exact leave-one-out search of every face (quadratic:
    about 40 minutes of CPU at 1M faces here, at each start; benchmarks/open_set_guard.py measures it)."""
    import logging
    import sqlite3

    from service.core.models.manifest import EmbedderKey
    from service.gallery.sqlite import DATABASE, SqliteGallery

    logging.disable(logging.WARNING)
    key = EmbedderKey("bench", "b" * 64, vectors.shape[1])
    SqliteGallery.open(folder, key, searchable=False).close()  # the schema
    db = sqlite3.connect(folder / DATABASE)
    # a subject per person (`who`: each distractor its own), so that the check draws as from the run's gallery; a later schema adds columns
    db.executemany(
        "INSERT INTO subjects (collection, id, name, metadata, created, updated) VALUES ('default', ?, ?, '{}', 0, 0)",
        ((f"s{w}", f"s{w}") for w in np.unique(who)),
    )
    for start in range(0, len(vectors), 100_000):
        chunk = np.asarray(vectors[start : start + 100_000])
        db.executemany(
            "INSERT INTO faces (id, collection, subject_id, embedding, model_name, model_sha256, created) "
            "VALUES (?, 'default', ?, ?, 'bench', ?, 0)",
            (
                (start + i + 1, f"s{w}", v.tobytes(), key.sha256)
                for i, (w, v) in enumerate(zip(who[start : start + len(chunk)], chunk, strict=True))
            ),
        )
    db.commit()
    db.close()
    runs = [("first start (build + save)", "")] + [("restart (load)", search) for search in params.split("|")]
    for what, search in runs:
        started = time.perf_counter()
        gallery = SqliteGallery.open(folder, key, index=IndexConfig(spec, search, folder / "index"), guard=False)
        ready = time.perf_counter() - started
        print(f"SQLite store, {gallery.index.size:,} faces, {spec}: {what} {ready:.1f} s", flush=True)
        if what.startswith("restart") and gallery.index is not None and not gallery.index.exact:
            started = time.monotonic()  # the check's time: its draw and exact pass too
            check = measured(gallery, gallery.index, held_out(gallery, gallery.index, RECALL_SAMPLE, seed=0), started)
            print(
                f"SQLite store, {spec}: the recall check ({check.queries} queries, search parameters {check.search_params}) "
                f"measured recall@1 {check.recall_at_1:.3f} ({check.mated_queries} faces left out, "
                f"{check.queries - check.mated_queries} near copies) "
                f"in {check.seconds:.1f} s",
                flush=True,
            )
        gallery.close()


def milvus_lite(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, folder: Path) -> None:
    """Milvus Lite (one local file) as the store's shared index: fill time, a store's start-up
    (connect and load the collection: nothing read from the store), search latency and recall."""
    import logging

    from service.core.models.manifest import EmbedderKey
    from service.gallery.milvus import MilvusIndex
    from service.gallery.sqlite import SqliteGallery

    logging.disable(logging.WARNING)
    key = EmbedderKey("bench", "c" * 64, vectors.shape[1])
    config = IndexConfig(milvus_uri=str(folder / "milvus.db"), milvus_index="FLAT", milvus_timeout=300)  # a loaded machine: Lite is slow
    index = MilvusIndex(config.milvus_uri, "", key.dim, key.sha256, "FLAT", timeout=300)  # bulk upserts take longer than a request's 5 s
    started = time.perf_counter()
    for start in range(0, len(vectors), 20_000):
        index.add(np.arange(start, min(start + 20_000, len(vectors))), np.asarray(vectors[start : start + 20_000]))
    index.flush()  # as `facegate gallery sync-index` ends: unflushed rows are searched row by row
    print(f"Milvus Lite, {index.size:,} faces: filled and flushed in {time.perf_counter() - started:.0f} s", flush=True)
    index.close()
    started = time.perf_counter()
    gallery = SqliteGallery.open(folder, key, index=config)
    print(f"Milvus Lite: a store starts in {time.perf_counter() - started:.1f} s", flush=True)
    took, found = [], []
    queries, truth = queries[:50], truth[:50]  # Lite's FLAT scan is slow: 50 queries show it
    for q in queries:
        t = time.perf_counter()
        _, ids = gallery.index.search(q[None], CANDIDATES)
        ids = np.sort(ids[0][ids[0] >= 0])
        found.append(ids[np.argsort(-(np.asarray(vectors[ids]) @ q), kind="stable")][:1])
        took.append((time.perf_counter() - t) * 1000)
    r1 = np.mean([len(f) and f[0] == t for f, t in zip(found, truth[:, 0], strict=True)])
    print(
        f"Milvus Lite (FLAT): search p50 {np.percentile(took, 50):.1f} ms, p99 {np.percentile(took, 99):.1f} ms, R@1 {r1:.3f}", flush=True
    )
    gallery.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="Faces in the gallery: the real ones, then distractors.")
    parser.add_argument("--indexes", nargs="+", default=["Flat", "HNSW32", "IVF1024,Flat", "IVF1024,PQ32"])
    parser.add_argument(
        "--params",
        nargs="*",
        default=[],
        help="FACEGATE_INDEX_SEARCH_PARAMS per index (same order; '' for facegate's default at that size; a|b: each on one build).",
    )
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument(
        "--real",
        type=Path,
        nargs="+",
        help="Folders of photos (person/image.jpg); queries come from the last one. Default: FACEGATE_TEST_DATA's train and lfw.",
    )
    parser.add_argument("--aligned", action="store_true", help="The --real images are crops already aligned for the embedder.")
    parser.add_argument(
        "--distractors", choices=["gaussian", "faces"], default="gaussian", help="What fills the gallery past the real faces."
    )
    parser.add_argument("--augment", type=int, default=4, help="With --distractors faces: near copies of each crop of the first folders.")
    parser.add_argument(
        "--cache", type=Path, help="Where the aligned crops and their embeddings are kept (default FACEGATE_MODEL_CACHE/bench/gallery_ann)."
    )
    parser.add_argument("--recall-only", action="store_true", help="Skip the latency runs (a quick sweep of search parameters).")
    parser.add_argument(
        "--check-truth",
        action="store_true",
        help="Also build each index without the recall check's held-out faces and search them as new photos (the 'new' column).",
    )
    parser.add_argument(
        "--new-photos",
        type=int,
        default=0,
        help="Take a face of each of up to this many of half the gallery's people (with their near copies) out of it before "
        "building, and search them as new photos through each index the check measures (the 'photos' column), beside the "
        "check over the other half's people (the 'chk/2' column).",
    )
    parser.add_argument("--new-photos-seed", type=int, default=1, help="Which faces --new-photos takes (a seed).")
    parser.add_argument(
        "--kmeans-seed", type=int, help="The IVF indexes' k-means seed, for both builds of --check-truth (default: FAISS's own, 1234)."
    )
    parser.add_argument(
        "--live-share", type=float, default=0.5, help="Share of the queries the recall check keeps as live /identify traffic (seeded)."
    )
    parser.add_argument(
        "--store", help="Also time a SQLite store's start and restart with this index (factory string), and run the service's recall check."
    )
    parser.add_argument("--store-params", default="", help="The store's search parameters, a|b: a restart and a recall check each.")
    parser.add_argument(
        "--milvus-lite", action="store_true", help="Also fill Milvus Lite with the gallery: start-up and search through it."
    )
    args = parser.parse_args()
    folders = data_folders(args.real)
    settings = Settings()
    cache = args.cache or settings.model_cache / "bench" / "gallery_ann"
    try:
        pipeline = FacePipeline.from_settings(settings)
        pipeline.require_embedder()
    except FacegateError as exc:
        fail(f"{exc} (run `make test` or `facegate models pull` first, with FACEGATE_MODEL_CACHE set as for it)")
    parts = [embed_folder(folder, pipeline, cache, args.aligned) for folder in folders]
    real, names = np.concatenate([p[0] for p in parts]), [n for p in parts for n in p[1]]
    rng = np.random.default_rng(0)
    enrolled, queries, enrolled_who, query_who = split_queries(names, real, args.queries, rng, folders[-1].name)
    faces = None
    if args.distractors == "faces":
        if len(folders) < 2:
            fail("--distractors faces copies the faces of every folder but the last (the queries'): give two folders or more")
        faces = np.concatenate([embed_folder(folder, pipeline, cache, args.aligned, args.augment)[0] for folder in folders[:-1]])
        if len(enrolled) + len(faces) < args.size:
            fail(f"--size {args.size:,}: the faces at hand give {len(enrolled) + len(faces):,} (raise --augment or lower --size)")
    if args.size < len(enrolled):
        fail(f"--size {args.size:,} is smaller than the {len(enrolled):,} real faces")
    dim = real.shape[1]
    with tempfile.TemporaryDirectory(dir=cache, prefix="run-") as folder:  # this run's gallery file and index files
        work = Path(folder)
        vectors = gallery_file(enrolled, args.size, work / "gallery.npy", faces)
        who = np.concatenate([np.unique(enrolled_who, return_inverse=True)[1], np.arange(len(enrolled), args.size) + len(enrolled)])
        gone: np.ndarray | None = None  # the rows of --new-photos and their near copies: in no index of the run
        if args.new_photos:
            photos, gone, their_people = photos_to_come(vectors, who, args.new_photos, args.new_photos_seed)
            who[gone] = np.arange(len(gone)) + 2 * args.size  # each its own subject: not the check's to draw
            photo_best = np.einsum("qd,qd->q", np.asarray(vectors[exact_top(vectors, photos, 1)[:, 0]]), photos)
            copies = len(gone) - len(photos)
            print(f"new photos: {len(photos)} faces of the gallery's people, one per person, and {copies} near copies, out of the gallery")
        started = time.perf_counter()
        truth = exact_top(vectors, queries, 10)
        print(
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {faiss.__version__=}, 1 OpenMP thread; "
            f"{args.size:,} faces × {dim} ({pipeline.require_embedder().manifest.name}: {len(enrolled):,} real, the rest "
            f"{'near copies of the training faces' if faces is not None else 'Gaussian'} distractors); {len(queries)} mated queries of "
            f"{folders[-1].name}; exact top-10 in {time.perf_counter() - started:.0f} s"
        )
        # Queries whose exact top-1 is an image of the same person: there, recall decides whether the
        # match is found; elsewhere the top-1 is an impostor (often a distractor) below any threshold.
        genuine = np.array([t < len(enrolled) and enrolled_who[t] == person for t, person in zip(truth[:, 0], query_who, strict=True)])
        best = np.einsum("qd,qd->q", np.asarray(vectors[truth[:, 0]]), queries)  # the exact top-1 similarity
        print(f"exact top-1 is the same person for {genuine.sum()} of {len(queries)} queries (mate@1: how often the index finds that face)")
        # The service's recall check (service/gallery/recall.py) on this gallery, beside R@1: its held-out
        # queries (enrolled faces of people with another, each left out) and their exact answer, drawn per index;
        # and its live ones: a seeded share of the queries, kept as /identify keeps them, those whose exact best passes the decision.
        held = ArrayGallery(vectors, who)
        # /identify's default decision for this gallery (FACEGATE_DEFAULT_FPIR; no open-set guard's tail)
        shape = GalleryShape(len(np.unique(held.who)), args.size)
        decision = decide_search(pipeline.require_embedder().manifest, None, None, None, shape, settings.default_fpir)
        live = LiveQueries(args.live_share, 2 * RECALL_SAMPLE, seed=0)
        started = time.perf_counter()
        for query in queries:
            live.offer(query, decision)
        offer_us = (time.perf_counter() - started) / len(queries) * 1e6
        started = time.perf_counter()
        shadowed = live_probe(held, *live.taken())
        exact_s = time.perf_counter() - started
        passes = passing(held, queries, [decision] * len(queries))[0]
        print(
            f"live: {shadowed.sampled} of {len(queries)} queries kept (share {args.live_share}), {len(shadowed.queries)} of them mated "
            f"(their exact best passes /identify's decision: {decision.score} >= {decision.threshold}, FPIR {decision.fpir}); "
            f"{passes.sum()} of all {len(queries)} pass it (R@1 ok); an offer {offer_us:.1f} µs, the kept ones' exact pass {exact_s:.1f} s"
        )
        print(
            f"{'index':<16} {'params':<14} {'build s':>8} {'idx MiB':>8} {'load s':>7} {'c1 p50':>7} {'c1 p99':>7} "
            f"{'c8 p50':>7} {'c8 p99':>7} {'R@1':>6} {'R@10':>6} {'mate@1':>6} {'R@1 ok':>6} {'live':>6} {'check':>6}"
            + (f" {'new':>6}" if args.check_truth else "")
            + (f" {'chk/2':>6} {'photos':>6}" if args.new_photos else "")
        )
        params = args.params + [""] * (len(args.indexes) - len(args.params))
        for spec, param in zip(args.indexes, params, strict=True):
            probe: Probe | None = None
            truth_of: Callable[[str], float] | None = None  # the check's faces as new photos
            gc.collect()
            started = time.perf_counter()
            set_search_threads(2)  # building may use both cores; searches run on one, as the service's do
            index = build(spec, vectors, dim, who, gone, args.kmeans_seed)
            set_search_threads(1)
            build_s = time.perf_counter() - started
            with tempfile.TemporaryDirectory(dir=work) as tmp:  # what a restart reads (flat is rebuilt from the store instead)
                path = Path(tmp) / "index.json"
                index.save(path, {})
                ram = path.with_name(read_meta(path)["file"]).stat().st_size / 2**20  # the index in memory is its file's size
                del index
                gc.collect()
                started = time.perf_counter()
                meta = read_meta(path)
                assert meta is not None
                index = FaissIndex.load(path, meta, "")
                load_s = time.perf_counter() - started if IndexConfig(spec, directory=cache).path("0" * 64) else float("nan")
            for search in param.split("|"):  # several search settings on one build
                # the same build (mapped), these parameters (or tuned); trained and kept aside as it was (the check draws those faces)
                index = FaissIndex(
                    dim,
                    spec,
                    search,
                    index._index,
                    base=index.base,
                    held_back=index.held_back,
                    aside=index.aside,
                    check_faces=index.check_faces,
                )
                index.tune()
                found = [rescored(index, vectors, q) for q in queries]
                top = np.array([float(np.asarray(vectors[f[0]]) @ q) if len(f) else -np.inf for f, q in zip(found, queries, strict=True)])
                hit = top >= best - 1e-6  # the exact best similarity found (a tie with another face counts)
                r10 = float(np.mean([len(set(f[:10].tolist()) & set(t.tolist())) / 10 for f, t in zip(found, truth, strict=True)]))
                if probe is None:  # per index: one trained holding back HELD_BACK's faces draws from them
                    probe = held_out(held, index, RECALL_SAMPLE, seed=0)
                    truth_of = new_photos_found(spec, vectors, who, probe, args.kmeans_seed, gone) if args.check_truth else None
                check = measured(held, index, probe, time.monotonic())
                shadow = f"{measured(held, index, shadowed).recall_at_1:>6.3f}" if len(shadowed.queries) else f"{'-':>6}"
                new = f" {truth_of(index.search_params):>6.3f}" if truth_of else ""
                if args.new_photos:  # the check over the people the new photos left alone; the same index's recall@1 of the photos
                    alone = (probe.left_out >= 0) & ~np.isin(who[np.maximum(probe.left_out, 0)], their_people)
                    found_check = index_best(held, index, probe.queries[alone], probe.leaving[alone], hide=True)  # as `measured`: HNSW
                    if found_check is None:  # not a graph: nothing to hide
                        found_check = index_best(held, index, probe.queries[alone], probe.leaving[alone])
                    new += f" {np.mean(found_check >= probe.best[alone] - TIE):>6.3f}"
                    tops = [(rescored(index, vectors, q), q) for q in photos]
                    top_photo = np.array([float(np.asarray(vectors[f[0]]) @ q) if len(f) else -np.inf for f, q in tops])
                    new += f" {np.mean(top_photo >= photo_best - 1e-6):>6.3f}"
                c1 = latencies(index, vectors, queries, 1) if not args.recall_only else np.full(1, np.nan)
                c8 = latencies(index, vectors, np.tile(queries, (2, 1)), 8) if not args.recall_only else np.full(1, np.nan)
                print(
                    f"{spec:<16} {index.search_params or '-':<14} {build_s:>8.1f} {ram:>8.0f} {load_s:>7.2f} "
                    f"{np.percentile(c1, 50):>7.2f} {np.percentile(c1, 99):>7.2f} "
                    f"{np.percentile(c8, 50):>7.2f} {np.percentile(c8, 99):>7.2f} "
                    f"{hit.mean():>6.3f} {r10:>6.3f} {hit[genuine].mean():>6.3f} {hit[passes].mean():>6.3f} {shadow} "
                    f"{check.recall_at_1:>6.3f}{new}"
                    + (" (HNSW: face hidden {:.3f}, kept {:.3f})".format(*check.mated_bounds) if check.mated_bounds else ""),
                    flush=True,
                )
            del index
        if args.store:
            with tempfile.TemporaryDirectory(dir=work) as tmp:
                store_restart(vectors, held.who, args.store, args.store_params, Path(tmp))
        if args.milvus_lite:
            with tempfile.TemporaryDirectory(dir=work) as tmp:
                milvus_lite(vectors, queries, truth, Path(tmp))
        print(f"peak RSS of the run {peak_rss_gib():.1f} GiB (the index, the gallery file's pages, the exact search's buffers)")


if __name__ == "__main__":
    main()
