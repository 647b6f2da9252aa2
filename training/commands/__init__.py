"""The training commands of `facegate`, one module per command (registered by `training.cli`).
Each imports torch inside its command, so registering them costs `facegate serve` nothing."""

import contextlib

import typer
from rich.console import Console

console = Console(stderr=True)


def fail(message: object) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)


@contextlib.contextmanager
def progress_bar(label: str, total: int, enabled: bool = True):
    """A rich progress bar on stderr; yields `advance(n)` (a no-op when disabled)."""
    if not enabled:
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.update(task, advance=n)
