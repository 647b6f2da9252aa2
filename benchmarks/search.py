"""Gallery search latency and memory of the exact (flat inner-product) FAISS index.

Prints one row per gallery size: build time, index memory (vectors + ids) and the process RSS
growth, then single-query latency p50/p95/p99 for a top-k search. Synthetic L2-normalized
embeddings: a flat index's cost depends only on size and dimension, not on the data.

    .venv/bin/python benchmarks/search.py                      # 10k, 100k, 1M at dim 512
    .venv/bin/python benchmarks/search.py --sizes 10000 --dim 128 --queries 500
"""

from __future__ import annotations

import argparse
import gc
import time

import faiss
import numpy as np

from service.gallery.index import FaissIndex, set_search_threads


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def bench(size: int, dim: int, queries: int, k: int, chunk: int = 100_000) -> dict:
    rng = np.random.default_rng(size)
    gc.collect()
    before = rss_mib()
    index = FaissIndex(dim)
    started = time.perf_counter()
    for start in range(0, size, chunk):  # chunks keep the temporary copies small next to the index
        n = min(chunk, size - start)
        index.add(np.arange(start, start + n), unit_rows(rng, n, dim))
    build = time.perf_counter() - started
    grown = rss_mib() - before
    probes = unit_rows(rng, queries, dim)
    index.search(probes[0], k)  # warm-up
    latencies = []
    for q in probes:
        t = time.perf_counter()
        index.search(q, k)
        latencies.append((time.perf_counter() - t) * 1000)
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    return {"size": size, "build_s": build, "index_mib": size * (dim * 4 + 8) / 2**20, "rss_mib": grown, "p50": p50, "p95": p95, "p99": p99}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200, help="Queries per size (fewer are run at 1M: at most 100).")
    parser.add_argument("--k", type=int, default=400, help="Neighbours asked per search (/identify asks 4×top_k, at least 16).")
    parser.add_argument(
        "--threads", type=int, default=1, help="FAISS OpenMP threads (the service's FACEGATE_SEARCH_THREADS; 0 = FAISS default)."
    )
    args = parser.parse_args()
    if args.threads:
        set_search_threads(args.threads)
    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads, dim {args.dim}, k {args.k}")
    print(f"{'size':>10} {'build s':>8} {'index MiB':>10} {'RSS +MiB':>9} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for size in args.sizes:
        queries = args.queries if size < 1_000_000 else min(args.queries, 100)
        r = bench(size, args.dim, queries, args.k)
        print(
            f"{r['size']:>10} {r['build_s']:>8.2f} {r['index_mib']:>10.1f} {r['rss_mib']:>9.1f} "
            f"{r['p50']:>8.2f} {r['p95']:>8.2f} {r['p99']:>8.2f}"
        )
        gc.collect()


if __name__ == "__main__":
    main()
