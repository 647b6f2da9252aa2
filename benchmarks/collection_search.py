"""What a small collection's search costs beside large ones (issue 50): the SQLite gallery's search
(`SqliteGallery.search`, the exact flat index each collection keeps, with the store's re-scoring)
in a 100-face collection of a database that also holds `--others` collections of `--size` faces,
against the same 100 faces in a database of their own, and against one gallery holding all of it
(what every key searched before collections). Faces are random unit vectors (128-d, as
dlib-resnet-v1's), written straight into the tables; the timing is of searches only.

    nice -n 10 .venv/bin/python benchmarks/collection_search.py --others 10 --size 10000
    nice -n 10 .venv/bin/python benchmarks/collection_search.py --others 1 --size 1000000

Prints the machine, then per layout: faces in the database, faces in the searched index, and the
search's p50 / p99 over `--queries` queries (top_k 5)."""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from service.core.models.manifest import EmbedderKey
from service.gallery.sqlite import DATABASE, SqliteGallery

DIM = 128
KEY = EmbedderKey("bench", "b" * 64, DIM)


def fill(folder: Path, collections: dict[str, int], rng: np.random.Generator) -> None:
    """`collections` {name: faces} written into a migrated gallery, one subject per 10 faces."""
    SqliteGallery.open(folder, None, searchable=False).close()  # the schema
    with sqlite3.connect(folder / DATABASE) as db:
        for name, faces in collections.items():
            subjects = max(faces // 10, 1)
            db.executemany(
                "INSERT INTO subjects (collection, id, name, metadata, created, updated) VALUES (?, ?, ?, '{}', 0, 0)",
                ((name, f"s{i}", f"s{i}") for i in range(subjects)),
            )
            for start in range(0, faces, 50_000):
                n = min(50_000, faces - start)
                vectors = rng.standard_normal((n, DIM)).astype("<f4")
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                db.executemany(
                    "INSERT INTO faces (collection, subject_id, embedding, model_name, model_sha256, created) VALUES (?, ?, ?, ?, ?, 0)",
                    ((name, f"s{(start + i) % subjects}", v.tobytes(), KEY.name, KEY.sha256) for i, v in enumerate(vectors)),
                )


def timed(galleries: list[SqliteGallery], queries: np.ndarray) -> list[list[float]]:
    """Each query searched in every gallery in turn (paired: the shared machine's load hits all alike)."""
    for gallery in galleries:
        gallery.search(queries[0], 5)  # the first search's one-off costs
    took: list[list[float]] = [[] for _ in galleries]
    for query in queries:
        for gallery, times in zip(galleries, took, strict=True):
            start = time.perf_counter()
            gallery.search(query, 5)
            times.append(time.perf_counter() - start)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--others", type=int, default=10, help="Large collections beside the small one.")
    parser.add_argument("--size", type=int, default=10_000, help="Faces of each large collection.")
    parser.add_argument("--small", type=int, default=100, help="Faces of the small collection.")
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    for line in machine_lines():
        print(line)
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((args.queries, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    layouts = {
        f"small beside {args.others} x {args.size:,}": (
            {"small": args.small} | {f"big{i}": args.size for i in range(args.others)},
            "small",
        ),
        "small alone": ({"small": args.small}, "small"),
        "one gallery of all (before collections)": ({"default": args.small + args.others * args.size}, "default"),
    }
    with tempfile.TemporaryDirectory() as root:
        galleries = []
        for n, (collections, searched) in enumerate(layouts.values()):
            folder = Path(root) / str(n)
            fill(folder, collections, rng)
            # the open-set guard off: its leave-one-out build is another cost (docs/benchmarks.md, open_set_guard.py)
            galleries.append(SqliteGallery.open(folder, KEY, guard=False, collection=searched))
        try:
            took = timed(galleries, queries)
            for (label, (collections, _)), gallery, times in zip(layouts.items(), galleries, took, strict=True):
                ms = sorted(t * 1000 for t in times)
                print(
                    json.dumps(
                        {
                            "layout": label,
                            "database_faces": sum(collections.values()),
                            "searched_faces": gallery.counts()["searchable_faces"],
                            "p50_ms": round(statistics.median(ms), 3),
                            "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 3),
                        }
                    )
                )
        finally:
            for gallery in galleries:
                gallery.close()


if __name__ == "__main__":
    main()
