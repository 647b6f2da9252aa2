"""What each import costs an HTTP worker of `facegate serve --workers N` (issue 44: a worker's
memory), in the order a worker pays it: in a fresh interpreter, the process's memory
(/proc/self/smaps_rollup) before and after importing each module (with what the ones before it
already brought), and the import's time. Rss counts the shared libraries' pages too (shared with
every process that maps them: the tree's PSS splits them); Anonymous is the heap, a process's own
unless it was forked after the import (service/runtime/preload.py).

    PYTHONPATH=. .venv/bin/python benchmarks/worker_imports.py
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A worker's heavy imports first, each alone, then what the service adds over them.
MODULES = [
    "numpy",
    "PIL.Image",
    "cv2",
    "faiss",
    "onnxruntime",
    "pydantic",
    "service.core.settings",
    "fastapi",
    "uvicorn",
    "service.core.pipeline",
    "service.gallery.collections",
    "service.runtime.hosted_models",
    "service.api.app",
]


def rollup() -> dict[str, int]:
    """smaps_rollup's Rss and Anonymous, in KiB."""
    fields = (line.split() for line in Path("/proc/self/smaps_rollup").read_text().splitlines())
    return {f[0][:-1]: int(f[1]) for f in fields if f[0] in ("Rss:", "Anonymous:")}


def measure(modules: list[str]) -> None:
    """In this process: each module's import, one after another."""
    before = rollup()
    print(f"{'(interpreter)':<32} {'':>9} {'':>9} {before['Rss'] / 1024:>9.1f} {before['Anonymous'] / 1024:>9.1f}")
    for name in modules:
        started = time.perf_counter()
        importlib.import_module(name)
        seconds = time.perf_counter() - started
        now = rollup()
        rss, anon = (now[k] - before[k] for k in ("Rss", "Anonymous"))
        totals = f"{now['Rss'] / 1024:>9.1f} {now['Anonymous'] / 1024:>9.1f}"
        print(f"{name:<32} {rss / 1024:>9.1f} {anon / 1024:>9.1f} {totals} {seconds:>7.2f}")
        before = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", default=MODULES, help="modules to import, in order")
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the fresh interpreter's side
    args = parser.parse_args()
    if args.here:
        measure(args.modules)
        return
    print(f"{'import':<32} {'+Rss MiB':>9} {'+Anon MiB':>9} {'Rss MiB':>9} {'Anon MiB':>9} {'s':>7}", flush=True)
    subprocess.run([sys.executable, __file__, "--here", *args.modules], cwd=REPO, check=True)


if __name__ == "__main__":
    main()
