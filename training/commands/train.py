"""`facegate train`, and `python -m training` (what torchrun runs on every rank)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from service.core.console import console, fail
from service.core.settings import get_settings
from training.config import load_config

Sets = Annotated[list[str] | None, typer.Option("--set", help="Override a config value: key.sub=value (YAML value). Repeatable.")]


def train(
    config: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Training config (YAML).")],
    set_: Sets = None,
    resume: Annotated[Path | None, typer.Option(help="Checkpoint to continue from (e.g. OUTPUT/last.pt).")] = None,
    nproc: Annotated[int, typer.Option(help="Processes on this node; > 1 relaunches under torchrun.")] = 1,
) -> None:
    """Train a backbone and head from a config."""
    if nproc > 1:
        args = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m", "training", str(config)]
        args += [a for s in set_ or [] for a in ("--set", s)] + (["--resume", str(resume)] if resume else [])
        raise typer.Exit(subprocess.call(args))
    _train(config, set_ or [], resume)


def _train(config: Path, sets: list[str], resume: Path | None) -> None:
    import torch.distributed as dist

    from training.data.datasets import DataSplitError
    from training.trainer import train as run

    try:
        cfg = load_config(config, sets)
    except (ValidationError, ValueError) as exc:
        fail(exc)
    try:
        result = run(cfg, get_settings(), resume=resume)
    except DataSplitError as exc:
        fail(exc)
    finally:
        rank = dist.get_rank() if dist.is_initialized() else 0
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        last = result.losses[-1] if result.losses else float("nan")
        console.print(f"done: step {result.step}, last loss {last:.4f}, best validation accuracy {result.best}")


def train_main() -> None:
    """Entry point of `python -m training` (what torchrun runs on every rank)."""
    typer.run(_torchrun_entry)


def _torchrun_entry(
    config: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    set_: Sets = None,
    resume: Annotated[Path | None, typer.Option()] = None,
) -> None:
    _train(config, set_ or [], resume)
