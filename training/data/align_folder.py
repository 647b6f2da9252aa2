"""`facegate align SRC DST`: raw photos in identity folders → aligned JPEG identity folders (training's
112×112 template, or another model's, e.g. to calibrate an imported embedder),
through the service's own decode → detect → align, so training sees faces exactly as serving does.

Resumable: a source image whose aligned file exists, or that the report already lists, is skipped.
`DST/manifest.csv` lists every aligned crop; `DST/no_face.csv` every image that gave none (no face
or unreadable), so nothing is dropped silently. Each worker process builds its own pipeline
(onnxruntime sessions are not picklable).
"""

from __future__ import annotations

import csv
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import cv2

from service.core.console import progress_bar
from service.core.errors import FacegateError
from service.core.fileio import write_atomically
from service.core.settings import Settings
from training.data.folders import list_identity_folders
from training.data.preprocess import ALIGNMENT

if TYPE_CHECKING:
    from service.core.pipeline import FacePipeline

MANIFEST = "manifest.csv"
REPORT = "no_face.csv"
MANIFEST_FIELDS = ["identity", "file", "source_file", "det_score", "box_w", "box_h"]
REPORT_FIELDS = ["identity", "source_file", "reason"]
JPEG_QUALITY = 95

_pipeline: FacePipeline | None = None  # each worker's, set by _init_worker


@dataclass(frozen=True)
class Result:
    identity: str
    source: str
    file: str | None  # None: no face; see reason
    reason: str = ""
    det_score: float = 0.0
    box_w: float = 0.0
    box_h: float = 0.0


@dataclass(frozen=True)
class Summary:
    aligned: int
    no_face: int
    skipped: int


def _init_worker(settings: Settings) -> None:
    global _pipeline
    from service.core.pipeline import FacePipeline

    cv2.setNumThreads(1)
    _pipeline = FacePipeline.from_settings(settings, require_embedder=False)


def _align_one(src_root: Path, dst_root: Path, identity: str, path: Path, template: str) -> Result:
    source = str(path.relative_to(src_root))
    pipeline = _pipeline
    assert pipeline is not None, "_align_one runs in a worker _init_worker set up"
    try:
        image = pipeline.decode(path.read_bytes())
        faces = pipeline.detect(image)
    except FacegateError as exc:
        return Result(identity, source, None, f"unreadable: {exc}")
    if not faces:
        return Result(identity, source, None, "no face detected")
    face = faces[0]  # the detector sorts largest first
    crop_rgb = pipeline.align(image, [face], template)[0]
    rel = Path(identity) / f"{path.stem}.jpg"
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(crop_rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    write_atomically(dst_root / rel, encoded.tobytes(), durable=False)
    return Result(identity, source, str(rel), det_score=round(face.score, 4), box_w=round(face.width, 1), box_h=round(face.height, 1))


def _read_column(path: Path, column: str) -> set[str]:
    if not path.is_file():
        return set()
    with open(path, newline="") as fh:
        return {row[column] for row in csv.DictReader(fh)}


def _appender(path: Path, fields: list[str]):
    new = not path.is_file()
    fh = open(path, "a", newline="")
    writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
    if new:
        writer.writeheader()
    return fh, writer


def align_folder(src: Path, dst: Path, settings: Settings, workers: int = 1, progress: bool = True, template: str = ALIGNMENT) -> Summary:
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    done = _read_column(dst / MANIFEST, "source_file") | _read_column(dst / REPORT, "source_file")
    todo, skipped = [], 0
    for identity, images in list_identity_folders(src):
        for path in images:
            if str(path.relative_to(src)) in done:
                skipped += 1
            else:
                todo.append((identity, path))
    aligned = no_face = 0
    manifest_fh, manifest = _appender(dst / MANIFEST, MANIFEST_FIELDS)
    report_fh, report = _appender(dst / REPORT, REPORT_FIELDS)
    with (
        manifest_fh,
        report_fh,
        progress_bar("align", len(todo), enabled=progress) as advance,
        ProcessPoolExecutor(
            max_workers=max(1, workers),
            # spawn, not fork: a fork of a process whose thread pools (torch, onnxruntime) are running can deadlock
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(settings,),
        ) as pool,
    ):
        futures = [pool.submit(_align_one, src, dst, identity, path, template) for identity, path in todo]
        for future in futures:
            result = future.result()
            if result.file is None:
                report.writerow({"identity": result.identity, "source_file": result.source, "reason": result.reason})
                no_face += 1
            else:
                manifest.writerow({**asdict(result), "source_file": result.source})
                aligned += 1
            advance(1)
    return Summary(aligned, no_face, skipped)
