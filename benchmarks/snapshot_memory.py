"""What a worker makes of its own when it maps the host's snapshot of the gallery's guard or roster
(service/gallery/snapshot.py, `SnapshotFiles.load`; issue 44): the Python memory it allocates,
traced by tracemalloc, and the time it takes (untraced, each file's sha256 check included), for
`--faces` faces of as many subjects named by UUIDs. The mapped pages themselves are the host's,
paid once (`startup_workers.py` measures them). The guard is built listing no face (`share=0`):
its lists do not change what a restore makes. `PYTHONPATH` picks the source tree measured, e.g. a
`git archive` of the commit before.

    PYTHONPATH=. .venv/bin/python benchmarks/snapshot_memory.py --faces 100000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import numpy as np

from service.core.open_set import LeaveOneOut, follow
from service.gallery.snapshot import SnapshotFiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faces", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ids = rng.choice(4 * args.faces, args.faces, replace=False)
    subjects = [str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**63, args.faces)]
    vectors = rng.standard_normal((args.faces, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    print(f"{args.faces} faces of as many subjects (UUIDs), {args.dim}-d; load {os.getloadavg()[0]:.1f}")
    print(f"{'state':>6} {'traced MiB':>10} {'peak MiB':>9} {'load ms':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for guard in (True, False):
            files = SnapshotFiles(Path(folder), f"state-{guard}")
            made = LeaveOneOut.build(ids, subjects, vectors, share=0.0) if guard else follow(ids, subjects, vectors, False)
            files.save(made, {"applied": 1}, (ids, subjects, vectors))
            del made
            started = time.perf_counter()
            mapped = files.load(guard, args.dim, lambda meta: True)  # timed untraced: tracing slows each allocation
            seconds = time.perf_counter() - started
            del mapped
            tracemalloc.start()
            mapped = files.load(guard, args.dim, lambda meta: True)
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert mapped is not None
            print(f"{'guard' if guard else 'roster':>6} {held / 2**20:>10.2f} {peak / 2**20:>9.2f} {seconds * 1000:>8.0f}", flush=True)
            del mapped


if __name__ == "__main__":
    main()
