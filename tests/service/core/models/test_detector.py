"""Detection at the photo's size: the size each image runs at, and the fixed graph's fallback."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from service.core.models.detector import FaceDetector, _nchw_float32
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


def _letterbox_reference(image: np.ndarray, size: int) -> np.ndarray:
    """The letterbox as written before (a zeroed canvas, the resized image copied into its corner)."""
    h, w = image.shape[:2]
    scale = min(size / w, size / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    canvas = np.zeros((size, size, 3), np.uint8)
    canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    return canvas


@pytest.mark.parametrize("shape", [(250, 250), (200, 320), (100, 321), (480, 640), (700, 500), (1, 900)])
def test_the_letterbox_is_the_resized_image_padded_black(detector, shape):
    image = np.random.default_rng(sum(shape)).integers(1, 256, (*shape, 3), dtype=np.uint8)  # no black of its own
    for size in detector.sizes:
        canvas, _ = detector.letterbox(image, size)
        assert canvas.dtype == np.uint8 and canvas.flags.c_contiguous
        assert np.array_equal(canvas, _letterbox_reference(image, size))


def test_the_detector_input_is_the_canvases_in_float32_nchw():
    canvases = np.random.default_rng(6).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    blob = _nchw_float32(canvases)
    assert blob.dtype == np.float32 and blob.flags.c_contiguous
    assert np.array_equal(blob, canvases.transpose(0, 3, 1, 2).astype(np.float32))


def _candidates_reference(outputs, size, n, threshold):
    """The candidates decoded stride by stride, as written before (then sorted by image)."""
    rows, owners = [], []
    for stride in (8, 16, 32):
        cells = np.arange(size // stride, dtype=np.float32)
        xs, ys = np.meshgrid(cells, cells)
        grid_all = np.stack([xs.ravel(), ys.ravel()], axis=1)
        score = np.sqrt(np.clip(outputs[f"cls_{stride}"][..., 0], 0, 1) * np.clip(outputs[f"obj_{stride}"][..., 0], 0, 1))
        image, anchor = np.nonzero(score >= threshold)
        grid = grid_all[anchor]
        bbox = outputs[f"bbox_{stride}"][image, anchor]
        centre = (grid + bbox[:, :2]) * stride
        extent = np.exp(bbox[:, 2:4]) * stride
        landmarks = (outputs[f"kps_{stride}"][image, anchor].reshape(-1, 5, 2) + grid[:, None, :]) * stride
        rows.append(np.concatenate([score[image, anchor][:, None], centre - extent / 2, extent, landmarks.reshape(-1, 10)], axis=1))
        owners.append(image)
    found, owner = np.concatenate(rows).astype(np.float32), np.concatenate(owners)
    order = np.argsort(owner, kind="stable")
    return np.split(found[order], np.searchsorted(owner[order], np.arange(1, n)))


def test_the_candidates_are_decoded_as_stride_by_stride(detector):
    rng = np.random.default_rng(7)
    for size in detector.sizes:
        n = 3
        outputs = {}
        for stride in (8, 16, 32):
            anchors = (size // stride) ** 2
            outputs[f"cls_{stride}"] = rng.uniform(0, 1.2, (n, anchors, 1)).astype(np.float32)
            outputs[f"obj_{stride}"] = rng.uniform(0, 1.2, (n, anchors, 1)).astype(np.float32)
            outputs[f"bbox_{stride}"] = rng.normal(0, 1, (n, anchors, 4)).astype(np.float32)
            outputs[f"kps_{stride}"] = rng.normal(0, 1, (n, anchors, 10)).astype(np.float32)
        found = detector._candidates(outputs, size, n)
        reference = _candidates_reference(outputs, size, n, detector.score_threshold)
        assert len(found) == n and all(len(f) > 100 for f in found)
        for mine, theirs in zip(found, reference, strict=True):
            assert mine.dtype == np.float32 and np.array_equal(mine, theirs)
