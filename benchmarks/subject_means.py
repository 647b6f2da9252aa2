"""What re-scoring on the mean costs a search (issue 46): a gallery decided on cosine rows calibrated
for the mean (below the table's cosine_below subjects) reads each proposed subject's faces from the
store and averages them (service/gallery/templates.py) instead of answering from the index's best
faces alone. Paired, interleaved runs of the same probes on one SQLite gallery of N subjects with f
faces each (128-d, dlib's size): per probe the search on best faces for all N subjects (what
/identify asks for on the mean), then its candidates re-scored on their means, each timed alone (the
index's own search time swings with the machine's load: FAISS's threads).

    PYTHONPATH=. .venv/bin/python benchmarks/subject_means.py [--subjects 1,9] [--faces 1,10] [--searches 300]

Prints microseconds per search and per re-scoring, with the machine."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from service.core.decision import Decision, decide_search, on_means
from service.core.models.manifest import EmbedderKey, Manifest
from service.core.open_set import GalleryShape
from service.gallery import templates
from service.gallery.interface import NewFace
from service.gallery.sqlite import SqliteGallery

KEY = EmbedderKey("bench", "0" * 64, 128)
MANIFEST = Path(__file__).parents[1] / "models" / "dlib-resnet-v1.json"  # its cosine rows are the mean's


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, KEY.dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def timed(gallery: SqliteGallery, probes: np.ndarray, subjects: int, decision: Decision) -> tuple[float, float]:
    """µs per search on best faces, and per re-scoring of its candidates for the decision (their means,
    or their best faces where they say more)."""
    search = rescore = 0.0
    for probe in probes:
        started = time.perf_counter()
        found = gallery.search(probe, subjects)
        searched = time.perf_counter()
        on_means(probe, found, lambda subject: templates.subject_faces(gallery, subject), decision)
        search, rescore = search + searched - started, rescore + time.perf_counter() - searched
    return search / len(probes) * 1e6, rescore / len(probes) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subjects", default="1,9")
    parser.add_argument("--faces", default="1,10")
    parser.add_argument("--searches", type=int, default=300)
    args = parser.parse_args()
    print("\n".join(machine_lines()))
    print("| subjects × faces | search on best faces (µs) | its candidates re-scored on means (µs) |\n| --- | ---: | ---: |")
    rng, manifest = np.random.default_rng(0), Manifest.load(MANIFEST)
    for subjects in (int(n) for n in args.subjects.split(",")):
        for faces in (int(f) for f in args.faces.split(",")):
            with tempfile.TemporaryDirectory() as folder:
                gallery = SqliteGallery.open(Path(folder), KEY)
                try:
                    for s in range(subjects):
                        gallery.create_subject(f"s{s}", {}, f"s{s}")
                        gallery.add_faces(f"s{s}", [NewFace(v) for v in unit(rng, faces)])
                    decision = decide_search(manifest, None, None, None, GalleryShape(subjects, subjects * faces), 0.01)
                    timed(gallery, unit(rng, 20), subjects, decision)  # warm-up
                    best, mean = timed(gallery, unit(rng, args.searches), subjects, decision)
                finally:
                    gallery.close()
            print(f"| {subjects} × {faces} | {best:.0f} | {mean:.0f} |", flush=True)


if __name__ == "__main__":
    main()
