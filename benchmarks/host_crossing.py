"""The worker ↔ model host crossing alone: CPU per image of its messages, threads and wake-ups,
with the models taken out. A model host whose detector and embedder answer at once (one batcher
thread, as the real micro-batcher hands out a batch's results) serves a worker's `HostedModels` in
another process; client threads send each image's two runs (a 320×320 canvas, a 150×150 crop)
through shared memory as the engine does. Prints both processes' CPU (user + system) per image.

    python benchmarks/host_crossing.py --images 4000 --concurrency 8

Run it against an older checkout on its PYTHONPATH to compare (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import queue
import resource
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.bench import machine_lines
from service.core.settings import Settings
from service.runtime.hosted_models import HostedModels
from service.runtime.model_host import SOCKET, ModelHost


class _AnsweringModels:
    """Stands in for the host's LocalModels: each run's output (detector candidates, embeddings)
    set by one batcher thread, every waiting run at once."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._batches, daemon=True).start()

    def _batches(self) -> None:
        while True:
            jobs = [self.jobs.get()]
            while True:
                try:
                    jobs.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            for future, output in jobs:
                future.set_result(output.copy())

    def _run(self, output: np.ndarray) -> Future:
        future: Future = Future()
        self.jobs.put((future, output))
        return future

    def describe(self) -> dict:
        return {}

    def detect(self, rows: np.ndarray) -> Future:
        return self._run(np.ones((3, 15), np.float32))

    def embed(self, rows: np.ndarray) -> Future:
        return self._run(np.ones((len(rows), 128), np.float32))


def _host(folder: str, cpu: multiprocessing.connection.Connection) -> None:
    logging.getLogger("facegate.model_host").setLevel(logging.CRITICAL)  # its models' absence is the point
    host = ModelHost(Settings(detector="none", embedder="none"), Path(folder))
    host.local = _AnsweringModels()  # type: ignore[assignment]
    host.warmed.set()
    threading.Thread(target=host.serve_forever, daemon=True).start()
    for _ in ("start", "end"):  # of the load
        cpu.recv()
        cpu.send(_cpu_seconds())


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="facegate-crossing-")
    here, there = multiprocessing.get_context("fork").Pipe()
    host = multiprocessing.get_context("fork").Process(target=_host, args=(folder, there), daemon=True)
    host.start()
    hosted = HostedModels(Settings(), Path(folder) / SOCKET, 64 * 1024 * 1024)
    canvas, crop = np.zeros((320, 320, 3), np.uint8), np.zeros((1, 150, 150, 3), np.uint8)

    def image(_: int) -> None:
        hosted.detect(canvas).result(30)
        hosted.embed(crop).result(30)

    for _ in range(200):  # warm-up
        image(0)
    here.send("start")
    host_before = here.recv()
    worker_before, start = _cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(image, range(args.images)))
    wall, worker = time.perf_counter() - start, _cpu_seconds() - worker_before
    here.send("end")
    host_cpu = here.recv() - host_before
    hosted.close()
    host.terminate()
    for line in machine_lines():
        print(line)
    print(f"{args.images} images (two runs each), concurrency {args.concurrency}, models answering at once")
    print(f"worker process: {1e6 * worker / args.images:8.1f} µs CPU an image")
    print(f"model host:     {1e6 * host_cpu / args.images:8.1f} µs CPU an image")
    print(f"both:           {1e6 * (worker + host_cpu) / args.images:8.1f} µs CPU an image; {args.images / wall:.0f} images/s")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
