"""dlib-resnet-v1-int8 beside dlib-resnet-v1, the float model it is made from (both pulled with
`facegate models pull`): faces/s at batch 1 and 32 on this CPU, alternated; the cosine between
their embeddings on LFW crops; with --pairs, LFW 10-fold and TAR at FAR of both, and what each
one's own calibrated thresholds realize there.

    python benchmarks/int8_embedder.py --lfw $FACEGATE_TEST_DATA/lfw --cache /tmp/int8 \\
        [--int8 dlib-resnet-v1-int8 | path/to/manifest.json] [--pairs $FACEGATE_TEST_DATA/lfw/pairs.txt]

The int8 file itself is made by `facegate calibrate-int8` (ranges) and `facegate models pull`.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.bench import machine_lines
from service.core.models.embedder import FaceEmbedder, l2_normalize, preprocess
from service.core.models.files import LoadedModel, load_model
from service.core.models.providers import Runtime
from service.core.pipeline import FacePipeline
from service.core.settings import Settings
from training.pair_evaluation import align_images, load_lfw
from training.verification import at_thresholds, verification_metrics


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
    parser.add_argument("--lfw", type=Path, required=True, help="LFW photos, a folder per person")
    parser.add_argument("--cache", type=Path, required=True, help="aligned LFW crops are cached here")
    parser.add_argument("--float", dest="float_model", default="dlib-resnet-v1", help="the float manifest (name or path)")
    parser.add_argument("--int8", default="dlib-resnet-v1-int8", help="the int8 manifest (name or path)")
    parser.add_argument("--pairs", type=Path, help="LFW pairs.txt: 10-fold accuracy and TAR at FAR of both models")
    parser.add_argument("--n-lfw", type=int, default=500, help="LFW photos for the agreement and the timing")
    parser.add_argument("--seconds", type=float, default=8.0, help="timing budget per model and batch, in two alternated halves")
    args = parser.parse_args()

    settings = Settings()
    runtime = Runtime.from_settings(settings)
    models: dict[str, LoadedModel] = {
        k: load_model(name, settings.models_dir, settings.model_cache, runtime=runtime)
        for k, name in (("float32", args.float_model), ("int8", args.int8))
    }
    spec = models["float32"].manifest.input
    pipeline = FacePipeline.from_settings(settings)
    people = sorted(p for p in args.lfw.iterdir() if p.is_dir())
    photos = [sorted(p.glob("*.jpg"))[0] for p in random.Random(0).sample(people, args.n_lfw)]
    lfw = preprocess(align_images(photos, pipeline, models["float32"].manifest.alignment or "")[0], spec)

    embeddings = {
        k: l2_normalize(np.concatenate([m.session.run(None, {spec.name: lfw[i : i + 32]})[0] for i in range(0, len(lfw), 32)]))
        for k, m in models.items()
    }
    cosine = (embeddings["float32"] * embeddings["int8"]).sum(axis=1)
    for line in machine_lines():
        print(line)
    print(f"files: {', '.join(f'{k} {m.path.name} ({m.path.stat().st_size / 1e6:.1f} MB)' for k, m in models.items())}")
    print(
        f"cosine float32 vs int8 on {len(lfw)} LFW crops: mean {cosine.mean():.4f}, min {cosine.min():.4f}, "
        f"p1 {np.percentile(cosine, 1):.4f}"
    )
    for batch in (1, 32):
        rates: dict[str, list[float]] = {k: [] for k in models}
        for _ in range(2):  # alternated, so drift on a shared machine hits both
            for k, m in models.items():
                rates[k].append(_faces_per_s(m.session, lfw, batch, args.seconds / 2))
        f, q = np.mean(rates["float32"]), np.mean(rates["int8"])
        print(f"batch {batch}: float32 {f:.1f} faces/s, int8 {q:.1f} faces/s (int8/float {q / f:.2f})")
    if args.pairs:
        pairs = load_lfw(args.pairs, args.pairs.parent, pipeline, args.cache, models["float32"].manifest.alignment or "")
        for k, m in models.items():
            e = FaceEmbedder(m.manifest, m.session).embed(pairs.crops)
            scores = (e[pairs.pairs[:, 0]] * e[pairs.pairs[:, 1]]).sum(axis=1)
            metrics = verification_metrics(scores, pairs.issame, pairs.folds)
            at = at_thresholds(scores, pairs.issame, m.manifest.thresholds)
            print(
                f"LFW {k}: 10-fold {100 * metrics['accuracy']:.2f}% ± {100 * metrics['accuracy_std']:.2f}, TAR@FAR",
                {f: round(100 * t, 2) for f, t in metrics["tar_at_far"].items()},
                "| at its own thresholds: FAR/TAR",
                {f: (round(100 * v["far"], 2), round(100 * v["tar"], 2)) for f, v in at.items()},
            )


if __name__ == "__main__":
    main()
