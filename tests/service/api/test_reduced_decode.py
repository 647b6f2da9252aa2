"""Large JPEGs decoded reduced (issue 23, memory): a photo upscaled to 8000×6000 (48 MP, above
FACEGATE_MAX_IMAGE_PIXELS) is decoded at 1/2, its face is still found where it is and embedded as
from the full-size decode, and the answer's box and landmarks are in the pixels of the image sent."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from service.core.decode import probe

WIDTH, HEIGHT = 8000, 6000


@pytest.fixture(scope="module")
def canvas(test_data) -> np.ndarray:
    photo = cv2.imread(str(test_data / "tests" / "face_recognition" / "examples" / "obama.jpg"))
    side = round(photo.shape[1] * HEIGHT / photo.shape[0])
    canvas = np.full((HEIGHT, WIDTH, 3), 128, np.uint8)
    left = (WIDTH - side) // 3  # off-centre, so a coordinate not scaled back would show
    canvas[:, left : left + side] = cv2.resize(photo, (side, HEIGHT), interpolation=cv2.INTER_CUBIC)
    return canvas


def _encode(image: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return data.tobytes()


def _exif_rotated(image: np.ndarray) -> bytes:
    """`image` stored turned 90° counter-clockwise (6000×8000), with EXIF orientation 6 to show it upright."""
    jpeg = _encode(np.ascontiguousarray(np.rot90(image)))
    exif = Image.Exif()
    exif[0x0112] = 6
    payload = exif.tobytes()
    return jpeg[:2] + b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload + jpeg[2:]


def _largest_face(api, data: bytes) -> dict:
    response = api.post("/embed", files={"image": ("large.jpg", data, "image/jpeg")})
    assert response.status_code == 200, response.text
    return max(
        response.json()["faces"], key=lambda f: (f["face"]["box"][2] - f["face"]["box"][0]) * (f["face"]["box"][3] - f["face"]["box"][1])
    )


def test_the_reduction_keeps_the_long_side_at_the_floor():
    assert probe(_jpeg(8000, 6000), 10**8, 40_000_000, 16, 4000).reduction == 2
    assert probe(_jpeg(7999, 5000), 10**8, 40_000_000, 16, 4000).reduction == 2  # 4000 px at 1/2 (libjpeg rounds up)
    assert probe(_jpeg(7997, 5000), 10**8, 40_000_000, 16, 4000).reduction == 1  # 3999 px: below the floor
    assert probe(_jpeg(16000, 900), 10**8, 40_000_000, 16, 4000).reduction == 4
    assert probe(_jpeg(8000, 6000), 10**8, 50_000_000, 16, 0).reduction == 1
    png = io.BytesIO()
    Image.new("RGB", (8000, 6000)).save(png, "PNG")
    assert probe(png.getvalue(), 10**8, 50_000_000, 16, 4000).reduction == 1  # JPEG only


def _jpeg(width: int, height: int, **save) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (90, 90, 90)).save(out, "JPEG", **save)
    return out.getvalue()


def test_a_progressive_jpeg_is_decoded_and_limited_at_full_size():
    """libjpeg holds a progressive JPEG's coefficients for the whole image at any output scale."""
    from service.core.errors import ImageTooLarge

    with pytest.raises(ImageTooLarge):
        probe(_jpeg(8000, 6000, progressive=True), 10**8, 40_000_000, 16, 4000)
    assert probe(_jpeg(8000, 4000, progressive=True), 10**8, 40_000_000, 16, 4000).reduction == 1
    assert probe(_jpeg(8000, 6000), 10**8, 40_000_000, 16, 4000).decoded_pixels == 4000 * 3000


@pytest.mark.data
@pytest.mark.parametrize("orientation", ["upright", "exif-rotated"])
def test_a_large_jpeg_is_decoded_reduced_and_its_face_found_where_it_is(api_settings, make_client, canvas, orientation):
    data = _encode(canvas) if orientation == "upright" else _exif_rotated(canvas)
    reduced_api = make_client(api_settings)
    full_api = make_client(
        api_settings.model_copy(
            update={"jpeg_reduce_to_side": 0, "max_image_pixels": 50_000_000, "data_dir": api_settings.data_dir.parent / "full"}
        )
    )
    reduced, full = _largest_face(reduced_api, data), _largest_face(full_api, data)
    box, full_box = np.array(reduced["face"]["box"]), np.array(full["face"]["box"])
    assert box[2] - box[0] > 1000  # a face of the 8000×6000 image, not of its 4000×3000 decode
    assert np.abs(box - full_box).max() < 0.03 * (full_box[2] - full_box[0]), (box, full_box)
    assert np.abs(np.array(reduced["face"]["landmarks"]) - np.array(full["face"]["landmarks"])).max() < 0.03 * (full_box[2] - full_box[0])
    cosine = float(np.dot(reduced["embedding"], full["embedding"]))  # both L2-normalized
    assert cosine > 0.9, cosine
    # without the reduction, the same file is over FACEGATE_MAX_IMAGE_PIXELS
    unreduced = make_client(
        api_settings.model_copy(update={"jpeg_reduce_to_side": 0, "data_dir": api_settings.data_dir.parent / "unreduced"})
    )
    assert unreduced.post("/embed", files={"image": ("large.jpg", data, "image/jpeg")}).json()["error"]["code"] == "image_too_large"
