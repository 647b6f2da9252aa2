"""`facegate bench pipeline`: per-stage throughput, printed with the machine and provider."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from service.pipeline import FacePipeline


def _rate(fn, seconds: float, items_per_call: int = 1) -> tuple[float, float]:
    """(items per second, ms per call), timing whole calls until the budget is spent."""
    fn()  # warm-up: first runs allocate
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls < 3:
        fn()
        calls += 1
    return calls * items_per_call / elapsed, 1000 * elapsed / calls


def gemm_peak_gflops(seconds: float, n: int = 1024) -> float:
    """fp32 matrix-multiply throughput with numpy's BLAS on all cores: the ceiling a convolutional
    embedder can approach on a CPU, so its rate is reported as a fraction of it."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    rate, _ = _rate(lambda: a @ a, seconds)
    return rate * 2 * n**3 / 1e9


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_pipeline_bench(pipeline: FacePipeline, images: list[Path], seconds: float, console: Console) -> None:
    if not images:
        raise SystemExit("pass some photos with faces, e.g. a few LFW images")
    blobs = [p.read_bytes() for p in images]
    decoded = [pipeline.decode(b) for b in blobs]
    faces = [pipeline.detect(img) for img in decoded]
    with_face = [(img, f[:1]) for img, f in zip(decoded, faces) if f]
    if not with_face:
        raise SystemExit("no face found in the given images")
    providers = pipeline.detector_model.session.get_providers()
    console.print(f"machine: {_cpu_name()}, {os.cpu_count()} cores; onnxruntime providers: {', '.join(providers)}")
    console.print(f"images: {len(images)} ({sum(len(b) for b in blobs) / len(blobs) / 1024:.0f} KiB mean), faces found in {len(with_face)}")

    table = Table("stage", "batch", "items/s", "ms/call")
    i = iter(range(10**9))

    def pick(seq):
        return seq[next(i) % len(seq)]

    for name, fn in [
        ("decode", lambda: pipeline.decode(pick(blobs))),
        ("detect", lambda: pipeline.detect(pick(decoded))),
        ("align", lambda: pipeline.align(*pick(with_face))),
    ]:
        rate, ms = _rate(fn, seconds)
        table.add_row(name, "1", f"{rate:.1f}", f"{ms:.2f}")
    if pipeline.embedder is not None:
        crops = np.concatenate([pipeline.align(img, f) for img, f in with_face])
        manifest = pipeline.embedder_model.manifest
        gflops = manifest.provenance.get("export", {}).get("gflops_per_face")
        for batch in (1, 8, 32):
            chunk = np.resize(crops, (batch, *crops.shape[1:]))
            rate, ms = _rate(lambda: pipeline.embedder.embed(chunk), seconds, batch)
            table.add_row(f"embed ({manifest.name})", str(batch), f"{rate:.1f}", f"{ms:.2f}")
        if gflops:
            line = f"embedder: {gflops:.3f} GFLOP per face (manifest) → {gflops * rate:.1f} GFLOP/s at batch 32"
            if pipeline.embedder_model.session.get_providers()[0] == "CPUExecutionProvider":
                peak = gemm_peak_gflops(seconds)
                line += (f", {100 * gflops * rate / peak:.0f}% of this CPU's fp32 GEMM peak ({peak:.0f} GFLOP/s, "
                         f"which bounds it at {peak / gflops:.0f} faces/s)")
            console.print(line)
    else:
        console.print("[yellow]no embedder loaded (FACEGATE_EMBEDDER): embed stage skipped[/yellow]")
    console.print(table)
