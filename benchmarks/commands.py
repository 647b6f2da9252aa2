"""`facegate bench`, registered on the `facegate` command through the `facegate.cli` entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from service.core.console import fail_on_error
from service.core.pipeline import FacePipeline
from service.core.settings import get_settings

bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")


@bench_app.command("pipeline")
def bench_pipeline(
    images: Annotated[
        list[Path] | None, typer.Argument(help="Images to use (default: synthetic faces are not meaningful; pass real photos).")
    ] = None,
    seconds: Annotated[float, typer.Option(help="Time budget per stage.")] = 3.0,
) -> None:
    """Decode, detect, align and embed throughput on the active provider."""
    from benchmarks.bench import run_pipeline_bench

    with fail_on_error():
        pipeline = FacePipeline.from_settings(get_settings(), require_embedder=False)
    run_pipeline_bench(pipeline, images or [], seconds, Console())


@bench_app.command("all")
def bench_all(
    images: Annotated[
        list[Path],
        typer.Argument(exists=True, dir_okay=False, help="Photos with faces, e.g. LFW's (decoded, detected, aligned, and sent over HTTP)."),
    ],
    embedder: Annotated[str | None, typer.Option(help="Embedder manifest (default FACEGATE_EMBEDDER).")] = None,
    seconds: Annotated[float, typer.Option(help="Time budget per stage and per batch size.")] = 3.0,
    batch: Annotated[list[int] | None, typer.Option(help="Embed batch sizes, repeatable (default 1 2 4 … 128).")] = None,
    concurrency: Annotated[
        list[int] | None, typer.Option(help="HTTP concurrencies, repeatable (default 1 8 32 64); 0 skips the HTTP load.")
    ] = None,
    requests: Annotated[int, typer.Option(min=1, help="Requests per route and concurrency.")] = 200,
) -> None:
    """The whole table: machine, versions, providers; pipeline stages; embed batch scaling (bare
    session against the pipeline's embed stage); HTTP load on /verify and /identify."""
    from benchmarks.bench import run_all

    settings = get_settings()
    if embedder:
        settings = settings.model_copy(update={"embedder": embedder})
    levels = tuple(c for c in (concurrency or [1, 8, 32, 64]) if c > 0)
    with fail_on_error():
        run_all(
            settings,
            images,
            Console(width=max(Console().width, 120)),
            seconds,
            tuple(batch or (1, 2, 4, 8, 16, 32, 64, 128)),
            levels,
            requests,
        )
