"""`facegate bench pipeline` (per-stage throughput) and `facegate bench all` (the whole table:
stages, embed batch scaling of the bare session against the pipeline's embed stage, HTTP load),
printed with the machine, provider and versions. Figures are printed, never asserted."""

from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.loadtest import Serving
from service.core.cpus import available_cores
from service.core.models.manifest import EmbedderKey, Manifest
from service.core.pipeline import FacePipeline
from service.core.settings import Settings


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


def _gpu_names() -> list[str]:
    """GPU names from nvidia-smi when it is installed (none on a CPU host)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "-"


def machine_lines() -> list[str]:
    """What a figure was measured on: CPU, cores (all, and those this process may use), GPU,
    onnxruntime's device and the versions of what the figures depend on."""
    import cv2
    import onnxruntime as ort

    gpus = _gpu_names()
    ort_dist = next((d for d in ("onnxruntime-gpu", "onnxruntime") if _version(d) != "-"), "onnxruntime")
    return [
        (
            f"machine: {_cpu_name()}, {os.cpu_count()} cores ({available_cores()} usable: affinity and cgroup quota); "
            f"GPU: {'; '.join(gpus) or 'none'}"
        ),
        (
            f"onnxruntime: {ort_dist} {ort.__version__} (device {ort.get_device()}, "
            f"providers offered: {', '.join(ort.get_available_providers())})"
        ),
        f"versions: python {platform.python_version()}, numpy {np.__version__}, opencv {cv2.__version__}, facegate {_version('facegate')}",
    ]


def _sample(images: list[Path], pipeline: FacePipeline):
    if not images:
        raise SystemExit("pass some photos with faces, e.g. a few LFW images")
    blobs = [p.read_bytes() for p in images]
    decoded = [pipeline.decode(b) for b in blobs]
    faces = [pipeline.detect(img) for img in decoded]
    with_face = [(img, f[:1]) for img, f in zip(decoded, faces, strict=True) if f]
    if not with_face:
        raise SystemExit("no face found in the given images")
    return blobs, decoded, with_face


def run_pipeline_bench(
    pipeline: FacePipeline,
    images: list[Path],
    seconds: float,
    console: Console,
    batches: tuple[int, ...] = (1, 8, 32),
    header: bool = True,
    sample=None,
) -> None:
    blobs, decoded, with_face = sample or _sample(images, pipeline)
    providers = pipeline.detector_model.session.get_providers()
    if header:
        for line in machine_lines():
            console.print(line)
    console.print(f"onnxruntime providers (detector): {', '.join(providers)}")
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
    if pipeline.embedder is not None and batches:
        crops = np.concatenate([pipeline.align(img, f) for img, f in with_face])
        manifest = pipeline.embedder_model.manifest
        gflops = manifest.provenance.get("export", {}).get("gflops_per_face")
        for batch in batches:
            chunk = np.resize(crops, (batch, *crops.shape[1:]))
            rate, ms = _rate(lambda: pipeline.embedder.embed(chunk), seconds, batch)
            table.add_row(f"embed ({manifest.name})", str(batch), f"{rate:.1f}", f"{ms:.2f}")
        if gflops:
            line = f"embedder: {gflops:.3f} GFLOP per face (manifest) → {gflops * rate:.1f} GFLOP/s at batch {batch}"
            if pipeline.embedder_model.session.get_providers()[0] == "CPUExecutionProvider":
                peak = gemm_peak_gflops(seconds)
                line += (
                    f", {100 * gflops * rate / peak:.0f}% of this CPU's fp32 GEMM peak ({peak:.0f} GFLOP/s, "
                    f"which bounds it at {peak / gflops:.0f} faces/s)"
                )
            console.print(line)
    elif pipeline.embedder is None:
        console.print("[yellow]no embedder loaded (FACEGATE_EMBEDDER): embed stage skipped[/yellow]")
    console.print(table)
    console.print(decoding_in_workers(pipeline, blobs, seconds))


def _paired_rates(bare, piped, seconds: float, items: int) -> tuple[float, float]:
    """Items per second of two calls timed alternately, from each one's median call: a noisy,
    shared machine then slows both alike, and a burst of other work moves neither figure much."""
    bare(), piped()  # warm-up: first runs allocate
    times: tuple[list[float], list[float]] = ([], [])
    while sum(map(sum, times)) < 2 * seconds or len(times[0]) < 5:
        for spent, fn in zip(times, (bare, piped), strict=True):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return items / float(np.median(times[0])), items / float(np.median(times[1]))


def embed_scaling(pipeline: FacePipeline, crops: np.ndarray, batches: tuple[int, ...], seconds: float) -> Table:
    """Faces/s of the bare session (one run on an input already in the model's form) against the
    pipeline's embed stage (`FaceEmbedder.embed`: preprocessing, runs of at most the
    largest of FACEGATE_BATCH_SIZES, normalization) at each batch size: what the service adds to the model."""
    from service.core.models.embedder import preprocess

    embedder = pipeline.embedder
    manifest = embedder.manifest
    table = Table(
        "batch",
        "bare session faces/s",
        "pipeline embed faces/s",
        "pipeline / bare",
        "pipeline ms/call (median)",
        title=f"embed batch scaling ({manifest.name})",
    )
    for batch in batches:
        chunk = np.resize(crops, (batch, *crops.shape[1:]))
        feed = {embedder.input_name: preprocess(chunk, manifest.input, embedder.in_graph)}
        bare, piped = _paired_rates(
            lambda: embedder.session.run([embedder.output_name], feed), lambda: embedder.embed(chunk), seconds, batch
        )
        table.add_row(str(batch), f"{bare:.1f}", f"{piped:.1f}", f"{100 * piped / bare:.1f}%", f"{1000 * batch / piped:.2f}")
    return table


def detect_scaling(pipeline: FacePipeline, decoded: list[np.ndarray], batches: tuple[int, ...], seconds: float) -> Table:
    """The detector's images/s at each batch size (canvases of the photos' most common input size),
    and how far each photo's faces from a batched run are from those of its own run: a GPU's kernels
    differ between batch sizes, the faces must not (boxes and landmarks within 0.5 px, scores 1e-3)."""
    detector = pipeline.detector
    size = max(set(sizes := [detector.size_for(img.shape[:2]) for img in decoded]), key=sizes.count)
    photos = [img for img, s in zip(decoded, sizes, strict=True) if s == size]
    boxed = [detector.letterbox(img, size) for img in photos]
    canvases = np.stack([c for c, _ in boxed])
    alone = [detector.faces(detector.infer(c[None])[0], scale, img.shape[:2]) for (c, scale), img in zip(boxed, photos, strict=True)]
    table = Table(
        "batch",
        "images/s",
        "ms/run",
        "max Δ box/landmarks px",
        "max Δ score",
        "photos whose faces differ",
        title=f"detection at {size}×{size} ({len(photos)} photos), batched against each photo alone",
    )
    for batch in batches:
        chunk = np.resize(canvases, (batch, *canvases.shape[1:]))
        rate, ms = _rate(lambda: detector.infer(chunk), seconds, batch)
        rows = [row for start in range(0, len(canvases), batch) for row in detector.infer(canvases[start : start + batch])]
        together = [detector.faces(row, scale, img.shape[:2]) for row, (_, scale), img in zip(rows, boxed, photos, strict=True)]
        dpx, dscore, differ = 0.0, 0.0, 0
        for a, b in zip(alone, together, strict=True):
            if len(a) != len(b):
                differ += 1
                continue
            for fa, fb in zip(a, b, strict=True):
                dpx = max(dpx, float(np.abs(fa.box - fb.box).max()), float(np.abs(fa.landmarks - fb.landmarks).max()))
                dscore = max(dscore, abs(fa.score - fb.score))
        table.add_row(str(batch), f"{rate:.1f}", f"{ms:.2f}", f"{dpx:.4f}", f"{dscore:.2e}", str(differ))
    return table


def decoding_in_workers(pipeline: FacePipeline, blobs: list[bytes], seconds: float) -> Table:
    """What the service pays to decode in a decoder process (`service.runtime.decode_workers`: a probe
    and a decode, each a round trip, the pixels copied back) over decoding in this thread, on the
    same photos: the two timed alternately, each from its median call."""
    from service.core.decode import decode_image, probe
    from service.runtime.decode_workers import DecodeWorkers

    s = pipeline.settings
    limits = (s.max_image_bytes, s.max_image_pixels, s.min_image_side, s.jpeg_reduce_to_side)
    workers = DecodeWorkers(1, s.decode_memory_mb, s.decode_timeout, s.max_image_bytes, s.max_image_pixels)
    turn = iter(range(10**9))

    def in_place() -> None:
        blob = blobs[next(turn) % len(blobs)]
        probe(blob, *limits)
        decode_image(blob, *limits)

    def in_worker() -> None:
        blob = blobs[next(turn) % len(blobs)]
        workers.probe(blob, *limits)
        workers.decode(blob, *limits)

    try:
        workers.start()
        here, there = _paired_rates(in_place, in_worker, seconds, 1)
    finally:
        workers.close()
    megapixels = np.mean([probe(b, *limits).decoded_pixels for b in blobs]) / 1e6
    table = Table("probe + decode", "ms/image (median)", title=f"decoding in a decoder process ({megapixels:.2f} MP decoded, mean)")
    table.add_row("in this thread", f"{1000 / here:.2f}")
    table.add_row("in a decoder process", f"{1000 / there:.2f} ({1000 / there - 1000 / here:+.2f} ms, {100 * here / there - 100:+.0f}%)")
    return table


def _photo_seconds(fn, blob: bytes) -> tuple[float, float, int]:
    """(wall s, CPU s of the process, faces found) of one photo through `fn`."""
    wall, cpu = time.perf_counter(), time.process_time()
    faces = fn(blob)
    return time.perf_counter() - wall, time.process_time() - cpu, faces


def peer_comparison(pipeline: FacePipeline, blobs: list[bytes], seconds: float) -> Table | None:
    """Each photo from its bytes to every face's embedding through facegate and through
    face_recognition (dlib's HOG detector and the same ResNet: what facegate replaces), the two
    taking turns photo by photo so a shared machine slows both alike; None where face_recognition is
    not installed. The ratio the README quotes comes from one run of this."""
    try:
        import face_recognition
    except ImportError:
        return None
    from service.core.errors import NoFace

    def ours(blob: bytes) -> int:
        try:
            return len(pipeline.embed_image(pipeline.decode(blob)))
        except NoFace:
            return 0

    def peer(blob: bytes) -> int:
        return len(face_recognition.face_encodings(face_recognition.load_image_file(io.BytesIO(blob))))

    ours(blobs[0]), peer(blobs[0])  # warm-up: first runs allocate
    totals = {"facegate": np.zeros(3), "face_recognition": np.zeros(3)}
    photos = 0
    while photos < len(blobs) and (photos < 5 or sum(t[0] for t in totals.values()) < 2 * seconds):
        for name, fn in (("facegate", ours), ("face_recognition", peer)):
            totals[name] += _photo_seconds(fn, blobs[photos])
        photos += 1
    table = Table("pipeline", "ms/photo (wall)", "CPU ms/photo", "faces found", title=f"the peer on the same {photos} photos, taking turns")
    for name, (wall, cpu, faces) in totals.items():
        table.add_row(name, f"{1000 * wall / photos:.1f}", f"{1000 * cpu / photos:.1f}", str(int(faces)))
    ratio = totals["facegate"][0] / totals["face_recognition"][0]
    table.caption = (
        f"facegate / face_recognition wall time: {ratio:.3f} ({1 / ratio:.1f}× faster), "
        f"face_recognition {_version('face_recognition')}, dlib {_version('dlib-bin')}"
    )
    return table


def weights_description(manifest: Manifest) -> str:
    """The embedder's weights as its manifest says they were made: quantized on import, or exported."""
    quantized = manifest.file.source.quantization if manifest.file.source else None
    if quantized:
        return f"{quantized.weight_type} ({'7' if quantized.reduce_range else '8'}-bit), activations {quantized.activation_type}"
    return manifest.provenance.get("export", {}).get("dtype", "float32")


def run_all(
    settings: Settings,
    images: list[Path],
    console: Console,
    seconds: float = 3.0,
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128),
    concurrency: tuple[int, ...] = (1, 8, 32, 64),
    requests: int = 200,
    routes: tuple[str, ...] = ("verify", "identify"),
    servings: tuple[Serving, ...] = (Serving(),),
    gallery_faces: int = 0,
    load_seconds: float = 0,
) -> None:
    """`facegate bench all`: machine, versions and providers, then pipeline stages, embed batch
    scaling and HTTP load (a server of this checkout spawned with the same settings' models, once
    per way of serving)."""
    pipeline = FacePipeline.from_settings(settings)
    for line in machine_lines():
        console.print(line)
    model = pipeline.embedder_model
    spec = model.manifest.input
    console.print(
        f"embedder: {model.manifest.name} {model.manifest.version} ({spec.dtype} {spec.layout} input"
        f"{', preprocessing in the graph' if pipeline.embedder.in_graph else ', preprocessing in numpy'}"
        f"{' (wrapped at load)' if pipeline.embedder.in_graph and not spec.in_graph else ''}; "
        f"weights {weights_description(model.manifest)}), "
        f"providers {', '.join(model.session.get_providers())}, IO binding {'on' if pipeline.embedder.io_binding else 'off'}"
    )
    console.print(
        f"settings: intra_op_threads={settings.intra_op_threads}, worker_threads={settings.worker_threads}, "
        f"batch_sizes={list(pipeline.embedder.shapes.sizes)}, detect_batch_sizes={list(pipeline.detector.shapes.sizes)}, "
        f"batching={settings.batching}"
    )

    console.rule("pipeline stages")
    sample = _sample(images, pipeline)  # decoded and detected once for both tables
    run_pipeline_bench(pipeline, images, seconds, console, batches=(), header=False, sample=sample)

    console.rule("detection batch scaling")
    console.print(detect_scaling(pipeline, sample[1], tuple(b for b in batches if b <= 64) or (1,), seconds))

    console.rule("embed batch scaling")
    with_face = sample[2]
    crops = np.concatenate([pipeline.align(img, f) for img, f in with_face])
    console.print(embed_scaling(pipeline, crops, batches, seconds))

    console.rule("peer")
    peer = peer_comparison(pipeline, sample[0], seconds)
    console.print(peer or "[yellow]peer skipped: face_recognition is not installed (make peer)[/yellow]")

    console.rule("HTTP load")
    if not concurrency or not routes:
        return
    try:
        import httpx  # noqa: F401  (the dev extra)
    except ImportError:
        console.print("[yellow]HTTP load skipped: it needs httpx (pip install -e '.[dev]')[/yellow]")
        return
    console.print(
        load_table(
            settings,
            [p.read_bytes() for p in images[:64]],
            servings,
            list(routes),
            list(concurrency),
            requests,
            gallery_faces,
            key_of(pipeline),
            seconds=load_seconds,
        )
    )


def key_of(pipeline: FacePipeline) -> EmbedderKey:
    return EmbedderKey.of(pipeline.require_embedder().manifest)


def load_table(
    settings: Settings,
    blobs: list[bytes],
    servings: tuple[Serving, ...],
    routes: list[str],
    concurrency: list[int],
    requests: int,
    gallery_faces: int = 0,
    key: EmbedderKey | None = None,
    processes: int = 0,
    seconds: float = 0,
) -> Table:
    """The HTTP load rows of a server of this checkout spawned with the settings' models, once for
    each way of serving (one process; N workers with or without the model host), on a gallery of
    `gallery_faces` random faces besides the enrolled photos."""
    from benchmarks.loadtest import fill_gallery, load_rows

    env = {"FACEGATE_EMBEDDER": str(settings.embedder), "FACEGATE_DEVICE": settings.device}
    prepare = (lambda folder: fill_gallery(folder, key, gallery_faces)) if gallery_faces and key else None
    table = Table(
        "serving",
        "route",
        "concurrency",
        "req/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "statuses",
        title=f"HTTP load ({f'{seconds:g} s' if seconds else f'{requests} requests'} each, batching {'on' if settings.batching else 'off'}"
        f"{f', {gallery_faces:,} more faces in the gallery' if gallery_faces else ''})",
    )
    for serving, r in load_rows(env, blobs, list(servings), routes, concurrency, requests, processes, prepare, seconds=seconds):
        table.add_row(
            str(serving), r.route, str(r.concurrency), f"{r.rps:.1f}", f"{r.p50:.1f}", f"{r.p95:.1f}", f"{r.p99:.1f}", r.status_text()
        )
    return table
