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
    workers: Annotated[
        list[int] | None, typer.Option(help="HTTP load rows for `facegate serve --workers N`, repeatable (default 1: one process).")
    ] = None,
    model_host: Annotated[bool, typer.Option(help="With --workers above 1: the models in one model host (else in each worker).")] = True,
    gallery_faces: Annotated[int, typer.Option(min=0, help="Random faces added to the gallery /identify searches.")] = 0,
    load_seconds: Annotated[float, typer.Option(min=0, help="Seconds of load per route and concurrency, instead of --requests.")] = 0,
) -> None:
    """The whole table: machine, versions, providers; pipeline stages; embed batch scaling (bare
    session against the pipeline's embed stage); HTTP load on /verify and /identify, per way of serving."""
    from benchmarks.bench import run_all
    from benchmarks.loadtest import Serving

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
            servings=tuple(Serving(w, model_host) for w in (workers or [1])),
            gallery_faces=gallery_faces,
            load_seconds=load_seconds,
        )


@bench_app.command("load")
def bench_load(
    images: Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, help="Photos with faces, sent in the requests.")],
    url: Annotated[str | None, typer.Option(help="A running server (default: spawn one of this checkout per --workers).")] = None,
    route: Annotated[
        list[str] | None, typer.Option(help="verify, identify or healthz (what the generator offers), repeatable (default verify).")
    ] = None,
    concurrency: Annotated[list[int] | None, typer.Option(help="Connections, repeatable (default 1 8 64).")] = None,
    requests: Annotated[int, typer.Option(min=1, help="Requests per route and concurrency.")] = 2000,
    processes: Annotated[int, typer.Option(min=0, help="Load processes (0: a quarter of the cores, at most the concurrency).")] = 0,
    workers: Annotated[list[int] | None, typer.Option(help="Spawned servers' --workers, repeatable (default 1).")] = None,
    model_host: Annotated[bool, typer.Option(help="Spawned with --workers above 1: the models in one model host.")] = True,
    gallery_faces: Annotated[int, typer.Option(min=0, help="Spawned: random faces added to the gallery /identify searches.")] = 0,
    api_key: Annotated[str | None, typer.Option(envvar="FACEGATE_LOAD_API_KEY", help="X-API-Key for --url.")] = None,
    seconds: Annotated[float, typer.Option(min=0, help="Seconds of load per route and concurrency, instead of --requests.")] = 0,
) -> None:
    """HTTP load from several processes over raw keep-alive connections (thousands of requests/s,
    where a Python HTTP client would measure itself): req/s and latency per route and concurrency."""
    from benchmarks.bench import load_table, machine_lines
    from benchmarks.loadtest import Serving, matrix

    console = Console(width=max(Console().width, 120))
    for line in machine_lines():
        console.print(line)
    blobs = [p.read_bytes() for p in images[:64]]
    routes, levels = route or ["verify"], concurrency or [1, 8, 64]
    if url is None:
        settings = get_settings()
        with fail_on_error():
            from service.core.models.manifest import EmbedderKey

            key = EmbedderKey.of(FacePipeline.from_settings(settings).require_embedder().manifest) if gallery_faces else None
            servings = tuple(Serving(w, model_host) for w in (workers or [1]))
            console.print(load_table(settings, blobs, servings, routes, levels, requests, gallery_faces, key, processes, seconds))
        return
    for r in matrix(url, blobs, routes, levels, requests, api_key=api_key, processes=processes, seconds=seconds):
        console.print(f"{r.route} c{r.concurrency}: {r.rps:.1f} req/s, p50 {r.p50:.1f} p95 {r.p95:.1f} p99 {r.p99:.1f} ms ", end="")
        console.print(f"({r.status_text()}; {r.processes} load processes)")


@bench_app.command("cpu-budget")
def bench_cpu_budget(
    images: Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, help="Photos with faces, sent in the requests.")],
    workers: Annotated[int, typer.Option(min=2, help="`facegate serve --workers N` (with its model host).")] = 2,
    route: Annotated[list[str] | None, typer.Option(help="verify or identify, repeatable (default both).")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Connections offering the load.")] = 8,
    requests: Annotated[int, typer.Option(min=1, help="Requests per route.")] = 200,
    control: Annotated[bool, typer.Option(help="Also load a server with no function wrapped: the totals without the probe.")] = True,
) -> None:
    """CPU per image in worker mode: µs per stage and per process crossing, in each HTTP worker,
    decoder process and the model host, and the bytes copied per image."""
    from benchmarks.cpu_budget import run_cpu_budget

    with fail_on_error():
        run_cpu_budget(
            get_settings(),
            images,
            Console(width=max(Console().width, 140)),
            workers,
            tuple(route or ["verify", "identify"]),
            concurrency,
            requests,
            control,
        )
