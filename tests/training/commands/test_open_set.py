"""`facegate eval-open-set` on a small real open set (LFW photos, FACEGATE_TEST_DATA): the protocol,
the decision the service makes, and its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from service.core.models.manifest import Manifest
from tests.conftest import REPO
from training.commands import register
from training.identification import best_subjects, protocol

pytestmark = pytest.mark.data


def test_protocol_and_ranking(tmp_path):
    for name, count in (("a", 3), ("b", 2), ("c", 1), ("d", 1)):
        (tmp_path / name).mkdir()
        for i in range(count):
            (tmp_path / name / f"{name}_{i}.jpg").write_bytes(b"")
    p = protocol(tmp_path, enroll=1)
    assert [x.name for x in p.gallery] == ["a_0.jpg", "b_0.jpg"] and [x.name for x in p.known] == ["a_1.jpg", "b_1.jpg"]
    assert [x.name for x in p.strangers] == ["c_0.jpg", "d_0.jpg"] and list(p.gallery_labels) == list(p.known_labels) == [0, 1]
    gallery = np.eye(3)[:2]
    labels, scores = best_subjects(gallery, np.array([7, 9]), np.array([[0.1, 0.9, 0], [0.8, 0.6, 0]]))
    assert list(labels) == [9, 7] and list(scores) == [0.9, 0.8]


def test_lfw_open_set_through_the_service_decision(test_data, model_cache, tmp_path, monkeypatch):
    from service.core.settings import get_settings

    people = sorted(p for p in (test_data / "lfw").iterdir() if p.is_dir())
    several = [p for p in people if len(list(p.glob("*.jpg"))) >= 2][:25]
    single = [p for p in people if len(list(p.glob("*.jpg"))) == 1][:15]
    folder = tmp_path / "people"
    for person in several + single:
        (folder / person.name).mkdir(parents=True)
        for photo in sorted(person.glob("*.jpg"))[:2]:
            (folder / person.name / photo.name).symlink_to(photo)
    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(model_cache))
    monkeypatch.setenv("FACEGATE_DEVICE", "cpu")
    get_settings.cache_clear()
    app = typer.Typer()
    register(app)
    out, det = tmp_path / "open.json", tmp_path / "det.png"
    result = CliRunner().invoke(
        app,
        [
            "eval-open-set",
            str(REPO / "models" / "dlib-resnet-v1.json"),
            "--images",
            str(folder),
            "--out",
            str(out),
            "--det",
            str(det),
            "--cache",
            str(tmp_path / "cache"),
            "--no-progress",
        ],
    )
    get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert (report["enrolled_subjects"], report["gallery_faces"], report["known_probes"], report["stranger_probes"]) == (25, 25, 25, 15)
    rows = {row["fpir"]: row for row in report["rows"]}
    assert set(rows) == {0.1, 0.01, 0.001} and rows[0.01]["default"]
    thresholds = [rows[r]["threshold"] for r in (0.1, 0.01, 0.001)]
    assert thresholds == sorted(thresholds)  # a smaller FPIR, a stricter threshold
    # each between the manifest's calibrated thresholds around its per-comparison FAR, 1 − (1 − fpir)^(1/25)
    calibrated = Manifest.load(REPO / "models" / "dlib-resnet-v1.json").thresholds
    for fpir, (looser, stricter) in {0.1: ("1e-2", "1e-3"), 0.01: ("1e-3", "1e-4"), 0.001: ("1e-4", "1e-5")}.items():
        assert calibrated[looser] <= rows[fpir]["threshold"] <= calibrated[stricter], fpir
    # the same open set identified here by brute force: every probe against every enrolled face
    gallery, known, strangers = (_embeddings(model_cache, [p / photo for p, photo in group]) for group in _open_set(several, single))
    cosines = known @ gallery.T
    right = cosines.argmax(axis=1) == np.arange(len(several))
    assert report["rank1"] == pytest.approx(right.mean())
    for fpir, row in rows.items():
        found = right & (cosines.max(axis=1) >= row["threshold"])
        accepted = (strangers @ gallery.T).max(axis=1) >= row["threshold"]
        assert (row["dir"], row["realized_fpir"]) == pytest.approx((found.mean(), accepted.mean())), fpir
    assert det.stat().st_size > 10_000


def _open_set(several: list[Path], single: list[Path]) -> tuple[list, list, list]:
    """(person folder, photo) of the gallery, the known probes and the strangers, as the protocol's
    docstring states it: the first photo of each person with several enrolls, the second probes."""
    first_two = {p: sorted(x.name for x in p.glob("*.jpg"))[:2] for p in several}
    return (
        [(p, first_two[p][0]) for p in several],
        [(p, first_two[p][1]) for p in several],
        [(p, next(p.glob("*.jpg")).name) for p in single],
    )


def _embeddings(model_cache: Path, photos: list[Path]) -> np.ndarray:
    """Unit embeddings through the service's own pipeline (the largest face, as the command aligns)."""
    from service.core.pipeline import FacePipeline
    from service.core.settings import Settings

    pipeline = FacePipeline.from_settings(Settings(model_cache=model_cache, device="cpu", embedder="dlib-resnet-v1"))
    chips = []
    for photo in photos:
        image = pipeline.decode(photo.read_bytes())
        faces = pipeline.detect(image)
        assert faces, f"{photo}: no face (the command would align it on the median landmarks)"
        chips.append(pipeline.align(image, faces[:1])[0])
    return pipeline.embedder.embed(np.stack(chips))
