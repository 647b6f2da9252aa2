"""`facegate eval-open-set`: DIR and realized FPIR of an exported model on a folder of identities,
decided as /identify decides (and as it decided on cosines, for comparison), for the whole gallery
and for seeded draws of smaller ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from service.core.console import console, fail
from service.core.errors import ModelError
from service.core.models.cohort import Cohort
from service.core.pipeline import FacePipeline
from service.core.settings import get_settings
from training.identification import det_png, protocol, report


def eval_open_set(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="An exported model's manifest (.json) or its .onnx.")],
    images: Annotated[
        Path, typer.Option(exists=True, file_okay=False, help="Identity folders: NAME/*.jpg (LFW's layout; photos or aligned crops).")
    ],
    enroll: Annotated[
        int, typer.Option(min=1, help="Photos enrolled per known person (people with more are known, the others strangers).")
    ] = 1,
    strangers: Annotated[
        int | None, typer.Option(min=1, help="Probe with at most this many strangers (people, sorted by name; every photo of each).")
    ] = None,
    swap: Annotated[bool, typer.Option(help="Enroll by the next photo(s) and probe with the first (the second split).")] = False,
    sizes: Annotated[
        list[int] | None,
        typer.Option(
            min=1, help="Also smaller galleries of this many enrolled people (repeat: --sizes 10 --sizes 100), the others strangers."
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Seeded draws per --sizes.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the --sizes draws.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write the JSON results here too.")] = None,
    det: Annotated[Path | None, typer.Option(help="DET curve PNG.")] = None,
    cohort: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="A cohort manifest (`facegate calibrate-cohort`): decide on AS-norm scores, as the service does with FACEGATE_COHORT.",
        ),
    ] = None,
    cache: Annotated[Path, typer.Option(help="Cache of aligned crops.")] = Path("~/.cache/facegate/eval"),
    progress: Annotated[bool, typer.Option(help="Progress bars on stderr.")] = True,
) -> None:
    """Enroll `enroll` photos of each person who has more, probe with the next photo and with every
    photo of the people who have fewer: DIR and the realized FPIR at FPIR 1e-1/1e-2/1e-3 and
    FACEGATE_DEFAULT_FPIR, for the service's decision (the margin score when the model has its
    open-set table) and for the cosine decision."""
    from training.pair_evaluation import OnnxEmbedder, cached_crops

    settings = get_settings()
    try:
        embedder = OnnxEmbedder(model.with_suffix(".json"), settings)
        pipeline = FacePipeline.from_settings(settings, require_embedder=False)
        p = protocol(images, enroll, strangers, swap)
        normalizer = Cohort.load(cohort, embedder.model.manifest) if cohort else None
    except (ModelError, ValueError) as exc:
        fail(exc)

    def embed(paths):
        crops, _ = cached_crops(paths, pipeline, cache.expanduser(), "open-set", embedder.alignment, progress)
        raw = embedder.raw(crops)
        return raw / np.maximum(np.linalg.norm(raw, axis=1, keepdims=True), 1e-12)

    result = {
        "model": str(model),
        "images": str(images),
        **report(
            embedder.model.manifest, p, embed, settings.default_fpir, cohort=normalizer, sizes=sizes or (), repeats=repeats, seed=seed
        ),
    }
    heading = (
        f"{result['enrolled_subjects']} enrolled ({result['gallery_faces']} faces), {result['known_probes']} known probes, "
        f"{result['stranger_probes']} strangers; rank-1 {result['rank1']:.4f}"
    )
    for key in ("rows", "cosine_rows") if result["score"] != "cosine" else ("rows",):
        table = Table(
            "fpir", "threshold", "from", "realized FPIR", "DIR", "oracle DIR", title=f"{result[key][0]['score']} scores; {heading}"
        )
        for row in result[key]:
            table.add_row(
                f"{row['fpir']:g}" + (" (default)" if row["default"] else ""),
                f"{row['threshold']:.6f}",
                _origin(row),
                f"{row['realized_fpir']:.4f}",
                f"{row['dir']:.4f}",
                f"{row['oracle_dir']:.4f}",
            )
        console.print(table)
    if result["by_size"]:
        rates = [row["fpir"] for row in result["by_size"][0]["rows"]]
        table = Table(
            "enrolled",
            *(f"fpir {r:g}: realized / DIR" for r in rates),
            *(f"cosine, fpir {r:g}" for r in rates),
            title=f"{result['score']} scores (and cosine), {repeats} draws per size",
        )
        for entry in result["by_size"]:
            cells = [f"{row['realized_fpir']:.4f} / {row['dir']:.3f}" for key in ("rows", "cosine_rows") for row in entry[key]]
            table.add_row(f"{entry['subjects']:,}", *cells)
        console.print(table)
    if det is not None:
        det_png(
            result, det, f"{embedder.model.manifest.name} on {images.name}: open set, enrolled by {enroll}" + (", swapped" if swap else "")
        )
    if out is not None:
        out.write_text(json.dumps({k: v for k, v in result.items() if not k.endswith("det")}, indent=2) + "\n")


def _origin(row: dict) -> str:
    """Where a row's threshold comes from: the per-comparison FAR of a cosine or AS-norm decision, or the
    open-set table (the margin's, with its guard; the best cosine's below its cosine_below subjects)."""
    if row["far"] is not None:
        return row["far"] + (" (tail)" if row["extrapolated"] else "")
    guard = row["guard_threshold"]
    source = (
        "table"
        if guard is None or row["threshold"] == row["table_threshold"]
        else "guard"
        if row["threshold"] == round(guard, 6)
        else "cap"
    )
    return (
        f"{source} (table {row['table_threshold']:.4f}"
        + ("" if guard is None else f", guard {guard:.4f}")
        + ")"
        + (" extrapolated" if row["extrapolated"] else "")
    )
