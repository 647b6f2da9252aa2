"""`facegate align` on real photos: the service's detector and alignment, a no-face report,
a manifest CSV, resumable."""

from __future__ import annotations

import csv
import shutil

import cv2
import numpy as np
import pytest

from training.data.align_folder import MANIFEST, REPORT, align_folder

pytestmark = pytest.mark.data


@pytest.fixture
def raw(test_data, tmp_path):
    """Two identities of loose face crops and, filed under the first, a photo with no face."""
    src = tmp_path / "raw"
    for identity in ("cfp_001", "cfp_002"):
        (src / identity).mkdir(parents=True)
        for name in ("01.jpg", "02.jpg", "03.jpg"):
            shutil.copy(test_data / "train" / identity / name, src / identity / name)
    shutil.copy(test_data / "tests" / "compreface" / "017_0.jpg", src / "cfp_001" / "noface.jpg")
    (src / "cfp_002" / "broken.jpg").write_bytes(b"not an image")
    return src


def test_align_reports_no_face_and_resumes(raw, settings, tmp_path):
    from service.core.alignment import align_face
    from service.core.pipeline import FacePipeline

    dst = tmp_path / "aligned"
    summary = align_folder(raw, dst, settings, workers=2, progress=False)
    assert (summary.aligned, summary.no_face, summary.skipped) == (6, 2, 0)
    with open(dst / MANIFEST, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["file"] for r in rows) == [f"{i}/{n}.jpg" for i in ("cfp_001", "cfp_002") for n in ("01", "02", "03")]
    assert all(float(r["det_score"]) > 0.5 for r in rows)
    with open(dst / REPORT, newline="") as fh:
        report = {r["source_file"]: r["reason"] for r in csv.DictReader(fh)}
    assert report["cfp_001/noface.jpg"] == "no face detected"
    assert report["cfp_002/broken.jpg"].startswith("unreadable")

    # the crop is the service's own alignment of the largest face (up to JPEG loss)
    crop = cv2.cvtColor(cv2.imread(str(dst / "cfp_001" / "01.jpg")), cv2.COLOR_BGR2RGB)
    pipeline = FacePipeline.from_settings(settings, require_embedder=False)
    image = pipeline.decode((raw / "cfp_001" / "01.jpg").read_bytes())
    expected = align_face(image, pipeline.detect(image)[0].landmarks)
    assert crop.shape == (112, 112, 3)
    assert np.abs(crop.astype(int) - expected.astype(int)).mean() < 3

    again = align_folder(raw, dst, settings, workers=1, progress=False)
    assert (again.aligned, again.no_face, again.skipped) == (0, 0, 8)
