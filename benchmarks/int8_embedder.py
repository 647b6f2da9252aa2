"""An int8 dlib-resnet-v1, measured against the float model it is made from: static quantization with
onnxruntime's tools (per-channel weights), calibrated on aligned training crops (never LFW), then
faces/s at batch 1 and 32 on this CPU, the cosine between float and int8 embeddings on LFW and,
with --pairs, LFW 10-fold and TAR at FAR of both.

    python benchmarks/int8_embedder.py --calibration $FACEGATE_TEST_DATA/train --lfw $FACEGATE_TEST_DATA/lfw \\
        --out /tmp/int8 [--format qdq|qoperator] [--full-range] [--pairs $FACEGATE_TEST_DATA/lfw/pairs.txt]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from benchmarks.bench import machine_lines
from service.models.embedder import FaceEmbedder, l2_normalize, preprocess
from service.models.providers import Runtime, create_session
from service.pipeline import FacePipeline
from service.settings import Settings
from training.evaluate import align_images, load_lfw
from training.verification import at_thresholds, verification_metrics


class Crops(CalibrationDataReader):
    """Preprocessed crops handed to the calibrator a batch at a time."""

    def __init__(self, inputs: np.ndarray, name: str, batch: int = 16):
        self._batches = iter([{name: inputs[i : i + batch]} for i in range(0, len(inputs), batch)])

    def get_next(self):
        return next(self._batches, None)


def _sample(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """One photo each of n people, chosen at random (the first of each, sorted)."""
    people = sorted(p for p in folder.iterdir() if p.is_dir())
    return [sorted(p.glob("*.jpg"))[0] for p in random.Random(seed).sample(people, n)]


def _faces_per_s(session: ort.InferenceSession, inputs: np.ndarray, batch: int, seconds: float) -> float:
    name = session.get_inputs()[0].name
    x = inputs[:batch]
    session.run(None, {name: x})
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or runs < 2:
        session.run(None, {name: x})
        runs += 1
    return runs * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=Path, required=True, help="training photos, a folder per person")
    parser.add_argument("--lfw", type=Path, required=True, help="LFW photos, a folder per person (agreement only)")
    parser.add_argument("--out", type=Path, required=True, help="where the int8 file is written")
    parser.add_argument("--format", choices=("qdq", "qoperator"), default="qdq")
    parser.add_argument("--full-range", action="store_true", help="8-bit weights; the default 7 bits avoid u8×s8 overflow on CPUs without VNNI")
    parser.add_argument("--pairs", type=Path, help="LFW pairs.txt: 10-fold accuracy and TAR at FAR of both models (crops cached in --out)")
    parser.add_argument("--n-calibration", type=int, default=200)
    parser.add_argument("--n-lfw", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=8.0, help="timing budget per model and batch, in two alternated halves")
    args = parser.parse_args()

    pipeline = FacePipeline.from_settings(Settings())
    model, spec = pipeline.embedder_model, pipeline.embedder_model.manifest.input
    calibration = preprocess(align_images(_sample(args.calibration, args.n_calibration), pipeline, model.manifest.alignment)[0], spec)
    lfw = preprocess(align_images(_sample(args.lfw, args.n_lfw), pipeline, model.manifest.alignment)[0], spec)

    args.out.mkdir(parents=True, exist_ok=True)
    prepared, int8 = args.out / "prepared.onnx", args.out / f"{model.manifest.name}-int8-{args.format}.onnx"
    quant_pre_process(str(model.path), str(prepared))
    started = time.perf_counter()
    quantize_static(
        str(prepared),
        str(int8),
        Crops(calibration, spec.name),
        quant_format=QuantFormat.QDQ if args.format == "qdq" else QuantFormat.QOperator,
        per_channel=True,
        reduce_range=not args.full_range,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    print(f"quantized in {time.perf_counter() - started:.0f} s: {int8} ({int8.stat().st_size / 1e6:.1f} MB, float {model.path.stat().st_size / 1e6:.1f} MB)")

    runtime = Runtime.from_settings(Settings())
    sessions = {"float32": create_session(model.path, runtime), "int8": create_session(int8, runtime)}
    embeddings = {k: l2_normalize(np.concatenate([s.run(None, {spec.name: lfw[i : i + 32]})[0] for i in range(0, len(lfw), 32)])) for k, s in sessions.items()}
    cosine = (embeddings["float32"] * embeddings["int8"]).sum(axis=1)
    for line in machine_lines():
        print(line)
    print(f"calibration: {len(calibration)} aligned training crops; agreement on {len(lfw)} LFW crops")
    print(f"cosine float32 vs int8: mean {cosine.mean():.4f}, min {cosine.min():.4f}, p1 {np.percentile(cosine, 1):.4f}")
    for batch in (1, 32):
        rates = {k: [] for k in sessions}
        for _ in range(2):  # alternated, so drift on a shared machine hits both
            for k, s in sessions.items():
                rates[k].append(_faces_per_s(s, lfw, batch, args.seconds / 2))
        f, q = np.mean(rates["float32"]), np.mean(rates["int8"])
        print(f"batch {batch}: float32 {f:.1f} faces/s, int8 {q:.1f} faces/s (int8/float {q / f:.2f})")
    if args.pairs:
        pairs = load_lfw(args.pairs, args.pairs.parent, pipeline, args.out, model.manifest.alignment)
        for k, s in sessions.items():
            e = FaceEmbedder(model.manifest, s).embed(pairs.crops)
            scores = (e[pairs.pairs[:, 0]] * e[pairs.pairs[:, 1]]).sum(axis=1)
            m = verification_metrics(scores, pairs.issame, pairs.folds)
            at = at_thresholds(scores, pairs.issame, model.manifest.thresholds)
            print(
                f"LFW {k}: 10-fold {100 * m['accuracy']:.2f}% ± {100 * m['accuracy_std']:.2f}, TAR@FAR",
                {f: round(100 * t, 2) for f, t in m["tar_at_far"].items()},
                "| at the float model's thresholds: FAR/TAR",
                {f: (round(100 * v["far"], 2), round(100 * v["tar"], 2)) for f, v in at.items()},
            )


if __name__ == "__main__":
    main()
