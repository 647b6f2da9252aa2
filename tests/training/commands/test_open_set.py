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
    swapped = protocol(tmp_path, enroll=1, swap=True)  # the second split: enrolled by the second photo, probing with the first
    assert [x.name for x in swapped.gallery] == ["a_1.jpg", "b_1.jpg"] and [x.name for x in swapped.known] == ["a_0.jpg", "b_0.jpg"]
    three = protocol(tmp_path, enroll=2)  # b has no third photo: a stranger now, with both its photos
    assert [x.name for x in three.gallery] == ["a_0.jpg", "a_1.jpg"] and [x.name for x in three.strangers] == [
        "b_0.jpg",
        "b_1.jpg",
        "c_0.jpg",
        "d_0.jpg",
    ]
    gallery = np.eye(3)[:2]
    labels, scores = best_subjects(gallery, np.array([7, 9]), np.array([[0.1, 0.9, 0], [0.8, 0.6, 0]]))
    assert list(labels) == [9, 7] and list(scores) == [0.9, 0.8]
    faces = np.eye(4)[[0, 1, 2, 3, 3]]  # subject 5 has two faces: its best counts once
    labels, scores = best_subjects(faces, np.array([1, 2, 3, 5, 5]), np.array([[0.9, 0.5, 0.3, 0.1]]), margin=True)
    assert list(labels) == [1] and scores[0] == pytest.approx(0.9 + 0.5 * (0.9 - (0.5 + 0.3 + 0.1) / 3))


def test_lfw_open_set_through_the_service_decision(test_data, model_cache, tmp_path, monkeypatch):
    from service.core.settings import get_settings

    people = sorted(p for p in (test_data / "lfw").iterdir() if p.is_dir())
    several = [p for p in people if len(list(p.glob("*.jpg"))) >= 2][:35]  # from 31 subjects the margin decides
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
            "--sizes",
            "10",
            "--repeats",
            "3",
            "--no-progress",
        ],
    )
    get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert (report["enrolled_subjects"], report["gallery_faces"], report["known_probes"], report["stranger_probes"]) == (35, 35, 35, 15)
    rows = {row["fpir"]: row for row in report["rows"]}
    assert set(rows) == {0.1, 0.01, 0.001} and rows[0.01]["default"]
    assert report["score"] == "margin" and all(r["score"] == "margin" and r["far"] is None for r in report["rows"])
    assert all(r["threshold"] == r["table_threshold"] and r["guard_threshold"] is None for r in report["rows"])  # 35 subjects: no guard
    thresholds = [rows[r]["threshold"] for r in (0.1, 0.01, 0.001)]
    assert thresholds == sorted(thresholds)  # a smaller FPIR, a stricter threshold
    cosine = {row["fpir"]: row for row in report["cosine_rows"]}
    assert cosine[0.01]["score"] == "cosine" and cosine[0.01]["far"] is not None  # as /identify decided before the margin score
    # the cosine rows: each threshold between the manifest's calibrated thresholds around its per-comparison FAR, 1 − (1 − fpir)^(1/35)
    calibrated = Manifest.load(REPO / "models" / "dlib-resnet-v1.json").thresholds
    for fpir, (looser, stricter) in {0.1: ("1e-2", "1e-3"), 0.01: ("1e-3", "1e-4"), 0.001: ("1e-4", "1e-5")}.items():
        assert calibrated[looser] <= cosine[fpir]["threshold"] <= calibrated[stricter], fpir
    (ten,) = report["by_size"]
    assert (ten["subjects"], ten["repeats"]) == (10, 3) and [r["fpir"] for r in ten["rows"]] == [r["fpir"] for r in ten["cosine_rows"]] == [
        0.1,
        0.01,
        0.001,
    ]
    # the same open set identified here by brute force: every probe against every enrolled face (one a subject)
    gallery, known, strangers = (_embeddings(model_cache, [p / photo for p, photo in group]) for group in _open_set(several, single))
    cosines, stranger_cosines = known @ gallery.T, strangers @ gallery.T
    right = cosines.argmax(axis=1) == np.arange(len(several))
    assert report["rank1"] == pytest.approx(right.mean())

    def margin(c: np.ndarray) -> np.ndarray:
        """s1 + 0.5 · (s1 − mean of the next k), k = min(10, N − 1): the issue's score, written out here."""
        top = -np.sort(-c, axis=1)
        k = min(10, c.shape[1] - 1)
        return top[:, 0] + 0.5 * (top[:, 0] - top[:, 1 : k + 1].mean(axis=1))

    for decided, score in ((rows, margin), (cosine, lambda c: c.max(axis=1))):
        for fpir, row in decided.items():
            found = right & (score(cosines) >= row["threshold"])
            accepted = score(stranger_cosines) >= row["threshold"]
            assert (row["dir"], row["realized_fpir"]) == pytest.approx((found.mean(), accepted.mean()), abs=1e-9), (fpir, row["score"])
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
