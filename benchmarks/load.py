"""HTTP load for /verify and /identify: req/s and latency p50/p95/p99 at several concurrencies.

Either against a running server (`--url`), or `--spawn`: start the server itself on a free
127.0.0.1 port once per batching mode (FACEGATE_BATCHING=true/false), enroll a small gallery for
/identify, run the matrix, stop it. Images are LFW photos (FACEGATE_TEST_DATA) or `--images`.
`facegate bench all` runs the same load (benchmarks/loadtest.py) as part of the whole table.

    FACEGATE_TEST_DATA=../shared/data FACEGATE_MODEL_CACHE=../shared/models \\
        .venv/bin/python benchmarks/load.py --spawn --embedder models/facegate-default.json
    .venv/bin/python benchmarks/load.py --url http://127.0.0.1:8000 --concurrency 8 --requests 400

Without `--embedder` and with no default model, `--spawn` builds the tests' tiny embedder: the
figures then measure decode + detection + the HTTP stack, not a real recognition network.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.loadtest import matrix, spawned  # noqa: E402


def load_images(folder: Path | None, count: int) -> list[bytes]:
    if folder is None:
        data = os.environ.get("FACEGATE_TEST_DATA")
        if not data:
            sys.exit("give --images DIR or set FACEGATE_TEST_DATA")
        folder = Path(data) / "lfw"
    paths = sorted(folder.rglob("*.jpg"))[:count]
    if not paths:
        sys.exit(f"no .jpg images under {folder}")
    return [p.read_bytes() for p in paths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="A running server.")
    target.add_argument("--spawn", action="store_true", help="Start a server per batching mode.")
    parser.add_argument("--routes", nargs="+", choices=["verify", "identify"], default=["verify", "identify"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=200, help="Requests per (route, concurrency).")
    parser.add_argument("--batching", nargs="+", choices=["on", "off"], default=["on", "off"], help="With --spawn: modes to run.")
    parser.add_argument("--embedder", help="With --spawn: FACEGATE_EMBEDDER (default: the environment's, else the tests' tiny embedder).")
    parser.add_argument("--images", type=Path, help="Folder of .jpg photos (default FACEGATE_TEST_DATA/lfw).")
    parser.add_argument("--enroll", type=int, default=20, help="Subjects to enroll before /identify (0: use the gallery as is).")
    parser.add_argument("--api-key", default=os.environ.get("FACEGATE_LOAD_API_KEY"))
    parser.add_argument("--processes", type=int, default=0, help="Load processes (0: a quarter of the cores, at most the concurrency).")
    args = parser.parse_args()
    images = load_images(args.images, 64)
    print(f"{'batching':>9} {'route':>9} {'conc':>5} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  statuses")

    def run_matrix(url: str, label: str) -> None:
        def report(r):
            print(
                f"{label:>9} {r.route.strip('/'):>9} {r.concurrency:>5} {r.rps:>8.1f} "
                f"{r.p50:>8.1f} {r.p95:>8.1f} {r.p99:>8.1f}  {r.status_text()}",
                flush=True,
            )

        matrix(url, images, args.routes, args.concurrency, args.requests, args.enroll, args.api_key, report, args.processes)

    if args.url:
        run_matrix(args.url, "server")
        return
    embedder = args.embedder or os.environ.get("FACEGATE_EMBEDDER")
    if not embedder and not (REPO / "models" / "facegate-default.json").is_file():
        from tests.onnx_models import write_test_embedder

        embedder = str(write_test_embedder(Path(tempfile.mkdtemp(prefix="facegate-embedder-"))))
        print(f"# no default embedder: using the tests' tiny embedder {embedder}", flush=True)
    for mode in args.batching:
        with spawned({"FACEGATE_EMBEDDER": embedder or "facegate-default", "FACEGATE_BATCHING": str(mode == "on").lower()}) as url:
            run_matrix(url, mode)


if __name__ == "__main__":
    main()
