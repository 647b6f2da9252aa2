"""The whole process against the peer: `facegate embed PHOTOS…` (start-up, models loaded, every
photo decoded, detected, aligned and embedded) against a script calling face_recognition's
`face_encodings` on each photo (dlib's HOG detector and the same ResNet: `make test` installs it),
each a fresh process, the two taking turns; a warm-up round first (page cache), then the median of
`--runs` rounds: wall time, CPU time (user + system, all threads) and facegate's peak RSS.

    .venv/bin/python benchmarks/peer_process.py $(ls $FACEGATE_TEST_DATA/lfw/*/*_0001.jpg | head -100)
    FACEGATE_EMBEDDER=dlib-resnet-v1-int8 .venv/bin/python benchmarks/peer_process.py $(ls $FACEGATE_TEST_DATA/lfw/*/*_0001.jpg | head -100)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PEER = "import sys, face_recognition\nfor p in sys.argv[1:]:\n    face_recognition.face_encodings(face_recognition.load_image_file(p))"


def timed(command: list[str]) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MiB of one process run to its end."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        sys.exit(f"peer_process.py: {command[0]} … exited with {process.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=5, help="Rounds after the warm-up (medians are printed).")
    args = parser.parse_args()
    facegate = [str(Path(sys.executable).with_name("facegate")), "embed", *map(str, args.photos)]
    peer = [sys.executable, "-c", PEER, *map(str, args.photos)]
    rounds: dict[str, list[tuple[float, float, float]]] = {"facegate": [], "face_recognition": []}
    for round_ in range(args.runs + 1):
        order = ("facegate", "face_recognition") if round_ % 2 else ("face_recognition", "facegate")
        for name in order:
            result = timed(facegate if name == "facegate" else peer)
            if round_:  # the first round warms the page cache
                rounds[name].append(result)
    median = {name: [statistics.median(r[i] for r in runs) for i in range(3)] for name, runs in rounds.items()}
    (fg_wall, fg_cpu, fg_rss), (peer_wall, peer_cpu, _) = median["facegate"], median["face_recognition"]
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {len(args.photos)} photos, "
        f"FACEGATE_EMBEDDER={os.environ.get('FACEGATE_EMBEDDER', '(default)')}; medians of {args.runs} rounds after a warm-up"
    )
    print(f"facegate wall {fg_wall:.2f} s, CPU {fg_cpu:.2f} s, peak RSS {fg_rss:.0f} MiB")
    print(f"face_recognition wall {peer_wall:.2f} s, CPU {peer_cpu:.2f} s")
    print(f"wall ratio {fg_wall / peer_wall:.3f} ({peer_wall / fg_wall:.1f}×), CPU ratio {fg_cpu / peer_cpu:.3f}")


if __name__ == "__main__":
    main()
