"""Detection at the photo's size against the 640×640 path every image took before: faces found,
landmark shift (pixels in the photo) and detection time per image, on photos given as arguments.

    python benchmarks/detect_sizes.py $FACEGATE_TEST_DATA/lfw/*/*_0001.jpg --limit 300
    python benchmarks/detect_sizes.py $FACEGATE_TEST_DATA/tests/compreface/*.jpg
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from service.core.models.detector import FaceDetector
from service.core.pipeline import FacePipeline
from service.core.settings import Settings


def _detect(detector, image, size):
    canvas, scale = detector.letterbox(image, size)
    return detector.faces(detector.infer(canvas[None])[0], scale, image.shape[:2])


def _shift(bucketed, reference) -> float | None:
    """Mean landmark distance of the largest face, when both paths found one."""
    if not bucketed or not reference:
        return None
    return float(np.linalg.norm(bucketed[0].landmarks - reference[0].landmarks, axis=1).mean())


def _ms_per_image(fn, images, seconds: float) -> float:
    fn(images[0])
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(images[calls % len(images)])
        calls += 1
    return 1000 * (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", nargs="+", type=Path)
    parser.add_argument("--limit", type=int, default=0, help="use the first N photos (0: all)")
    parser.add_argument("--seconds", type=float, default=10.0, help="timing budget per path, run alternately in two halves")
    args = parser.parse_args()
    pipeline = FacePipeline.from_settings(Settings(), require_embedder=False)
    detector = pipeline.detector
    photos = args.photos[: args.limit or None]
    images = [pipeline.decode(p.read_bytes()) for p in photos]
    largest = detector.sizes[-1]
    reference = [_detect(detector, image, largest) for image in images]
    bucketed = [detector.detect(image) for image in images]
    for line in machine_lines():
        print(line)
    print(
        f"photos: {len(images)}; sizes {detector.sizes}; run at:",
        {s: sum(detector.size_for(i.shape[:2]) == s for i in images) for s in detector.sizes},
    )
    print(f"faces found: {largest} path {sum(map(len, reference))}, bucketed {sum(map(len, bucketed))}")
    print(f"photos with a face: {largest} path {sum(map(bool, reference))}, bucketed {sum(map(bool, bucketed))}")
    shifts = np.array([s for b, r in zip(bucketed, reference, strict=True) if (s := _shift(b, r)) is not None])
    if len(shifts):
        print(
            f"landmark shift of the largest face (px): mean {shifts.mean():.2f}, median {np.median(shifts):.2f}, "
            f"p95 {np.percentile(shifts, 95):.2f}, max {shifts.max():.2f}"
        )
    # YuNet's own jitter between two large sizes, the yardstick for the shift above: no size but the
    # reference itself can agree with it more closely than the next stride-aligned size does.
    nearby = largest + 64
    wider = FaceDetector(
        detector.manifest, detector.session, detector.score_threshold, detector.nms_threshold, detector.min_face_size, sizes=(nearby,)
    )
    jitter = np.array(
        [s for image, r in zip(images, reference, strict=True) if (s := _shift(_detect(wider, image, nearby), r)) is not None]
    )
    if len(jitter):
        print(
            f"YuNet's own jitter, {nearby} path against {largest} (px): median {np.median(jitter):.2f}, p95 {np.percentile(jitter, 95):.2f}"
        )
    half = args.seconds / 4
    times = {"640": [], "bucketed": []}
    for _ in range(2):  # alternated, so drift on a shared machine hits both
        times["640"].append(_ms_per_image(lambda i: _detect(detector, i, largest), images, half))
        times["bucketed"].append(_ms_per_image(detector.detect, images, half))
    print(
        f"detect ms/image: {largest} path {np.mean(times['640']):.2f}, bucketed {np.mean(times['bucketed']):.2f} "
        f"(ratio {np.mean(times['bucketed']) / np.mean(times['640']):.2f})"
    )


if __name__ == "__main__":
    main()
