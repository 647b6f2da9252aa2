"""`facegate calibrate-cohort`: build an AS-norm cohort for an embedder from identity folders, with
the normalized score's calibration; FACEGATE_COHORT then names its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.core.console import console, fail
from service.core.errors import ModelError
from service.core.models.cohort import COHORT_SHARE, TOP
from service.core.settings import get_settings


def calibrate_cohort(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The embedder's manifest (.json) or its .onnx.")],
    data: Annotated[
        Path,
        typer.Option(
            exists=True,
            file_okay=False,
            help="Aligned identity folders (`facegate align --template` the model's), none of them people you will enroll.",
        ),
    ],
    out: Annotated[Path, typer.Option(help="Writes OUT.json (the cohort manifest FACEGATE_COHORT names) and OUT.npy.")],
    license_name: Annotated[
        str,
        typer.Option(
            "--license",
            help="The terms of the photos the cohort's embeddings come from: they are personal data, and ship under those terms.",
        ),
    ],
    license_terms: Annotated[str | None, typer.Option(help="Usage terms, e.g. 'research, non-commercial'.")] = None,
    top: Annotated[int, typer.Option(min=2, help="Highest cohort cosines per face that give its mean and spread.")] = TOP,
    share: Annotated[
        float, typer.Option(min=0.01, max=0.99, help="Share of the identities that become the cohort; the others calibrate.")
    ] = COHORT_SHARE,
    seed: Annotated[int, typer.Option(help="Seed of the identities' draw.")] = 0,
) -> None:
    """Split the identities into a cohort and calibration identities, embed both as the service
    does, and fit the FAR curve of AS-norm scores from the calibration identities' impostor pairs."""
    from training.cohort_builder import build, write
    from training.data.datasets import open_source
    from training.pair_evaluation import OnnxEmbedder
    from training.thresholds import embed_source

    try:
        embedder = OnnxEmbedder(model.with_suffix(".json"), get_settings())
        embeddings, labels = embed_source(embedder, open_source(data, embedder.model.manifest.input.height))
        cohort, curve, figures = build(embeddings, labels, top, share, seed)
        manifest = write(
            out,
            embedder.model.manifest,
            cohort,
            curve,
            top,
            figures,
            {"data": str(data), "share": share, "seed": seed},
            {"name": license_name, **({"terms": license_terms} if license_terms else {})},
        )
    except (ModelError, ValueError, OSError) as exc:
        fail(exc)
    console.print(
        f"[green]ok[/green] cohort of {figures['cohort_faces']} faces ({figures['cohort_identities']} identities), top {top}; "
        f"calibrated on {figures['impostor_pairs']:,} impostor pairs of {figures['calibration_identities']} other identities "
        f"down to FAR {manifest.far_curve.points[-1][0]:g} → {out.with_suffix('.json')}"
    )
