"""Would CUDA graphs pay? The bare sessions of the embedder and the detector, as the service builds
them on a GPU (preprocessing in the graph, the detector's batch and size freed), timed with their
input and output bound on the device, with and without onnxruntime's CUDA graph capture
(`enable_cuda_graph`), at a few fixed batch shapes. A graph replays a run's kernel launches at once:
it pays where a run is many small kernels, as YuNet's are at small batches.

    FACEGATE_MODEL_CACHE=... python benchmarks/cuda_graphs.py      (needs onnxruntime-gpu and a GPU)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from service.core.models.files import find_model_file, manifest_path  # noqa: E402
from service.core.models.in_graph import uint8_nhwc_input  # noqa: E402
from service.core.models.manifest import Manifest  # noqa: E402
from service.core.models.rebatch import free_batch, free_size  # noqa: E402
from service.core.settings import Settings  # noqa: E402


def graph_bytes(settings: Settings, name: str, detector: bool) -> tuple[bytes, Manifest]:
    path = manifest_path(name, settings.models_dir)
    manifest = Manifest.load(path)
    data = find_model_file(manifest, path, settings.model_cache).read_bytes()
    if detector:
        data = free_size(free_batch(data) or data) or data
    return uint8_nhwc_input(onnx.load_from_string(data), manifest.input, "BGR" if detector else "RGB").SerializeToString(), manifest


def rate(data: bytes, shape: tuple[int, ...], graphs: bool, runs: int = 200) -> float:
    """Runs per second of one session at one input shape, input and outputs bound on the device."""
    options = {"device_id": "0", "enable_cuda_graph": "1" if graphs else "0"}
    session = ort.InferenceSession(data, providers=[("CUDAExecutionProvider", options)])
    x = ort.OrtValue.ortvalue_from_numpy(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8), "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input(session.get_inputs()[0].name, x)
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda", 0)
    for _ in range(5):  # the first runs capture the graph, allocate and pick algorithms
        session.run_with_iobinding(binding)
    started = time.perf_counter()
    for _ in range(runs):
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    return runs / (time.perf_counter() - started)


def main() -> None:
    for line in machine_lines():
        print(line)
    settings = Settings()
    cases = [
        ("embedder", settings.embedder, False, [(n, 150, 150, 3) for n in (1, 8, 32, 128)]),
        ("detector", settings.detector, True, [(n, 320, 320, 3) for n in (1, 8, 32)] + [(8, 640, 640, 3)]),
    ]
    print(f"{'model':>9} {'shape':>20} {'runs/s':>10} {'graph runs/s':>13} {'items/s':>10} {'graph items/s':>14}")
    for role, name, detector, shapes in cases:
        data, manifest = graph_bytes(settings, name, detector)
        for shape in shapes:
            try:
                plain, captured = rate(data, shape, False), rate(data, shape, True)
            except Exception as exc:  # onnxruntime's bare Fail types: say what failed and go on
                print(f"{role:>9} {str(shape):>20} failed: {str(exc).splitlines()[0][:200]}")
                continue
            print(f"{role:>9} {str(shape):>20} {plain:>10.1f} {captured:>13.1f} {plain * shape[0]:>10.1f} {captured * shape[0]:>14.1f}")


if __name__ == "__main__":
    main()
