"""`facegate export`: a checkpoint's backbone → ONNX + manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from service.core.console import console, fail
from service.core.settings import get_settings


def export(
    checkpoint: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="models/NAME.onnx; the manifest goes to models/NAME.json.")],
    license_name: Annotated[
        str,
        typer.Option(
            "--license",
            "--license-name",
            help=(
                "Licence of the model: the terms of the photos you trained on (e.g. 'own photos, "
                "internal use'); required, since no config can know them."
            ),
        ),
    ],
    fp16: Annotated[bool, typer.Option(help="float16 weights and arithmetic (uint8 or float32 input, float32 output): for GPUs.")] = False,
    input_format: Annotated[
        str,
        typer.Option(
            help=(
                "uint8_nhwc: the model normalizes the aligned crops in its graph (on the GPU when served there); "
                "float32_nchw: the older form, normalized by the service in numpy."
            )
        ),
    ] = "uint8_nhwc",
    flip_tta: Annotated[bool, typer.Option(help="Embed each crop plus its mirror inside the model (twice the compute).")] = False,
    opset: Annotated[int, typer.Option(help="ONNX opset (≥ 17).")] = 17,
    eval_: Annotated[Path | None, typer.Option("--eval", help="Results JSON of `facegate eval --out`, recorded in the manifest.")] = None,
    license_terms: Annotated[str | None, typer.Option(help="Usage terms, e.g. 'research, non-commercial'.")] = None,
    version: Annotated[str | None, typer.Option(help="Manifest version (default: backbone-head-stepN).")] = None,
) -> None:
    """Export the backbone to ONNX, check parity with onnxruntime, write the manifest."""
    from training.onnx_export import ExportError
    from training.onnx_export import export as run

    license = {"name": license_name, **({"terms": license_terms} if license_terms else {})}
    metrics = json.loads(eval_.read_text()) if eval_ else None
    try:
        manifest = run(
            checkpoint,
            out,
            get_settings(),
            fp16=fp16,
            input_format=input_format,
            flip_tta=flip_tta,
            opset=opset,
            metrics=metrics,
            license=license,
            version=version,
        )
    except ExportError as exc:
        fail(exc)
    console.print(
        f"[green]ok[/green] {out} (parity cosine ≥ {manifest.provenance['export']['parity_min_cosine']}) + {out.with_suffix('.json')}"
    )
    if not manifest.thresholds:
        console.print(
            f"[yellow]warning:[/yellow] {out.with_suffix('.json')} has no thresholds yet: served as it is, /verify and /identify at "
            f"their default FAR answer 422 unknown_far. Run `facegate calibrate {out.with_suffix('.json')}` (the run's held-out "
            "identities; or --data ALIGNED_FOLDERS of other people it never trained on)."
        )
