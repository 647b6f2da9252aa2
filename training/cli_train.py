"""`facegate align | train | eval | export | calibrate | model-info`. torch is imported inside the commands, so
registering them costs `facegate serve` nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

console = Console(stderr=True)

Sets = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config value: key.sub=value (YAML value). Repeatable.")]


def _fail(message: object) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)


def align(
    src: Annotated[Path, typer.Argument(exists=True, file_okay=False, help="Raw photos: SRC/<identity>/*.jpg")],
    dst: Annotated[Path, typer.Argument(file_okay=False, help="Aligned 112×112 crops: DST/<identity>/*.jpg")],
    workers: Annotated[int, typer.Option(help="Worker processes, each with its own detector.")] = 2,
) -> None:
    """Detect, align and crop the largest face of every photo, as the service does (resumable)."""
    from service.settings import get_settings
    from training.data.align_folder import REPORT, align_folder

    summary = align_folder(src, dst, get_settings(), workers=workers)
    console.print(f"aligned {summary.aligned}, no face {summary.no_face} (listed in {dst / REPORT}), already done {summary.skipped}")


def train(
    config: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Training config (YAML).")],
    set_: Sets = None,
    resume: Annotated[Optional[Path], typer.Option(help="Checkpoint to continue from (e.g. OUTPUT/last.pt).")] = None,
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
    from pydantic import ValidationError

    from training.config import load_config
    from training.train import train as run

    try:
        cfg = load_config(config, sets)
    except (ValidationError, ValueError) as exc:
        _fail(exc)
    try:
        result = run(cfg, resume=resume)
    finally:
        rank = dist.get_rank() if dist.is_initialized() else 0
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        last = result.losses[-1] if result.losses else float("nan")
        console.print(f"done: step {result.step}, last loss {last:.4f}, best validation accuracy {result.best}")


def eval_(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="A checkpoint (.pt) or an exported model's manifest (.json/.onnx).")],
    pairs: Annotated[Optional[Path], typer.Option(help="LFW-layout pairs.txt (with --images).")] = None,
    images: Annotated[Optional[Path], typer.Option(help="LFW-layout image folder: NAME/NAME_0001.jpg.")] = None,
    bin_: Annotated[Optional[Path], typer.Option("--bin", help="InsightFace verification .bin.")] = None,
    csv: Annotated[Optional[Path], typer.Option(help="CSV with path1,path2,issame (paths relative to it).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write the JSON results here too.")] = None,
    roc: Annotated[Optional[Path], typer.Option(help="ROC curve PNG.")] = None,
    cache: Annotated[Path, typer.Option(help="Cache of aligned evaluation crops.")] = Path("~/.cache/facegate/eval"),
    record: Annotated[bool, typer.Option(help="Store the results in the exported model's manifest metrics.")] = False,
) -> None:
    """Verification accuracy (10-fold), AUC, EER, TAR@FAR, with and without flip-TTA, as JSON; for an
    exported model also the FAR and TAR its calibrated thresholds realize on these pairs."""
    from training.evaluate import evaluate, load_bin, load_csv, load_embedder, load_lfw

    if sum(x is not None for x in (pairs, bin_, csv)) != 1 or (pairs is not None) != (images is not None):
        _fail("give exactly one of: --pairs with --images, --bin, --csv")
    cache = cache.expanduser()
    if bin_ is not None:
        vset = load_bin(bin_)
    else:
        from service.errors import ModelError
        from service.pipeline import FacePipeline
        from service.settings import get_settings

        try:
            pipeline = FacePipeline.from_settings(get_settings(), require_embedder=False)
        except ModelError as exc:
            _fail(exc)
        vset = load_lfw(pairs, images, pipeline, cache) if pairs else load_csv(csv, pipeline, cache)
    embedder, kind = load_embedder(model)
    if record and kind != "onnx":
        _fail("--record needs an exported model (its .json manifest)")
    thresholds = embedder.model.manifest.thresholds if kind == "onnx" else None
    metrics = evaluate(embedder, vset, roc, thresholds)
    results = {"model": str(model), "kind": kind, **metrics}
    if record:
        from service.models.manifest import Manifest

        manifest_path = model.with_suffix(".json")
        manifest = Manifest.load(manifest_path)
        manifest.metrics = {**manifest.metrics, **metrics}
        manifest.save(manifest_path)
    text = json.dumps(results, indent=2)
    if out:
        out.write_text(text + "\n")
    typer.echo(text)


def export(
    checkpoint: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option(help="models/NAME.onnx; the manifest goes to models/NAME.json.")],
    fp16: Annotated[bool, typer.Option(help="float16 weights and arithmetic (float32 input and output).")] = False,
    flip_tta: Annotated[bool, typer.Option(help="Embed each crop plus its mirror inside the model (twice the compute).")] = False,
    opset: Annotated[int, typer.Option(help="ONNX opset (≥ 17).")] = 17,
    eval_: Annotated[Optional[Path], typer.Option("--eval", help="Results JSON of `facegate eval --out`, recorded in the manifest.")] = None,
    license_name: Annotated[Optional[str], typer.Option(help="License name for the manifest (default: the config's data.license).")] = None,
    license_terms: Annotated[Optional[str], typer.Option(help="Usage terms, e.g. 'research, non-commercial'.")] = None,
    version: Annotated[Optional[str], typer.Option(help="Manifest version (default: backbone-head-stepN).")] = None,
) -> None:
    """Export the backbone to ONNX, check parity with onnxruntime, write the manifest."""
    from training.export import ExportError, export as run

    license = {"name": license_name, **({"terms": license_terms} if license_terms else {})} if license_name else None
    metrics = json.loads(eval_.read_text()) if eval_ else None
    try:
        manifest = run(checkpoint, out, fp16=fp16, flip_tta=flip_tta, opset=opset, metrics=metrics, license=license, version=version)
    except ExportError as exc:
        _fail(exc)
    console.print(f"[green]ok[/green] {out} (parity cosine ≥ {manifest.provenance['export']['parity_min_cosine']}) + {out.with_suffix('.json')}")


def calibrate(
    model: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="An exported model's manifest (.json) or its .onnx.")],
    data: Annotated[Optional[Path], typer.Option(help="Aligned identity folders the model never trained on (default: its run's held-out identities).")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the thresholds without writing them into the manifest.")] = False,
) -> None:
    """Cosine thresholds for FAR 1e-2 … 1e-5 from impostor pairs of unseen identities, into the manifest."""
    from rich.table import Table

    from service.errors import ModelError
    from training.calibrate import calibrate as run

    manifest_path = model.with_suffix(".json")
    try:
        result, origin = run(manifest_path, data, write=not dry_run)
    except (ModelError, ValueError, OSError) as exc:
        _fail(exc)
    table = Table("FAR", "threshold", "realized FAR", "TAR", title=f"{result.identities} identities, {result.images} images: "
                  f"{result.impostor_pairs:,} impostor / {result.genuine_pairs:,} genuine pairs")
    for key, t in result.thresholds.items():
        r = result.realized[key]
        table.add_row(key, f"{t:.6f}", f"{r['far']:.2e}", "—" if r["tar"] is None else f"{r['tar']:.4f}")
    for key, why in result.omitted.items():
        table.add_row(key, "omitted", why, "")
    Console().print(table)
    console.print(f"calibrated on the {origin}" + ("" if dry_run else f"; thresholds written to {manifest_path}"))


def model_info(
    names: Annotated[Optional[list[str]], typer.Argument(help="Backbones (default: all).")] = None,
    dim: Annotated[int, typer.Option(help="Embedding dimension.")] = 512,
) -> None:
    """Parameters and GFLOPs (multiply-accumulates, as arcface_torch counts) at 112×112."""
    from rich.table import Table

    from training.backbones import BACKBONES, model_info as info

    table = Table("backbone", "params (M)", "GFLOPs (GMACs)", "FLOPs ×2 (G)")
    for name in names or BACKBONES:
        try:
            i = info(name, dim)
        except ValueError as exc:
            _fail(exc)
        table.add_row(name, f"{i.params / 1e6:.2f}", f"{i.gmacs:.3f}", f"{i.flops / 1e9:.3f}")
    Console().print(table)


def register_train_commands(app: typer.Typer) -> None:
    app.command("align")(align)
    app.command("train")(train)
    app.command("eval")(eval_)
    app.command("export")(export)
    app.command("calibrate")(calibrate)
    app.command("model-info")(model_info)


def train_main() -> None:
    """Entry point of `python -m training` (what torchrun runs on every rank)."""
    typer.run(_torchrun_entry)


def _torchrun_entry(
    config: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    set_: Sets = None,
    resume: Annotated[Optional[Path], typer.Option()] = None,
) -> None:
    _train(config, set_ or [], resume)
