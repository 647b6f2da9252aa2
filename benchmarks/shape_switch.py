"""What a CUDA session pays when its input shape changes from one run to the next: the detector
(YuNet, batch and image size freed, preprocessing in the graph, as the service runs it on a GPU) and
the embedder run at batches 1, 2, 4, 8 in turn, in one session, then with a session per batch size.
A micro-batcher's batches change size all the time: this is why, on a GPU, the service keeps a
session per input shape (docs/sizing.md, "GPU options"). Also runs on a CPU, where both cost the same.

    FACEGATE_MODEL_CACHE=... FACEGATE_DEVICE=cuda python benchmarks/shape_switch.py [photos...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench import machine_lines  # noqa: E402
from service.core.models.files import find_model_file, manifest_path  # noqa: E402
from service.core.models.in_graph import uint8_nhwc_input  # noqa: E402
from service.core.models.manifest import Manifest  # noqa: E402
from service.core.models.providers import Runtime, create_session  # noqa: E402
from service.core.models.rebatch import free_batch, free_size  # noqa: E402
from service.core.settings import Settings  # noqa: E402

BATCHES = (1, 2, 4, 8)


def graph(settings: Settings, name: str, detector: bool) -> bytes:
    path = manifest_path(name, settings.models_dir)
    manifest = Manifest.load(path)
    data = find_model_file(manifest, path, settings.model_cache).read_bytes()
    if detector:
        data = free_size(free_batch(data) or data) or data
    return uint8_nhwc_input(onnx.load_from_string(data), manifest.input, "BGR" if detector else "RGB").SerializeToString()


def alternate(sessions, inputs: np.ndarray, seconds: float = 5.0) -> tuple[float, int]:
    """Median ms a run with the batch size changing every run, and the runs made in `seconds`."""
    times, started, i = [], time.perf_counter(), 0
    while time.perf_counter() - started < seconds or i < len(BATCHES):
        n = BATCHES[i % len(BATCHES)]
        t = time.perf_counter()
        session = sessions[n]
        session.run(None, {session.get_inputs()[0].name: inputs[:n]})
        times.append(time.perf_counter() - t)
        i += 1
    return 1000 * float(np.median(times)), len(times)


def main() -> None:
    for line in machine_lines():
        print(line)
    settings = Settings()
    runtime = Runtime.from_settings(settings)
    rng = np.random.default_rng(0)
    for role, name, detector, shape in (
        ("detector", settings.detector, True, (320, 320, 3)),
        ("embedder", settings.embedder, False, (150, 150, 3)),
    ):
        data = graph(settings, name, detector)
        inputs = rng.integers(0, 256, (max(BATCHES), *shape), dtype=np.uint8)
        one = create_session(data, runtime)
        per_shape = {n: create_session(data, runtime) for n in BATCHES}
        for n in BATCHES:  # every shape seen once by every session: what is measured is the switching
            one.run(None, {one.get_inputs()[0].name: inputs[:n]})
            per_shape[n].run(None, {per_shape[n].get_inputs()[0].name: inputs[:n]})
        for label, sessions in (("one session", dict.fromkeys(BATCHES, one)), ("a session per batch size", per_shape)):
            ms, runs = alternate(sessions, inputs)
            print(f"{role} ({one.get_providers()[0]}), batches {BATCHES} in turn, {label}: median {ms:.2f} ms a run ({runs} runs)")


if __name__ == "__main__":
    main()
