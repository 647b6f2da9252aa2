"""A worker past the change log (issue 44): what the gallery side of `/identify` (a search and the
open-set shape, what a request asks the store) costs in one process while another process has
written more changes than the SQLite log keeps and goes on writing.

1. A SQLite gallery of `--faces` synthetic 128-d faces, one per subject, the open-set guard on.
2. The reader (this process) opens it; its follower is held still while a writer process commits
   `--writes` enroll/delete changes (past CHANGES_KEPT), as a worker that fell behind would be.
3. The follower is let go (it must rebuild the index and the guard) and the writer keeps writing
   while the reader searches back to back: latency p50 / p99 / max of every request, how many
   were answered during the rebuild, and how long the rebuild took until swapped in.

Before issue 44 the first search after step 2 rebuilt both inside the request, under the store's
lock (at 100k faces, `--workers 3`: 311–314 s for each of the next 6 /identify).

    .venv/bin/python benchmarks/follower_lag.py --faces 20000
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from benchmarks.loadtest import fill_gallery  # noqa: E402
from service.core.models.manifest import EmbedderKey  # noqa: E402
from service.gallery import sqlite  # noqa: E402
from service.gallery.interface import NewFace  # noqa: E402
from service.gallery.sqlite import SqliteGallery  # noqa: E402

KEY = EmbedderKey("bench", "b" * 64, 128)


def unit(rng: np.random.Generator, rows: int) -> np.ndarray:
    x = rng.standard_normal((rows, KEY.dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write(folder: str, writes: int, behind, stop) -> None:
    """Enroll and delete one face at a time, `writes` changes, then set `behind` and go on until `stop`."""
    store = SqliteGallery.open(Path(folder), KEY, searchable=False)
    rng = np.random.default_rng(1)
    store.create_subject("writer", {}, "writer")
    done = 0
    while not stop.is_set():
        (face,) = store.add_faces("writer", [NewFace(unit(rng, 1)[0])])
        store.delete_face(face.id)
        done += 2
        if done >= writes and not behind.is_set():
            behind.set()
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faces", type=int, default=20_000)
    parser.add_argument(
        "--writes", type=int, default=11_200, help="Changes written while the reader's follower is held (the log keeps 10,000)."
    )
    parser.add_argument("--after", type=float, default=5.0, help="Seconds searched on after the rebuild was swapped in.")
    args = parser.parse_args()
    print("\n".join(machine_lines()))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fill_gallery(folder, KEY, args.faces)
        started = time.perf_counter()
        reader = SqliteGallery.open(folder, KEY)
        print(f"{args.faces:,} faces, guard on: the reader opened in {time.perf_counter() - started:.1f} s")
        assert reader.follower is not None
        reader.follower.poll = 1e9  # held still: a worker that fell behind
        context = multiprocessing.get_context("spawn")
        behind, stop = context.Event(), context.Event()
        writer = context.Process(target=write, args=(str(folder), args.writes, behind, stop))
        writer.start()
        started = time.perf_counter()
        behind.wait()
        print(f"the writer committed {args.writes:,} changes in {time.perf_counter() - started:.1f} s while the reader's follower was held")
        query = unit(np.random.default_rng(2), 1)[0]
        latencies, during = [], 0
        reader.follower.poll = sqlite.FOLLOW_SECONDS
        reader.follower.log.wake()
        released, swapped = time.perf_counter(), None
        while swapped is None or time.perf_counter() - swapped < args.after:
            t = time.perf_counter()
            reader.search(query, 1)
            reader.shape()
            latencies.append(time.perf_counter() - t)
            if swapped is None:
                if reader.follower.rebuilds:
                    swapped = time.perf_counter()
                else:
                    during += 1
        stop.set()
        writer.join()
        ms = 1000 * np.array(latencies)
        print(
            f"rebuild swapped in {swapped - released:.1f} s after the follower was let go; {len(ms):,} searches "
            f"({during:,} during the rebuild) while the writer went on: p50 {np.percentile(ms, 50):.1f} ms, "
            f"p99 {np.percentile(ms, 99):.1f} ms, max {ms.max():.1f} ms"
        )
        reader.close()


if __name__ == "__main__":
    main()
