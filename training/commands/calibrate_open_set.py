"""`facegate calibrate-open-set`: the margin score's table T_sim(N, FPIR), and the best cosine's for
small galleries, into an embedder's manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from service.core.console import console, fail
from service.core.errors import ModelError
from service.core.models.manifest import Template
from service.core.settings import get_settings

SHOWN_FPIRS = (1e-1, 1e-2, 1e-3)


def calibrate_open_set(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="An embedder's manifest (.json) or its .onnx.")],
    data: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="Aligned identity folders the model never trained on (`facegate align --template` the model's; "
            "default: its run's held-out identities).",
        ),
    ] = None,
    faces: Annotated[
        list[int] | None, typer.Option(min=1, help="Faces enrolled per subject, one table each (repeat; default: --faces 1 --faces 3).")
    ] = None,
    cosine_faces: Annotated[
        list[int] | None,
        typer.Option(min=1, help="Faces per subject of the cosine rows for small galleries (repeat; default: 1, 3, 5 and 10)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the galleries' draws: the same seed, data and model give the same table.")] = 0,
    samples: Annotated[int, typer.Option(min=1000, help="Stranger scores per gallery size (more: finer FPIRs, longer).")] = 200_000,
    cache: Annotated[Path | None, typer.Option(help="Folder keeping the embeddings for the next run (keyed by model and images).")] = Path(
        "~/.cache/facegate/embeddings"
    ),
    dry_run: Annotated[bool, typer.Option(help="Print the table without writing it into the manifest.")] = False,
    cosine_only: Annotated[
        bool,
        typer.Option(help="Keep the manifest's margin rows; calibrate only the cosine rows for small galleries (--faces unused)."),
    ] = False,
    template: Annotated[
        Template,
        typer.Option(help="What a subject's cosine in the cosine rows is against: its best face, or the mean of its faces (docs/api.md)."),
    ] = "best_face",
    cosine_below: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Galleries of fewer subjects are decided on the cosine rows, larger ones on the margin score "
            "(default: 31, a home's 1-30 people; docs/api.md).",
        ),
    ] = None,
    embeddings: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="The calibration identities embedded already (.npz of embeddings and labels, as --cache keeps them; "
            "an 'origin' entry names their source) instead of --data.",
        ),
    ] = None,
) -> None:
    """Draw galleries of N calibration identities, score every other identity's photos as strangers
    by the margin score, and store each N's thresholds per FPIR in the manifest (`open_set`)."""
    from training.open_set_table import COSINE_BELOW, COSINE_FACES, calibrate

    manifest_path = model.with_suffix(".json")

    def progress(per_subject: int, size: int, draws) -> None:
        console.print(
            f"{per_subject} face(s) per subject, {size} subjects: {len(draws.scores):,} stranger scores from {draws.galleries} galleries"
        )

    try:
        table, origin = calibrate(
            manifest_path,
            get_settings(),
            data,
            sorted(set(faces or (1, 3))),
            seed,
            samples,
            cache,
            not dry_run,
            progress,
            sorted(set(cosine_faces or COSINE_FACES)),
            cosine_only,
            template,
            embeddings,
            cosine_below or COSINE_BELOW,
        )
    except (ModelError, ValueError, OSError) as exc:
        fail(exc)
    columns = [j for j, q in enumerate(table.fpirs) if q in SHOWN_FPIRS]
    for rows, score in [(rows, "margin score") for rows in table.tables] + [
        (rows, f"best cosine ({table.cosine_template})") for rows in table.cosine_tables
    ]:
        shown = Table(
            "subjects",
            *(f"T @ fpir {table.fpirs[j]:g}" for j in columns),
            "strangers scored",
            title=f"{score}, {rows.faces_per_subject} face(s) per subject",
        )
        for size, thresholds, count in zip(rows.subjects, rows.thresholds, rows.samples, strict=True):
            shown.add_row(f"{size:,}", *(f"{thresholds[j]:.6f}" for j in columns), f"{count:,}")
        console.print(shown)
    report = (table.calibration["cosine_rows"] if cosine_only else table.calibration)["left_out_as_one_person"]
    console.print(
        f"calibrated on the {origin}; {report['identity_pairs']} identity pairs left out as one person"
        + ("" if dry_run else f"; table written to {manifest_path}")
    )
