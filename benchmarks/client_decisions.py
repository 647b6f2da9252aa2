"""What Double Take and Viseron decide on facegate's answers, with their own code (the harness of
tests/service/api/compat/client_decisions.py: Double Take's detector modules under Node, Viseron's
CompreFace module in the clients' Python).

On the photo set described there (the default): one row per client, as a Markdown table for
docs/compat.md, then each face a client got wrong. With --lfw DRAWS: small galleries of LFW people
as a home has them (--sizes subjects of --photos photos each, drawn DRAWS times per size, the
gallery emptied between draws), each subject's next photo as a genuine probe and --strangers
one-photo LFW people, never trained, per draw; per client and size, the genuine faces matched by
their name and the strangers matched or shown a name.

    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. \\
        .venv/bin/python benchmarks/client_decisions.py [--url http://127.0.0.1:8000] [--lfw 10 --sizes 1,2,5]

Without --url it starts a server of this checkout without keys on a fresh gallery; give --url to
measure another checkout's running server (it must run without keys: Double Take's aiserver module
sends none; its gallery is emptied). Node with `make clients-js`'s packages and the clients' Python
(`make clients-venv`, or FACEGATE_CLIENTS_PYTHON) are needed."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from benchmarks.compat_latency import machine
from benchmarks.loadtest import spawned
from tests.conftest import REPO
from tests.service.api.compat import client_decisions as clients

CLIENTS = [f"Double Take `{d}`" for d in sorted(clients.DOUBLE_TAKE)] + ["Viseron `compreface`"]


def misses(photos: list[clients.Photo], results: dict) -> Counter:
    """Why Double Take matched a trained person on none of their faces: named at 60 % but the box under
    its min_area (10,000 px²), named under 60 %, or not named (under 40 %, or another name)."""
    why: Counter = Counter()
    for photo in photos:
        faces = results.get(str(photo.path))
        for person in photo.people if isinstance(faces, list) else ():
            theirs = [f for f in faces if f["name"] == person]
            if not any(f["match"] for f in theirs):
                why["box" if any(f["confidence"] >= 60 for f in theirs) else "score" if theirs else "unnamed"] += 1
    return why


def decide(url: str, python: str, train: list[tuple[str, Path]], photos: list[clients.Photo]) -> dict[str, tuple]:
    """Per client: (what it matched, what it showed a name for, the faces' scores per photo, training
    photos refused, photos whose request failed: Double Take gives up after its 15 s timeout, why it missed people)."""
    node = shutil.which("node")
    assert node, "node is not on PATH"
    decided = {}
    for detector, client in zip(sorted(clients.DOUBLE_TAKE), CLIENTS, strict=False):
        trained, results = clients.double_take(node, detector, url, "any-key", train, photos)
        scores = {p: [f["confidence"] / 100 for f in faces] for p, faces in results.items() if isinstance(faces, list)}
        refused = sum(t["status"] != 200 for t in trained)
        failed = len(results) - len(scores)
        named = clients.double_take_named(results)
        decided[client] = (named, clients.double_take_named(results, matched=False), scores, refused, failed, misses(photos, results))
    unsuitable, results = clients.viseron(python, "127.0.0.1", urlsplit(url).port or 80, "any-key", train, photos)
    scores = {p: [f["similarity"] for f in faces] for p, faces in results.items()}
    named = clients.viseron_named(results)
    decided[CLIENTS[-1]] = (named, named, scores, len(unsuitable), 0, Counter())  # its SDK waits without a timeout
    return decided


def test_set(url: str, data: Path, python: str) -> None:
    httpx.delete(f"{url}/api/v1/recognition/subjects", timeout=60).raise_for_status()  # the set's 5 people alone
    photos = clients.probes(data)
    print(
        f"photos: {len(clients.train_photos(data))} trained ({len(clients.TRAIN)} people), {len(photos)} probes: "
        f"{sum(len(p.people) for p in photos)} known faces, {sum(p.strangers for p in photos)} strangers' faces\n"
    )
    print(
        "| client | faces decided right | known faces found | strangers matched / shown a name "
        "| lowest known, highest stranger similarity | training photos refused | requests failed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    wrong = []
    for client, (matched, shown, scores, refused, failed, _) in decide(url, python, clients.train_photos(data), photos).items():
        right, named = clients.tally(photos, matched), clients.tally(photos, shown)
        low = min(s for p in photos if p.people and not p.strangers for s in scores.get(str(p.path), []))
        high = max(s for p in photos if not p.people for s in scores.get(str(p.path), []))
        print(
            f"| {client} | {right.right}/{right.faces} | {right.found}/{right.knowns} | {right.named_strangers} / "
            f"{named.named_strangers} | {low:.3f} / {high:.3f} | {refused} | {failed} |"
        )
        wrong += [f"{client}: missed {m}" for m in right.missed] + [f"{client}: named {w}" for w in named.wrong]
    print("\n".join(wrong))


def lfw(url: str, lfw_dir: Path, python: str, draws: int, sizes: list[int], per_subject: int, strangers: int, seed: int) -> None:
    rng = random.Random(seed)
    people = sorted(p for p in lfw_dir.iterdir() if p.is_dir())
    known = [p for p in people if len(list(p.glob("*.jpg"))) > per_subject]
    others = [sorted(p.glob("*.jpg"))[0] for p in people if len(list(p.glob("*.jpg"))) == 1]
    print(f"LFW ({lfw_dir.name}), seed {seed}: {draws} draws per size, {per_subject} photos per subject, {strangers} strangers per draw\n")
    counts: dict[tuple[str, int], Counter] = {}
    for size in sizes:
        for _ in range(draws):
            httpx.delete(f"{url}/api/v1/recognition/subjects", timeout=60).raise_for_status()
            chosen = rng.sample(known, size)
            train, photos = [], []
            for person in chosen:
                files = sorted(person.glob("*.jpg"))
                rng.shuffle(files)
                train += [(person.name.lower(), f) for f in files[:per_subject]]
                photos.append(clients.Photo(files[per_subject], (person.name.lower(),), 0))
            photos += [clients.Photo(f, (), 1) for f in rng.sample(others, strangers)]
            for client, (matched, shown, _, refused, failed, why) in decide(url, python, train, photos).items():
                right, named = clients.tally(photos, matched), clients.tally(photos, shown)
                count = counts.setdefault((client, size), Counter())
                count.update(found=right.found, genuine=right.knowns, matched=right.named_strangers, shown=named.named_strangers)
                count.update(strangers=right.strangers, refused=refused, failed=failed, **why)
    print(
        "| client | subjects | genuine matched by name | strangers matched | strangers shown a name "
        "| Double Take's misses: box under 10,000 px² / under 60 % / not named | training photos refused | requests failed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (client, size), c in counts.items():
        why = f"{c['box']} / {c['score']} / {c['unnamed']}" if client in CLIENTS[:-1] else "–"
        print(
            f"| {client} | {size} | {c['found']}/{c['genuine']} ({c['found'] / c['genuine']:.1%}) | {c['matched']}/{c['strangers']} "
            f"| {c['shown']}/{c['strangers']} | {why} | {c['refused']} | {c['failed']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running facegate without keys (default: start one of this checkout)")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("FACEGATE_TEST_DATA", "../shared/data")))
    parser.add_argument("--python", default=os.environ.get("FACEGATE_CLIENTS_PYTHON") or str(REPO / ".venv-clients" / "bin" / "python"))
    parser.add_argument("--lfw", type=int, default=0, metavar="DRAWS", help="LFW galleries instead of the test set, DRAWS per size")
    parser.add_argument("--sizes", default="1,2,5", help="subjects per LFW gallery (comma-separated)")
    parser.add_argument("--photos", type=int, default=3, help="photos trained per LFW subject")
    parser.add_argument("--strangers", type=int, default=10, help="one-photo LFW people asked about per draw")
    parser.add_argument("--seed", type=int, default=46)
    args = parser.parse_args()
    with contextlib.nullcontext(args.url) if args.url else spawned({"FACEGATE_API_KEYS": ""}) as url:
        print(f"{machine()}; {url}")
        started = time.monotonic()
        if args.lfw:
            sizes = [int(s) for s in args.sizes.split(",")]
            lfw(url, args.data / "lfw", args.python, args.lfw, sizes, args.photos, args.strangers, args.seed)
        else:
            test_set(url, args.data, args.python)
        print(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
