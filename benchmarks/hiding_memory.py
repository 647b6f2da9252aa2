"""What the recall check's held-out searches on a mapped HNSW graph cost a worker in memory of its
own (`FaissIndex.search_hiding`, issue 44): each query's own face is zeroed in the graph for its one
search, so the mapped file is hidden in a graph of the process's own. The process's anonymous
memory (RssAnon) is read before and inside the check (while that graph lives), for `--faces`
random unit vectors in an HNSW32 graph saved and mapped as a worker maps it, `--queries` of them
hidden. `PYTHONPATH` picks the source tree measured, e.g. a `git archive` of the commit before;
`--folder` keeps the saved index for the next run (the graph's build: minutes at 100k faces).

    PYTHONPATH=. .venv/bin/python benchmarks/hiding_memory.py --faces 100000 --folder /tmp/hiding
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from service.gallery import index as index_module
from service.gallery.index import FaissIndex, IndexConfig, read_meta, save_index

MODEL = "b" * 64


def anonymous_mib() -> float:
    """This process's resident anonymous memory (its heap and private pages), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faces", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--folder", type=Path, default=None, help="where the saved index is kept between runs")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.faces, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, args.faces + 1, dtype=np.int64)
    with tempfile.TemporaryDirectory() as scratch:
        config = IndexConfig("HNSW32", "", args.folder or Path(scratch))
        path = config.path(MODEL)
        assert path is not None
        if read_meta(path) is None:
            built = FaissIndex(args.dim, "HNSW32")
            started = time.monotonic()
            built.add(ids, vectors)
            save_index(config, built, MODEL, {"faces": [args.faces]})
            print(f"HNSW32 of {args.faces} faces built and saved in {time.monotonic() - started:.0f} s")
            del built
        meta = read_meta(path)
        assert meta is not None
        size = (path.parent / meta["file"]).stat().st_size / 2**20
        index = FaissIndex.load(path, meta, "")
        index.tune()
        pick = rng.choice(args.faces, args.queries, replace=False)
        queries, hidden = vectors[pick], ids[pick]
        index.search(queries, 11)  # the mapped pages a search touches: in the page cache, not the check's
        inside: list[float] = []
        hiding = index_module.hiding

        def measured(*a: Any, **kw: Any) -> Any:
            found = hiding(*a, **kw)
            inside.append(anonymous_mib())  # the hidden graph still lives here
            return found

        index_module.hiding = measured
        before = anonymous_mib()
        started = time.monotonic()
        index.search_hiding(queries, 11, hidden)
        took = time.monotonic() - started
        print(
            f"{args.faces} faces, {args.dim}-d, HNSW32 file {size:.1f} MiB, {args.queries} faces hidden: "
            f"anonymous memory {before:.1f} MiB before, {inside[0]:.1f} inside the check (+{inside[0] - before:.1f}), "
            f"{took:.2f} s; load {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
