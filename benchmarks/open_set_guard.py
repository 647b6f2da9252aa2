"""What the open-set guard costs a gallery (service/core/open_set.py, LeaveOneOut): building it from
every face (at start-up: an exact search of each face), one enrollment (one product with every face,
the lists it enters), one delete (the lists that named its subject, searched again), and reading the
tail a decision needs. Synthetic L2-normalized embeddings of one face per subject (the cost depends
on size and dimension, hardly on the data), or `--largest` of them in one subject (what bounds the
build's memory); with the machine, the CPU time of the build and of an enrollment beside their wall
time, which a shared machine inflates, and the process's peak memory over the build.

    .venv/bin/python benchmarks/open_set_guard.py                  # 10k and 100k faces at dim 128
    .venv/bin/python benchmarks/open_set_guard.py --sizes 20000 --largest 10000
    .venv/bin/python benchmarks/open_set_guard.py --sizes 1000000 --threads 2
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time

import numpy as np

from benchmarks.search import rss_mib
from service.core.open_set import LeaveOneOut
from service.gallery.index import set_search_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--writes", type=int, default=50, help="Enrollments and deletes timed per size.")
    parser.add_argument("--threads", type=int, default=1, help="FAISS threads (the service's FACEGATE_SEARCH_THREADS).")
    parser.add_argument("--largest", type=int, default=0, help="Faces of one subject among each size's (the rest one per subject).")
    args = parser.parse_args()
    set_search_threads(args.threads)
    machine = f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    print(f"{machine}; dim {args.dim}, {args.threads} FAISS thread(s), {args.largest} faces in the largest subject")
    print(f"{'faces':>9} {'build s (CPU)':>14} {'enroll ms (CPU)':>16} {'delete ms':>10} {'tail ms':>8} {'RSS MiB':>8} {'peak MiB':>8}")
    for size in args.sizes:
        rng = np.random.default_rng(size)
        vectors = rng.standard_normal((size + args.writes, args.dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        before, started, cpu = rss_mib(), time.perf_counter(), time.process_time()
        state = LeaveOneOut.build(np.arange(size), [str(max(i, args.largest - 1)) for i in range(size)], vectors[:size])
        built, built_cpu, memory = time.perf_counter() - started, time.process_time() - cpu, rss_mib() - before
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before  # kB on Linux; the peak since start, over the build
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(size, size + args.writes):
            state.add(np.array([i]), [str(i)], vectors[i : i + 1])
        enroll, enroll_cpu = (time.perf_counter() - started) / args.writes, (time.process_time() - cpu) / args.writes
        started = time.perf_counter()
        state.shape()
        tail = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(size, size + args.writes):
            state.remove(np.array([i]))
        delete = (time.perf_counter() - started) / args.writes
        enrolled = f"{1000 * enroll:.1f} ({1000 * enroll_cpu:.1f})"
        build = f"{built:.1f} ({built_cpu:.1f})"
        print(f"{size:>9,} {build:>14} {enrolled:>16} {1000 * delete:>10.1f} {1000 * tail:>8.1f} {memory:>8.0f} {peak:>8.0f}")


if __name__ == "__main__":
    main()
