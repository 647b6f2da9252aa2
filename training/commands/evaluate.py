"""`facegate eval`: verification metrics of a checkpoint or an exported model on a pairs set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from service.core.console import console, fail
from service.core.errors import ModelError
from service.core.models.manifest import Manifest
from service.core.pipeline import FacePipeline
from service.core.settings import get_settings


def eval_(
    model: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="A checkpoint (.pt) or an exported model's manifest (.json/.onnx).")
    ],
    pairs: Annotated[Path | None, typer.Option(help="LFW-layout pairs.txt (with --images).")] = None,
    images: Annotated[Path | None, typer.Option(help="LFW-layout image folder: NAME/NAME_0001.jpg.")] = None,
    bin_: Annotated[Path | None, typer.Option("--bin", help="InsightFace verification .bin.")] = None,
    csv: Annotated[Path | None, typer.Option(help="CSV with path1,path2,issame (paths relative to it).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the JSON results here too.")] = None,
    roc: Annotated[Path | None, typer.Option(help="ROC curve PNG.")] = None,
    cache: Annotated[Path, typer.Option(help="Cache of aligned evaluation crops.")] = Path("~/.cache/facegate/eval"),
    record: Annotated[bool, typer.Option(help="Store the results in the exported model's manifest metrics.")] = False,
    device: Annotated[
        str,
        typer.Option(
            help="A checkpoint's torch device: auto (CUDA when present), cpu, cuda, cuda:N. An exported model follows FACEGATE_DEVICE."
        ),
    ] = "auto",
    progress: Annotated[bool, typer.Option(help="Progress bar on stderr.")] = True,
) -> None:
    """Verification accuracy (10-fold), AUC, EER, TAR@FAR, with and without flip-TTA, as JSON; for an
    exported model also the FAR and TAR its calibrated thresholds realize on these pairs."""
    from training.pair_evaluation import OnnxEmbedder, evaluate, load_bin, load_csv, load_embedder, load_lfw

    if sum(x is not None for x in (pairs, bin_, csv)) != 1 or (pairs is not None) != (images is not None):
        fail("give exactly one of: --pairs with --images, --bin, --csv")
    cache = cache.expanduser()
    settings = get_settings()
    embedder, kind = load_embedder(model, settings, device)
    if "cpu" in str(embedder.device).lower():
        console.print(
            "[yellow]note:[/yellow] evaluation embeds every photo of the pairs three times and, the first time, aligns them: "
            "on a CPU that takes minutes (LFW's 7,701 photos: about 11 min on 2 cores the first time; the aligned crops are "
            f"then cached in {cache}). Progress follows."
        )
    if bin_ is not None:
        vset = load_bin(bin_)
    else:
        try:
            pipeline = FacePipeline.from_settings(settings, require_embedder=False)
        except ModelError as exc:
            fail(exc)
        template = embedder.alignment
        if pairs is not None and images is not None:  # else --csv: exactly one source, checked above
            vset = load_lfw(pairs, images, pipeline, cache, template=template, progress=progress)
        elif csv is not None:
            vset = load_csv(csv, pipeline, cache, template=template, progress=progress)
    if record and kind != "onnx":
        fail("--record needs an exported model (its .json manifest)")
    thresholds = embedder.model.manifest.thresholds if isinstance(embedder, OnnxEmbedder) else None
    metrics = evaluate(embedder, vset, roc, thresholds, progress=progress)
    results = {"model": str(model), "kind": kind, **metrics}
    if record:
        manifest_path = model.with_suffix(".json")
        manifest = Manifest.load(manifest_path)
        manifest.metrics = {**manifest.metrics, **metrics}
        manifest.save(manifest_path)
    text = json.dumps(results, indent=2)
    if out:
        out.write_text(text + "\n")
    typer.echo(text)
