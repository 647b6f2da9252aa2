"""Detection at the photo's size: the size each image runs at, and the fixed graph's fallback."""

from pathlib import Path

import numpy as np
import pytest

from service.core.models.detector import FaceDetector
from service.core.models.manifest import Manifest
from service.core.models.providers import Runtime, create_session

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def detector(model_cache):
    from service.core.pipeline import FacePipeline
    from service.core.settings import Settings

    return FacePipeline.from_settings(Settings(model_cache=model_cache, device="cpu"), require_embedder=False).detector


@pytest.mark.parametrize("shape, size", [((250, 250), 320), ((200, 320), 320), ((100, 321), 480), ((480, 640), 640), ((2000, 3000), 640)])
def test_an_image_runs_at_the_smallest_size_holding_its_longer_side(detector, shape, size):
    assert detector.sizes == (320, 480, 640)
    canvas, scale = detector.letterbox(np.zeros((*shape, 3), np.uint8))
    assert canvas.shape == (size, size, 3) and scale == pytest.approx(size / max(shape))


def test_one_size_letterboxes_every_image_to_it(detector):
    """FACEGATE_DETECT_SIZES=[640]: every photo upscaled or shrunk to 640, as before sizes were freed."""
    only = FaceDetector(detector.manifest, detector.session, sizes=(640,))
    assert only.sizes == (640,) and only.letterbox(np.zeros((250, 250, 3), np.uint8))[0].shape == (640, 640, 3)


def test_a_graph_of_fixed_size_runs_every_image_at_it():
    manifest = Manifest.load(REPO / "models" / "face_detection_yunet_2023mar.json")
    session = create_session(REPO / "models" / manifest.file.name, Runtime(device="cpu"))
    detector = FaceDetector(manifest, session, sizes=(320, 480, 640))
    assert detector.sizes == (640,)
    canvas, scale = detector.letterbox(np.zeros((250, 250, 3), np.uint8))
    assert canvas.shape == (640, 640, 3) and scale == pytest.approx(640 / 250)
