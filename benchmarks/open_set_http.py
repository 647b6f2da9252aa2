"""The LFW open-set protocol through a running facegate, over HTTP, with default settings: each
person with two or more photos is enrolled (POST /subjects, POST /subjects/{id}/faces) by the first
and probes (POST /identify) with the second; the first --strangers people with one photo probe as
strangers. Prints the realized FPIR (strangers matched) and DIR (known people matched to
themselves) at the default decision and at each --fpir, and for a CompreFace client that takes the
best subject at similarity ≥ 0.5 (Viseron's default), with the machine. `facegate eval-open-set`
computes the same offline; this checks that the service answers it (so the quality gate's
refusals are enrolled with allow_low_quality, as offline).

    python benchmarks/open_set_http.py --images ../shared/data/lfw [--url http://127.0.0.1:8000] [--key K]

Without --url it starts a server of this checkout (benchmarks.loadtest.spawned) on a fresh gallery.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.loadtest import spawned
from training.identification import protocol


def run(url: str, key: str | None, images: Path, strangers: int, fpirs: list[float], workers: int) -> None:
    p = protocol(images, 1, strangers)
    headers = {"X-API-Key": key} if key else {}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:

        def enroll(path) -> bool:
            """False when the service finds no face to enroll (422): that person is left out."""
            subject = path.parent.name
            client.post("/subjects", json={"id": subject, "name": subject.replace("_", " ")}).raise_for_status()
            # the offline protocol enrolls every first photo: the quality gate's refusals are enrolled too
            answer = client.post(f"/subjects/{subject}/faces", files={"image": path.read_bytes()}, data={"allow_low_quality": "true"})
            if answer.status_code == 422:
                return False
            answer.raise_for_status()
            return True

        def identify(path, fpir):
            """The answer, or None when the service finds no face (422): no match."""
            data = {"top_k": "1"} | ({"fpir": str(fpir)} if fpir is not None else {})
            answer = client.post("/identify", files={"image": path.read_bytes()}, data=data)
            if answer.status_code == 422:
                return None
            answer.raise_for_status()
            return answer.json()

        def compreface(path) -> str | None:
            """The subject a CompreFace client at Viseron's default cut (similarity ≥ 0.5) takes the best match for."""
            answer = client.post("/api/v1/recognition/recognize", files={"file": path.read_bytes()}, params={"prediction_count": 1})
            if answer.status_code == 400 and answer.json().get("code") == 28:  # no face
                return None
            answer.raise_for_status()
            subjects = answer.json()["result"][0]["subjects"]
            return subjects[0]["subject"] if subjects and subjects[0]["similarity"] >= 0.5 else None

        with ThreadPoolExecutor(workers) as pool:
            enrolled = list(pool.map(enroll, p.gallery))
            print(
                f"{platform.node()} ({platform.processor() or platform.machine()}), {url}: {sum(enrolled)} enrolled "
                f"({len(enrolled) - sum(enrolled)} photos with no face found), {len(p.known)} known probes, {len(p.strangers)} strangers"
            )
            print("decision        score   threshold  far           realized FPIR  DIR")
            for fpir in [None, *fpirs]:
                known = list(pool.map(lambda path: identify(path, fpir), p.known))
                others = list(pool.map(lambda path: identify(path, fpir), p.strangers))
                found = sum(
                    r is not None and r["match"] is not None and r["match"]["subject_id"] == path.parent.name
                    for r, path in zip(known, p.known, strict=True)
                )
                matched = sum(r is not None and r["match"] is not None for r in others)
                shown = next(r for r in others if r is not None)
                label = f"fpir={shown['fpir']:g}" + (" (default)" if fpir is None else "")
                print(
                    f"{label:<15} {shown['score']:<7} {shown['threshold']:.6f}  {shown['far'] or '—':<12}  "
                    f"{matched / len(others):.4f} ({matched})   "
                    f"{found / len(known):.4f} ({found})"
                )
            known = list(pool.map(compreface, p.known))
            others = list(pool.map(compreface, p.strangers))
            found = sum(subject == path.parent.name for subject, path in zip(known, p.known, strict=True))
            matched = sum(subject is not None for subject in others)
            print(
                f"{'CompreFace recognize, similarity >= 0.5 (Viseron default)':<42}  {matched / len(others):.4f} ({matched})   "
                f"{found / len(known):.4f} ({found})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="LFW's layout: NAME/*.jpg")
    parser.add_argument("--url", help="a running facegate (default: start one on a fresh gallery)")
    parser.add_argument("--key", help="an API key, when the server needs one")
    parser.add_argument("--strangers", type=int, default=1000)
    parser.add_argument("--fpir", type=float, action="append", default=[], help="also decide at this FPIR (repeatable)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent requests")
    args = parser.parse_args()
    with spawned({}) if args.url is None else contextlib.nullcontext(args.url) as url:
        run(url, args.key, args.images, args.strangers, args.fpir, args.workers)


if __name__ == "__main__":
    main()
