"""Every bad input becomes a typed error, never a crash or a silently wrong image."""

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from service.core.decode import decode_image
from service.core.errors import FacegateError, ImageTooLarge, ImageTooSmall, InvalidImage, UnsupportedMediaType


def _photo(w=64, h=48) -> np.ndarray:
    rng = np.random.default_rng(1)
    return cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (5, 5), 0)


def _encode(image: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def _pil_bytes(image: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def _png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header claims a huge size: signature, IHDR, the start of the pixel data
    (as a decompression bomb begins), IEND."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 100_000)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp", ".bmp"])
def test_common_formats_decode_to_bgr(ext):
    image = _photo()
    out = decode_image(_encode(image, ext))
    assert out.shape == image.shape and out.dtype == np.uint8
    if ext in (".png", ".bmp"):  # lossless
        assert np.array_equal(out, image)


@pytest.mark.parametrize(
    "data, error",
    [
        (b"", InvalidImage),
        (np.random.default_rng(0).bytes(5000), InvalidImage),
        (b"this is not an image, whatever its file name says\n" * 20, InvalidImage),
        (_png_claiming(30000, 30000), ImageTooLarge),
        (_png_claiming(7000, 7000), ImageTooLarge),
    ],
    ids=["empty", "random-bytes", "text", "png-claims-30000x30000", "png-claims-49MP"],
)
def test_bad_bytes_raise_typed_errors(data, error):
    with pytest.raises(error):
        decode_image(data)


def test_truncated_jpeg_is_invalid():
    data = _encode(_photo(200, 200), ".jpg")
    for cut in (len(data) // 2, len(data) - 10, 400):
        with pytest.raises(InvalidImage):
            decode_image(data[:cut])


def test_one_pixel_image_is_too_small():
    with pytest.raises(ImageTooSmall):
        decode_image(_encode(np.zeros((1, 1, 3), np.uint8), ".png"))


def test_byte_and_pixel_limits_apply_before_decoding():
    data = _encode(_photo(100, 100), ".png")
    with pytest.raises(ImageTooLarge):
        decode_image(data, max_bytes=len(data) - 1)
    with pytest.raises(ImageTooLarge):
        decode_image(data, max_pixels=100 * 100 - 1)
    assert decode_image(data, max_bytes=len(data), max_pixels=100 * 100).shape == (100, 100, 3)


def test_animated_gif_is_unsupported_but_a_still_gif_decodes():
    frames = [Image.fromarray(_photo()), Image.fromarray(_photo()[::-1])]
    with pytest.raises(UnsupportedMediaType):
        decode_image(_pil_bytes(frames[0], "GIF", save_all=True, append_images=frames[1:]))
    assert decode_image(_pil_bytes(frames[0], "GIF")).shape == (48, 64, 3)


def test_cmyk_jpeg_decodes_to_the_same_colours():
    rgb = _photo()[..., ::-1]
    data = _pil_bytes(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95)
    out = decode_image(data)
    assert out.shape == (48, 64, 3)
    assert np.abs(out.astype(int) - rgb[..., ::-1].astype(int)).mean() < 6


def test_sixteen_bit_png_becomes_eight_bit():
    image16 = _photo().astype(np.uint16) * 257
    out = decode_image(_encode(image16, ".png"))
    assert out.dtype == np.uint8
    assert np.abs(out.astype(int) - (image16 >> 8).astype(int)).max() <= 1


def test_grayscale_and_rgba_become_three_channels():
    gray = _photo()[..., 0]
    assert decode_image(_encode(gray, ".png")).shape == (48, 64, 3)
    rgba = np.dstack([_photo(), np.full((48, 64), 255, np.uint8)])
    out = decode_image(_encode(rgba, ".png"))
    assert np.array_equal(out, rgba[..., :3])


def test_exif_orientation_is_applied():
    image = _photo(80, 40)  # landscape pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    data = _pil_bytes(Image.fromarray(image[..., ::-1]), "JPEG", exif=exif.tobytes(), quality=95)
    assert decode_image(data).shape == (80, 40, 3)


def test_every_decode_error_is_a_facegate_error():
    """The API maps FacegateError to 4xx; anything else would be a 5xx for bad input."""
    rng = np.random.default_rng(7)
    good = _encode(_photo(), ".jpg")
    for _ in range(200):
        data = bytearray(good)
        for pos in rng.integers(0, len(data), size=int(rng.integers(1, 20))):
            data[pos] = int(rng.integers(0, 256))
        try:
            decode_image(bytes(data[: int(rng.integers(1, len(data) + 1))]))
        except FacegateError:
            pass
