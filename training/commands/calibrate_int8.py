"""`facegate calibrate-int8`: the activation ranges an int8 embedder is quantized at, calibrated on a
seeded sample of training photos, written beside its manifest with the file they make pinned in it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated, Literal

import typer

from service.core.console import console, fail


def sample_photos(folder: Path, n: int, seed: int) -> list[Path]:
    """One photo each of n identities drawn with `seed` (each one's first, sorted): the whole sample."""
    people = sorted(p for p in folder.iterdir() if p.is_dir())
    if n > len(people):
        raise ValueError(f"{folder} has {len(people)} identities, fewer than the {n} asked for")
    return [sorted(p.glob("*.jpg"))[0] for p in random.Random(seed).sample(people, n)]


def calibrate_int8(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The int8 model's manifest (its file.source.quantization).")],
    data: Annotated[
        Path, typer.Option(exists=True, file_okay=False, help="Training photos, a folder per identity (never the evaluation set).")
    ],
    samples: Annotated[int, typer.Option(min=1, help="Identities sampled, one photo each.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the sample.")] = 0,
    method: Annotated[Literal["MinMax", "Percentile"], typer.Option(help="onnxruntime's calibrator (Percentile: 99.999).")] = "MinMax",
) -> None:
    """Calibrate the ranges through the served pipeline's detector and alignment, write them beside
    the manifest, quantize, and pin the ranges' and the int8 file's sha256 (thresholds: `facegate calibrate`)."""
    import hashlib

    import onnxruntime as ort

    from service.core.errors import ModelError
    from service.core.models.embedder import preprocess
    from service.core.models.files import place_weights
    from service.core.models.manifest import Manifest
    from service.core.models.quantize import calibrate_ranges, int8_bytes
    from service.core.pipeline import FacePipeline
    from service.core.settings import get_settings
    from training.pair_evaluation import align_images

    try:
        manifest = Manifest.load(model)
        source = manifest.file.source
        if source is None or source.quantization is None:
            raise ModelError(f"{model}: not a quantized model (no file.source.quantization)")
        settings = get_settings()
        pipeline = FacePipeline.from_settings(settings)
        crops, fallbacks = align_images(sample_photos(data, samples, seed), pipeline, manifest.alignment or "")
        weights = place_weights(source, settings.model_cache)
        options = source.quantization.model_copy(update={"method": method, "onnxruntime": ort.__version__})
        ranges = model.parent / options.ranges
        calibrate_ranges(weights, preprocess(crops, manifest.input), manifest.input.name, method, ranges)
        options.ranges_sha256 = hashlib.sha256(ranges.read_bytes()).hexdigest()
        data_bytes = int8_bytes(weights, options, model.parent)
    except (ModelError, ValueError, OSError) as exc:
        fail(exc)
    manifest.file.source = source.model_copy(update={"quantization": options})
    manifest.file.sha256, manifest.file.bytes = hashlib.sha256(data_bytes).hexdigest(), len(data_bytes)
    manifest.metrics = {
        **manifest.metrics,
        "quantization": {
            "source": f"one photo each of {samples} identities of {data.name} (seed {seed})",
            "fallback_alignments": fallbacks,
        },
    }
    manifest.save(model)
    console.print(
        f"ranges → {ranges}; {manifest.name}: {len(data_bytes):,} bytes, sha256 {manifest.file.sha256} (onnxruntime {ort.__version__})"
    )
    console.print(f"run `facegate models pull {manifest.name}`, then `facegate calibrate {model} --data ALIGNED` for its thresholds")
