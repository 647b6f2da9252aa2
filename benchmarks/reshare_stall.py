"""The re-share stall (issue 44): what a search and a write cost on a worker while its follower
shares its grown state as the host's snapshot and maps that anew (`Follower._reshare`: every REMAP
changes, or 1/8 of the faces, applied to a mapped snapshot; gallery/snapshot.py).

1. A SQLite gallery of `--faces` synthetic 128-d faces, one per subject, the open-set guard on,
   opened with an index folder: its guard and faces are the host's snapshot, mapped.
2. One thread searches back to back (a search and the open-set shape: what `/identify` asks the
   store), another enrolls a face every `--write-every` seconds, while the follower re-shares
   `--rounds` times (each forced once: `_due` answers yes), `--gap` seconds apart.
3. Latency p50 / p99 / max of the searches and the writes, outside the re-shares, during them
   (from the follower deciding to share until the state mapped anew is swapped in), and of those
   that started while the guard was being copied to be saved (`LeaveOneOut.copy`, the part that
   held the locks searches wait for), and how long each re-share and each copy took.

    .venv/bin/python benchmarks/reshare_stall.py --faces 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from benchmarks.loadtest import fill_gallery  # noqa: E402
from service.core.models.manifest import EmbedderKey  # noqa: E402
from service.core.open_set import LeaveOneOut  # noqa: E402
from service.gallery.follower import Derived  # noqa: E402
from service.gallery.index import IndexConfig  # noqa: E402
from service.gallery.interface import NewFace  # noqa: E402
from service.gallery.sqlite import SqliteGallery  # noqa: E402

KEY = EmbedderKey("bench", "b" * 64, 128)


def unit(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(KEY.dim).astype(np.float32)
    return x / np.linalg.norm(x)


def timed(calls: list[tuple[float, float]], stop: threading.Event, call, every: float = 0.0) -> None:
    """`call()` until `stop`, each as (start, seconds) into `calls`."""
    while not stop.is_set():
        started = time.perf_counter()
        call()
        calls.append((started, time.perf_counter() - started))
        if every:
            stop.wait(every)


def summary(what: str, calls: list[tuple[float, float]], windows: list[tuple[float, float]], copies: list[tuple[float, float]]) -> None:
    """Latency of the calls that started inside a re-share's window, of the others, and of those that started during a copy."""
    inside = [s for t, s in calls if any(a <= t <= b for a, b in windows)]
    outside = [s for t, s in calls if not any(a <= t <= b for a, b in windows)]
    copying = [s for t, s in calls if any(a <= t <= b for a, b in copies)]
    for label, seconds in (("outside", outside), ("during", inside), ("copying", copying)):
        if seconds:
            ms = 1000 * np.array(seconds)
            print(
                f"{what:>7} {label:>8} {len(ms):>7,} {np.percentile(ms, 50):>8.2f} {np.percentile(ms, 99):>8.2f} {ms.max():>8.1f}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faces", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--gap", type=float, default=1.0, help="Seconds between re-shares.")
    parser.add_argument("--write-every", type=float, default=0.05)
    args = parser.parse_args()
    print("\n".join(machine_lines()))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        fill_gallery(folder, KEY, args.faces)
        started = time.perf_counter()
        store = SqliteGallery.open(folder, KEY, index=IndexConfig("Flat", "", folder / "index"))
        follower = store.follower
        assert follower is not None and follower.state is not None and follower.state.mapped is not None
        print(f"{args.faces:,} faces, guard on: built and mapped in {time.perf_counter() - started:.1f} s")
        store.create_subject("writer", {}, "writer")
        rng = np.random.default_rng(1)
        query = unit(rng)
        copies: list[tuple[float, float]] = []
        copy = LeaveOneOut.copy

        def timed_copy(self: LeaveOneOut, *args, **kwargs) -> LeaveOneOut:
            began = time.perf_counter()
            try:
                return copy(self, *args, **kwargs)
            finally:
                copies.append((began, time.perf_counter()))

        LeaveOneOut.copy = timed_copy  # type: ignore[method-assign]
        stop = threading.Event()
        searches: list[tuple[float, float]] = []
        writes: list[tuple[float, float]] = []
        threads = [
            threading.Thread(target=timed, args=(searches, stop, lambda: (store.search(query, 1), store.shape()))),
            threading.Thread(target=timed, args=(writes, stop, lambda: store.add_faces("writer", [NewFace(unit(rng))]), args.write_every)),
        ]
        for thread in threads:
            thread.start()
        windows, took = [], []
        for _ in range(args.rounds):
            stop.wait(args.gap)
            rebuilds, decided = follower.rebuilds, threading.Event()

            def due(state: Derived, decided: threading.Event = decided) -> bool:
                if decided.is_set():
                    return False
                decided.set()
                return True

            follower._due = due  # type: ignore[method-assign]
            decided.wait()
            began = time.perf_counter()
            while follower.rebuilds == rebuilds:
                time.sleep(0.001)
            windows.append((began, time.perf_counter()))
            took.append(windows[-1][1] - began)
            del follower._due
        stop.wait(args.gap)
        stop.set()
        for thread in threads:
            thread.join()
        print(f"{args.rounds} re-shares, each {', '.join(f'{s:.2f}' for s in took)} s from the decision to the swap")
        print(f"the copies saved took {', '.join(f'{b - a:.2f}' for a, b in copies)} s")
        print(f"{'':>7} {'':>8} {'calls':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
        summary("search", searches, windows, copies)
        summary("write", writes, windows, copies)
        store.close()


if __name__ == "__main__":
    main()
