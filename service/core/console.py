"""The one console of the `facegate` command, the service's subcommands and training's alike:
messages on stderr, each one line whatever the terminal's width; the one way a command fails (a red
line and exit status 2, never a traceback); the one progress bar of a long step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from service.core.errors import FacegateError

console = Console(stderr=True, soft_wrap=True)


def fail(message: object) -> NoReturn:
    console.print(f"[red]error:[/red] {escape(str(message))}")
    raise typer.Exit(2) from None


@contextmanager
def fail_on_error() -> Iterator[None]:
    """Bad input or an unusable model (any FacegateError) fails the command with its message."""
    try:
        yield
    except FacegateError as exc:
        fail(exc)


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Callable[[int], object]]:
    """A rich progress bar on stderr; yields `advance(n)` (a no-op when disabled). Where stderr is not
    a terminal (a log file, CI, `nohup`), where a bar would show nothing until the end, a plain line
    every tenth of the way instead, with the elapsed time."""
    if not enabled:
        yield lambda n: None
        return
    if not console.is_terminal:
        yield _ProgressLines(label, total)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.update(task, advance=n)


class _ProgressLines:
    """`advance(n)` that prints `label: done/total (p%), elapsed` each time another tenth is passed."""

    def __init__(self, label: str, total: int):
        self.label, self.total = label, max(total, 1)
        self.done = self.shown = 0
        self.start = time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        tenth = min(10, self.done * 10 // self.total)
        if tenth > self.shown:
            self.shown = tenth
            elapsed = time.monotonic() - self.start
            console.print(f"{escape(self.label)}: {self.done:,}/{self.total:,} ({tenth * 10}%), {elapsed:.0f} s", highlight=False)
