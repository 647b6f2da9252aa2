"""The training commands of `facegate`, one module per command (registered by `training.cli`).
Each imports torch inside its command, so registering them costs `facegate serve` nothing."""

import typer
from rich.console import Console

console = Console(stderr=True)


def fail(message: object) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)
