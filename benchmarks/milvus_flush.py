"""Milvus Lite's search latency before and after a flush: rows upserted and not yet flushed sit in
growing segments, which Lite searches row by row (and counts row by row), so a gallery filled and
left unflushed searches in seconds. Fills a FLAT collection (`service.gallery.milvus.MilvusIndex`,
the service's own) with random unit vectors, then times searches of 16 candidates and count(*)
before and after `flush`, and a search right after one more upsert; prints the machine first.

    .venv/bin/python benchmarks/milvus_flush.py --faces 20000
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from service.gallery.index import CANDIDATES
from service.gallery.milvus import MilvusIndex


def timed(what: str, run, repeats: int) -> None:
    took = []
    for i in range(repeats):
        started = time.perf_counter()
        run(i)
        took.append((time.perf_counter() - started) * 1000)
    print(f"{what}: p50 {np.percentile(took, 50):,.0f} ms, max {max(took):,.0f} ms ({repeats} runs)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faces", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--searches", type=int, default=20)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    for line in machine_lines():
        print(line)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.faces + args.searches, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with tempfile.TemporaryDirectory() as folder:
        index = MilvusIndex(str(Path(folder) / "lite.db"), "", args.dim, "e" * 64, "FLAT", timeout=600)
        started = time.perf_counter()
        for start in range(0, args.faces, 20_000):
            end = min(start + 20_000, args.faces)
            index.add(np.arange(start, end), vectors[start:end])
        print(f"Milvus Lite, FLAT, {args.faces:,} faces × {args.dim}: upserted in {time.perf_counter() - started:.1f} s", flush=True)
        for when in ("not flushed", "flushed"):
            if when == "flushed":
                started = time.perf_counter()
                index.flush()
                print(f"flush: {time.perf_counter() - started:.1f} s", flush=True)
            timed(f"search, {when}", lambda i: index.search(vectors[i][None], CANDIDATES), args.searches)
            timed(f"count(*), {when}", lambda i: index.size, 3)
        extra = args.faces

        def upsert_then_search(i: int) -> None:
            index.add(np.array([extra + i]), vectors[extra + i][None])
            index.search(vectors[extra + i][None], CANDIDATES)

        timed("one upsert, then a search (flushed before)", upsert_then_search, 5)
        index.close()


if __name__ == "__main__":
    main()
