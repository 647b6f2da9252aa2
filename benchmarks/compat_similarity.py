"""What a CompreFace `similarity` cut means, measured the way a client meets it: LFW people are
enrolled through POST /api/v1/recognition/faces (one photo each, a seeded sample of those with two
or more), then LFW people with one photo (never enrolled) probe as strangers and the enrolled
people's second photos as genuine probes, through POST /api/v1/recognition/recognize. For each
cut (Double Take's 40 / 60 %, Viseron's 0.5, the 0.85–0.95 clients are often set at) and each
gallery size it prints, as a Markdown table for docs/compat.md:

- the stranger rate the calibration promises per search, FPIR^(2·cut) (compat/similarity.py);
- the strangers whose best subject scored at or above the cut (k of M), at each gallery size;
- the genuine probes whose best subject is themselves at or above the cut.

The gallery grows from one size to the next (one server), so each size is measured on the same
strangers. Rerun it whenever the score behind the similarity changes (docs/compat.md).

    FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. .venv/bin/python benchmarks/compat_similarity.py \\
        --images ../shared/data/lfw [--sizes 10,100,1000] [--strangers N] [--url URL --key K]

Without --url it starts a server of this checkout (benchmarks.loadtest.spawned) on a fresh gallery.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.compat_latency import machine
from benchmarks.loadtest import spawned
from service.core.settings import Settings

CUTS = [
    (0.4, "Double Take: `unknown` below (unknown.confidence 40)"),
    (0.5, "Viseron's default; facegate's own decision"),
    (0.6, "Double Take's match (match.confidence 60)"),
    (0.7, ""),
    (0.8, ""),
    (0.85, "often set on CompreFace"),
    (0.9, "often set on CompreFace"),
    (0.95, "often set on CompreFace"),
]


def photos(person: Path) -> list[Path]:
    return sorted(p for p in person.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def run(url: str, key: str | None, images: Path, sizes: list[int], strangers: int | None, workers: int, fpir: float, seed: int) -> None:
    people = sorted(p for p in images.iterdir() if p.is_dir())
    rng = random.Random(seed)
    known = [p for p in people if len(photos(p)) >= 2]
    others = [p for p in people if len(photos(p)) == 1]
    rng.shuffle(known)
    rng.shuffle(others)
    known, others = known[: max(sizes)], others[:strangers]
    headers = {"X-API-Key": key} if key else {}
    started = time.monotonic()
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client, ThreadPoolExecutor(workers) as pool:

        def enroll(person: Path) -> bool:
            """False where the enrollment gate finds no usable face: that person is left out."""
            answer = client.post(
                "/api/v1/recognition/faces", params={"subject": person.name}, files={"file": photos(person)[0].read_bytes()}
            )
            if 400 <= answer.status_code < 500:
                return False
            answer.raise_for_status()
            return True

        def best(photo: Path) -> tuple[str | None, float]:
            """The best subject and its similarity, as a client reads them (no face: none, 0)."""
            answer = client.post("/api/v1/recognition/recognize", params={"prediction_count": 1}, files={"file": photo.read_bytes()})
            if answer.status_code == 400 and answer.json().get("code") == 28:
                return None, 0.0
            answer.raise_for_status()
            subjects = answer.json()["result"][0]["subjects"]
            return (subjects[0]["subject"], subjects[0]["similarity"]) if subjects else (None, 0.0)

        enrolled: list[Path] = []
        measured = {}
        for start, size in zip([0, *sizes], sizes, strict=False):
            batch = known[start:size]
            enrolled += [p for p, ok in zip(batch, pool.map(enroll, batch), strict=True) if ok]
            stranger = [s for _, s in pool.map(best, [photos(p)[0] for p in others])]
            genuine = [
                s if name == p.name else 0.0
                for p, (name, s) in zip(enrolled, pool.map(best, [photos(p)[1] for p in enrolled]), strict=True)
            ]
            measured[size] = (len(enrolled), stranger, genuine)

    print(f"{machine()}; {url}; {time.monotonic() - started:.0f} s")
    print(f"LFW ({images.name}), seed {seed}: {len(others)} strangers (one-photo people, never enrolled); FACEGATE_DEFAULT_FPIR {fpir:g}")
    print()
    head = " | ".join(f"strangers ≥ cut, {n} people" for n, _, _ in measured.values())
    found = " | ".join(f"genuine found, {n} people" for n, _, _ in measured.values())
    print(f"| similarity ≥ | promised stranger rate per search | {head} | {found} | used by |")
    print("| --- | --- |" + " --- |" * (2 * len(measured)) + " --- |")
    for cut, who in CUTS:
        row = [f"{cut:g}", f"{fpir ** (2 * cut):.1e}"]
        row += [
            f"{sum(s >= cut for s in stranger) / len(stranger):.4f} ({sum(s >= cut for s in stranger)})"
            for _, stranger, _ in measured.values()
        ]
        row += [f"{sum(s >= cut for s in genuine) / len(genuine):.3f}" for _, _, genuine in measured.values()]
        print("| " + " | ".join([*row, who]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="LFW's layout: NAME/*.jpg")
    parser.add_argument("--url", help="a running facegate with an empty gallery (default: start one on a fresh gallery)")
    parser.add_argument("--key", help="an API key, when the server needs one")
    parser.add_argument("--sizes", default="10,100,1000", help="gallery sizes (people, one photo each), ascending")
    parser.add_argument("--strangers", type=int, default=None, help="how many one-photo people probe (default: all)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent requests")
    parser.add_argument("--fpir", type=float, default=None, help="the server's FACEGATE_DEFAULT_FPIR (default: this checkout's)")
    parser.add_argument("--seed", type=int, default=36)
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.sizes.split(","))
    fpir = args.fpir if args.fpir is not None else Settings().default_fpir
    with spawned({}) if args.url is None else contextlib.nullcontext(args.url) as url:
        run(url, args.key, args.images, sizes, args.strangers, args.workers, fpir, args.seed)


if __name__ == "__main__":
    main()
