"""`facegate align`: raw photos → aligned crops, with the service's detector and alignment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from service.core.alignment import TEMPLATES
from service.core.console import console, fail
from service.core.settings import get_settings
from training.data.align_folder import REPORT, align_folder


def align(
    src: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Raw photos: SRC/<identity>/*.jpg")],
    dst: Annotated[Path, typer.Argument(file_okay=False, help="Aligned crops: DST/<identity>/*.jpg")],
    workers: Annotated[int, typer.Option(help="Worker processes, each with its own detector.")] = 2,
    template: Annotated[
        str, typer.Option(help="Alignment template (a manifest's `alignment`): arcface_112 (112×112, training's) or dlib_150.")
    ] = "arcface_112",
) -> None:
    """Detect, align and crop the largest face of every photo, as the service does (resumable)."""
    if template not in TEMPLATES:
        fail(f"unknown template {template!r}; one of {', '.join(TEMPLATES)}")
    summary = align_folder(src, dst, get_settings(), workers=workers, template=template)
    console.print(f"aligned {summary.aligned}, no face {summary.no_face} (listed in {dst / REPORT}), already done {summary.skipped}")
