"""`facegate calibrate`: an exported model's thresholds per FAR, into its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from service.core.console import console, fail
from service.core.errors import ModelError
from service.core.settings import get_settings


def calibrate(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="An exported model's manifest (.json) or its .onnx.")],
    data: Annotated[
        Path | None, typer.Option(help="Aligned identity folders the model never trained on (default: its run's held-out identities).")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the thresholds without writing them into the manifest.")] = False,
) -> None:
    """Cosine thresholds for FAR 1e-2 … 1e-5 from impostor pairs of unseen identities, into the manifest."""
    from training.thresholds import FEW_IDENTITIES
    from training.thresholds import calibrate as run

    manifest_path = model.with_suffix(".json")
    try:
        result, origin = run(manifest_path, get_settings(), data, write=not dry_run)
    except (ModelError, ValueError, OSError) as exc:
        fail(exc)
    table = Table(
        "FAR",
        "threshold",
        "realized FAR",
        "TAR",
        title=f"{result.identities} identities, {result.images} images: "
        f"{result.impostor_pairs:,} impostor / {result.genuine_pairs:,} genuine pairs",
    )
    for key, t in result.thresholds.items():
        r = result.realized[key]
        table.add_row(key, f"{t:.6f}", f"{r['far']:.2e}", "—" if r["tar"] is None else f"{r['tar']:.4f}")
    for key, why in result.omitted.items():
        table.add_row(key, "omitted", why, "")
    Console().print(table)
    near = result.near_copy
    console.print(
        "near copies (the recall check's): "
        + (
            "none nearer than unrelated faces: no bound"
            if near is None
            else f"from cosine {near.cosine:g} ({near.copies_reaching:.0%} of the copies, "
            f"{near.genuine_pairs_reaching:.1%} of the genuine pairs)"
        )
    )
    console.print(f"calibrated on the {origin}" + ("" if dry_run else f"; thresholds and near-copy bound written to {manifest_path}"))
    if result.identities < FEW_IDENTITIES:
        console.print(
            f"[yellow]warning:[/yellow] only {result.identities} identities: thresholds from so few people are noisy and will not "
            f"hold for strangers. Calibrate on at least {FEW_IDENTITIES} (a few dozen or more) people the model never trained on: "
            "--data ALIGNED_FOLDERS, or train with a larger data.val_fraction."
        )
