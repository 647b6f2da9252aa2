"""`Decision.rate` per call: what the compatibility routes pay per candidate for its calibrated
similarity (service/api/compat/similarity.py), on a shipped manifest's open-set table, for galleries
decided on the best cosine (below the table's cosine_below subjects) and on the margin score.

    python -m benchmarks.decision_rate [--model models/dlib-resnet-v1.json] [--calls 2000]

Prints microseconds per call for each gallery shape, and the machine."""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

from service.core.decision import decide_search
from service.core.models.manifest import Manifest
from service.core.open_set import GalleryShape, Tail


def per_call(decision, scores: np.ndarray) -> float:
    started = time.perf_counter()
    for score in scores.tolist():
        decision.rate(score)
    return (time.perf_counter() - started) / len(scores) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path(__file__).parents[1] / "models" / "dlib-resnet-v1.json")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    manifest = Manifest.load(args.model)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}")
    rng = np.random.default_rng(0)
    guard = Tail(samples=3000, subjects=1000, m=100, u=0.965, beta=0.01)  # look-alikes: the guard decides at 1e-2
    for subjects, faces, tail in ((1, 1, None), (5, 15, None), (9, 9, None), (50, 100, None), (1000, 3000, None), (1000, 3000, guard)):
        decision = decide_search(manifest, None, None, None, GalleryShape(subjects, faces, tail), 0.01)
        scores = rng.uniform(decision.threshold - 0.1, decision.threshold + 0.1, args.calls)
        shape = f"{subjects:>5} subjects {faces:>5} faces{' + guard' if tail else '        '} ({decision.score:<6})"
        print(f"{shape}: {per_call(decision, scores):9.1f} µs a call")


if __name__ == "__main__":
    main()
