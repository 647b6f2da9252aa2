"""What Double Take and Viseron decide on facegate's answers, with their own code (the harness of
tests/service/api/compat/client_decisions.py: Double Take's detector modules under Node, Viseron's
CompreFace module in the clients' Python), on the photo set described there: one row per client,
as a Markdown table for docs/compat.md, then each face a client got wrong with its score.

    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models PYTHONPATH=. \\
        .venv/bin/python benchmarks/client_decisions.py [--url http://127.0.0.1:8000]

Without --url it starts a server of this checkout without keys on a fresh gallery; give --url to
measure another checkout's running server (it must run without keys: Double Take's aiserver module
sends none). Node with `make clients-js`'s packages and the clients' Python (`make clients-venv`,
or FACEGATE_CLIENTS_PYTHON) are needed. The clients train their names into the gallery it serves."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.compat_latency import machine
from benchmarks.loadtest import spawned
from tests.conftest import REPO
from tests.service.api.compat import client_decisions as clients


def scores(results: dict, photos: list[clients.Photo], key: str) -> tuple[float, float]:
    """The lowest score of a face on a photo of trained people only, and the highest of a face on a photo of strangers only."""
    known = [f[key] for p in photos if p.people and not p.strangers for f in results.get(str(p.path), [])]
    strangers = [f[key] for p in photos if not p.people for f in results.get(str(p.path), [])]
    return min(known, default=float("nan")), max(strangers, default=float("nan"))


def run(url: str, data: Path, python: str) -> None:
    node = shutil.which("node")
    assert node, "node is not on PATH"
    photos = clients.probes(data)
    print(f"{machine()}; {url}")
    print(
        f"photos: {len(clients.train_photos(data))} trained ({len(clients.TRAIN)} people), {len(photos)} probes: "
        f"{sum(len(p.people) for p in photos)} known faces, {sum(p.strangers for p in photos)} strangers' faces"
    )
    rows, wrong = [], []
    started = time.monotonic()
    for detector in sorted(clients.DOUBLE_TAKE):
        trained, results = clients.double_take(node, detector, url, "any-key", data)
        matched = clients.tally(photos, clients.double_take_named(results))
        shown = clients.tally(photos, clients.double_take_named(results, matched=False))
        low, high = scores(results, photos, "confidence")
        refused = sum(t["status"] != 200 for t in trained)
        rows.append(
            f"| Double Take `{detector}` | {matched.right}/{matched.faces} | {matched.found}/{matched.knowns} | "
            f"{matched.named_strangers} / {shown.named_strangers} | {low / 100:.3f} / {high / 100:.3f} | {refused} |"
        )
        wrong += [f"{detector}: missed {m}" for m in matched.missed] + [f"{detector}: named {w}" for w in shown.wrong]
    unsuitable, results = clients.viseron(python, "127.0.0.1", urlsplit(url).port or 80, "any-key", data)
    tally = clients.tally(photos, clients.viseron_named(results))
    low, high = scores(results, photos, "similarity")
    rows.append(
        f"| Viseron `compreface` | {tally.right}/{tally.faces} | {tally.found}/{tally.knowns} | {tally.named_strangers} | "
        f"{low:.3f} / {high:.3f} | {len(unsuitable)} |"
    )
    wrong += [f"viseron: missed {m}" for m in tally.missed] + [f"viseron: named {w}" for w in tally.wrong]
    print(f"{time.monotonic() - started:.0f} s\n")
    print(
        "| client | faces decided right | known faces found | strangers matched / shown a name "
        "| lowest known, highest stranger similarity | training photos refused |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    for line in wrong:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running facegate without keys (default: start one of this checkout)")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("FACEGATE_TEST_DATA", "../shared/data")))
    parser.add_argument("--python", default=os.environ.get("FACEGATE_CLIENTS_PYTHON") or str(REPO / ".venv-clients" / "bin" / "python"))
    args = parser.parse_args()
    with contextlib.nullcontext(args.url) if args.url else spawned({"FACEGATE_API_KEYS": ""}) as url:
        run(url, args.data, args.python)


if __name__ == "__main__":
    main()
