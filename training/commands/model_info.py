"""`facegate model-info`: backbone sizes and compute."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from service.core.console import fail
from service.core.settings import get_settings


def model_info(
    names: Annotated[list[str] | None, typer.Argument(help="Backbones (default: all).")] = None,
    dim: Annotated[int, typer.Option(help="Embedding dimension.")] = 512,
) -> None:
    """Parameters and GFLOPs (multiply-accumulates, as arcface_torch counts) at 112×112."""
    from training.backbones import BACKBONES
    from training.backbones import model_info as info

    settings = get_settings()
    table = Table("backbone", "params (M)", "GFLOPs (GMACs)", "FLOPs ×2 (G)")
    for name in names or BACKBONES:
        try:
            i = info(name, settings, dim)
        except ValueError as exc:
            fail(exc)
        table.add_row(name, f"{i.params / 1e6:.2f}", f"{i.gmacs:.3f}", f"{i.flops / 1e9:.3f}")
    Console().print(table)
