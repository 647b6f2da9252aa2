"""Gallery search at 1M and 10M faces: each FAISS index the service can run (FACEGATE_INDEX), with
the exact re-scoring of its candidates that the service does, against the exact flat search.

Faces: real dlib-resnet-v1 embeddings (128-d) of the aligned crops we hold (training identities
and LFW), plus distractors drawn from a Gaussian with the real embeddings' mean and covariance,
L2-normalized. Queries are held-out LFW images whose identity has other images in the gallery
(mated searches). What that cannot show: real faces cluster by identity (many near-duplicates of
one person, look-alike families, ages, image qualities), a Gaussian has no such structure, so IVF's
lists are more even and the graph's neighbourhoods more uniform than in a real 10M gallery;
recall here is an estimate to confirm on real data (run the script on your own embeddings
with --real).

Prints, per index: build time, index size (its file's; in memory it is the same), restart (read the persisted file), search p50/p99 at
concurrency 1 and 8 (top-k 16 candidates from the index + exact re-scoring, as /identify top_k=1
asks), recall@1 and recall@10 against the exact search.

    nice -n 10 .venv/bin/python benchmarks/gallery_ann.py --size 1000000 --indexes Flat HNSW32 "IVF1024,Flat"
    nice -n 10 .venv/bin/python benchmarks/gallery_ann.py --size 10000000 --indexes "IVF4096,SQ8" --params nprobe=32
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import faiss
import numpy as np

from service.gallery.index import MAX_TRAIN_PER_LIST, FaissIndex, IndexConfig, read_meta, set_search_threads, train_size

CANDIDATES = 16  # what /identify asks the index for at top_k=1: max(4 × top_k, 16)


def peak_rss_gib() -> float:
    """The process's peak resident memory (VmHWM), the gallery file's cached pages included."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def embed_crops(folders: list[Path], cache: Path) -> np.ndarray:
    """dlib-resnet-v1 embeddings of every aligned crop under `folders`, computed once into `cache`."""
    if cache.exists():
        return np.load(cache)
    import cv2

    from service.core.pipeline import FacePipeline
    from service.core.settings import Settings

    embedder = FacePipeline.from_settings(Settings()).require_embedder()
    files = sorted(f for folder in folders for f in folder.rglob("*.jpg"))
    out = [embedder.embed(np.stack([cv2.imread(str(f))[..., ::-1] for f in files[s : s + 64]])) for s in range(0, len(files), 64)]
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, np.concatenate(out))
    (cache.with_suffix(".txt")).write_text("\n".join(f"{f.parent.parent.name}:{f.parent.name}/{f.name}" for f in files))
    return np.load(cache)


def split_queries(
    names: list[str], vectors: np.ndarray, count: int, rng: np.random.Generator, folder: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(gallery part, queries, the gallery rows' identities, the queries'): one image of `count`
    people of `folder` that have several, held out."""
    people: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        people.setdefault(name.split("/")[0], []).append(i)
    several = [rows for person, rows in people.items() if len(rows) > 1 and person.startswith(f"{folder}:")]
    chosen = [several[i][0] for i in rng.permutation(len(several))[:count]]
    keep = np.ones(len(vectors), bool)
    keep[chosen] = False
    identity = np.array([name.split("/")[0] for name in names])
    return vectors[keep], vectors[chosen], identity[keep], identity[chosen]


def gallery_file(real: np.ndarray, size: int, path: Path, seed: int = 0) -> np.memmap:
    """`real` then Gaussian distractors with its mean and covariance, unit length, in a float32
    file (the page cache holds it, not this process: the service reads its embeddings from the store)."""
    mean, cov = real.mean(0), np.cov(real, rowvar=False)
    chol = np.linalg.cholesky(cov + 1e-9 * np.eye(len(mean)))
    out = np.lib.format.open_memmap(path, "w+", np.float32, (size, real.shape[1]))
    out[: len(real)] = real
    rng = np.random.default_rng(seed)
    for start in range(len(real), size, 500_000):
        n = min(500_000, size - start)
        x = (rng.standard_normal((n, len(mean)), dtype=np.float32) @ chol.T.astype(np.float32)) + mean
        out[start : start + n] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.flush()
    return out


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


def build(spec: str, params: str, vectors: np.ndarray, dim: int) -> FaissIndex:
    index = FaissIndex(dim, spec, params)
    if not index.is_trained:
        needed = train_size(spec, dim)
        ivf = faiss.try_extract_index_ivf(index._index)
        n = min(len(vectors), MAX_TRAIN_PER_LIST * ivf.nlist if ivf is not None else needed)
        stride = max(len(vectors) // n, 1)
        index.train(np.asarray(vectors[::stride][:n]))
    for start in range(0, len(vectors), 200_000):
        chunk = np.asarray(vectors[start : start + 200_000])
        index.add(np.arange(start, start + len(chunk)), chunk)
    return index


def store_restart(vectors: np.ndarray, spec: str, params: str, folder: Path) -> None:
    """Restart to ready through the SQLite store: the first open builds (and persists) the index, the
    second loads it; both include the store's start-up checks (counts, fingerprint)."""
    import logging
    import sqlite3

    from service.core.models.manifest import EmbedderKey
    from service.gallery.sqlite import DATABASE, SqliteGallery

    logging.disable(logging.WARNING)
    key = EmbedderKey("bench", "b" * 64, vectors.shape[1])
    SqliteGallery.open(folder, key, searchable=False).close()  # the schema
    db = sqlite3.connect(folder / DATABASE)
    db.execute("INSERT INTO subjects VALUES ('s', 's', '{}', 0, 0)")
    for start in range(0, len(vectors), 100_000):
        chunk = np.asarray(vectors[start : start + 100_000])
        db.executemany(
            "INSERT INTO faces (subject_id, embedding, model_name, model_sha256, created) VALUES ('s', ?, 'bench', ?, 0)",
            ((v.tobytes(), key.sha256) for v in chunk),
        )
    db.commit()
    db.close()
    config = IndexConfig(spec, params, folder / "index")
    for what in ("first start (build + save)", "restart (load)"):
        started = time.perf_counter()
        gallery = SqliteGallery.open(folder, key, index=config)
        ready = time.perf_counter() - started
        print(f"SQLite store, {gallery.index.size:,} faces, {spec}: {what} {ready:.1f} s", flush=True)
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
    config = IndexConfig(milvus_uri=str(folder / "milvus.db"), milvus_index="FLAT")
    index = MilvusIndex(config.milvus_uri, "", key.dim, key.sha256, "FLAT", timeout=300)  # bulk upserts take longer than a request's 5 s
    started = time.perf_counter()
    for start in range(0, len(vectors), 20_000):
        index.add(np.arange(start, min(start + 20_000, len(vectors))), np.asarray(vectors[start : start + 20_000]))
    print(f"Milvus Lite, {index.size:,} faces: filled in {time.perf_counter() - started:.0f} s", flush=True)
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
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--indexes", nargs="+", default=["Flat", "HNSW32", "IVF1024,Flat", "IVF1024,PQ32"])
    parser.add_argument(
        "--params", nargs="*", default=[], help="FACEGATE_INDEX_SEARCH_PARAMS per index (same order; '' for none; a|b: each on one build)."
    )
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument(
        "--real",
        type=Path,
        nargs="+",
        default=[Path("/work/cache/train_dlib150"), Path("/work/cache/lfw_dlib150")],
        help="Folders of aligned crops (person/image.jpg); queries come from the last one.",
    )
    parser.add_argument(
        "--cache", type=Path, default=Path("/work/cache/issue-27"), help="Where the embeddings and the gallery file are kept."
    )
    parser.add_argument("--store", help="Also time a SQLite store's start and restart with this index (factory string).")
    parser.add_argument(
        "--milvus-lite", action="store_true", help="Also fill Milvus Lite with the gallery: start-up and search through it."
    )
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    cache = (
        args.cache / f"real_{hashlib.sha256(' '.join(str(f.resolve()) for f in args.real).encode()).hexdigest()[:12]}.npy"
    )  # per set of folders
    real = embed_crops(args.real, cache)
    names = cache.with_suffix(".txt").read_text().splitlines()
    enrolled, queries, enrolled_who, query_who = split_queries(names, real, args.queries, rng, args.real[-1].name)
    dim = real.shape[1]
    vectors = gallery_file(enrolled, args.size, args.cache / f"gallery_{args.size}.npy")
    started = time.perf_counter()
    truth = exact_top(vectors, queries, 10)
    print(
        f"{platform.processor() or platform.machine()}, {faiss.__version__=}, 1 OpenMP thread; {args.size:,} faces × {dim} "
        f"({len(enrolled):,} real, the rest Gaussian distractors); {len(queries)} mated LFW queries; "
        f"exact top-10 in {time.perf_counter() - started:.0f} s"
    )
    # Queries whose exact top-1 is an image of the same person: there, recall decides whether the
    # match is found; elsewhere the top-1 is an impostor (often a distractor) below any threshold.
    genuine = np.array([t < len(enrolled) and enrolled_who[t] == who for t, who in zip(truth[:, 0], query_who, strict=True)])
    print(f"exact top-1 is the same person for {genuine.sum()} of {len(queries)} queries (mate@1: how often the index finds that face)")
    print(
        f"{'index':<16} {'params':<12} {'build s':>8} {'idx MiB':>8} {'load s':>7} {'c1 p50':>7} {'c1 p99':>7} "
        f"{'c8 p50':>7} {'c8 p99':>7} {'R@1':>6} {'R@10':>6} {'mate@1':>6}"
    )
    params = args.params + [""] * (len(args.indexes) - len(args.params))
    for spec, param in zip(args.indexes, params, strict=True):
        gc.collect()
        started = time.perf_counter()
        set_search_threads(2)  # building may use both cores; searches run on one, as the service's do
        index = build(spec, param.split("|")[0], vectors, dim)
        set_search_threads(1)
        build_s = time.perf_counter() - started
        with tempfile.TemporaryDirectory(dir=args.cache) as tmp:  # what a restart reads (flat is rebuilt from the store instead)
            path = Path(tmp) / "index.json"
            index.save(path, {})
            ram = path.with_name(read_meta(path)["file"]).stat().st_size / 2**20  # the index in memory is its file's size
            del index
            gc.collect()
            started = time.perf_counter()
            index = FaissIndex.load(path, read_meta(path), "")
            load_s = time.perf_counter() - started if IndexConfig(spec, directory=args.cache).path("0" * 64) else float("nan")
        for search in param.split("|"):  # several search settings on one build
            if search:
                faiss.ParameterSpace().set_index_parameters(index._index, search)
            found = np.stack(
                [np.pad(r[:10], (0, max(0, 10 - len(r[:10]))), constant_values=-1) for r in (rescored(index, vectors, q) for q in queries)]
            )
            r1 = float(np.mean(found[:, 0] == truth[:, 0]))
            r10 = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)]))
            mate = float(np.mean(found[genuine, 0] == truth[genuine, 0]))
            c1 = latencies(index, vectors, queries, 1)
            c8 = latencies(index, vectors, np.tile(queries, (2, 1)), 8)
            print(
                f"{spec:<16} {search or '-':<12} {build_s:>8.1f} {ram:>8.0f} {load_s:>7.2f} "
                f"{np.percentile(c1, 50):>7.2f} {np.percentile(c1, 99):>7.2f} "
                f"{np.percentile(c8, 50):>7.2f} {np.percentile(c8, 99):>7.2f} {r1:>6.3f} {r10:>6.3f} {mate:>6.3f}",
                flush=True,
            )
        del index
    if args.store:
        with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
            store_restart(vectors, args.store, "", Path(tmp))
    if args.milvus_lite:
        with tempfile.TemporaryDirectory(dir=args.cache) as tmp:
            milvus_lite(vectors, queries, truth, Path(tmp))
    print(f"peak RSS of the run {peak_rss_gib():.1f} GiB (the index, the gallery file's pages, the exact search's buffers)")


if __name__ == "__main__":
    main()
