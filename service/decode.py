"""Bytes → BGR uint8 image, refusing bad input with typed errors before any expensive decode."""

from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from service.errors import ImageTooLarge, ImageTooSmall, InvalidImage, UnsupportedMediaType

# Formats Pillow can identify from the header and OpenCV decodes well. MPO is how many phones
# label their JPEGs (a JPEG plus a preview frame): OpenCV decodes its first, full image.
FORMATS = {"JPEG", "MPO", "PNG", "WEBP", "BMP", "GIF", "TIFF", "AVIF"}
STILL_MULTIFRAME = {"MPO"}


def probe(data: bytes, max_bytes: int, max_pixels: int, min_side: int) -> tuple[str, int, int]:
    """Format and size from the header alone: limits are checked before pixels are decoded."""
    if not data:
        raise InvalidImage("the image is empty (0 bytes)")
    if len(data) > max_bytes:
        raise ImageTooLarge(f"the image is {len(data)} bytes; the limit is {max_bytes}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as header:
                fmt, (width, height) = header.format, header.size
                frames = getattr(header, "n_frames", 1)
    except Image.DecompressionBombError:
        raise ImageTooLarge(f"the image header declares more than {Image.MAX_IMAGE_PIXELS} pixels") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        if data[4:8] == b"ftyp":  # an ISO media file (HEIC/HEIF, …) Pillow cannot read: a format, not garbage
            brand = data[8:12].decode("ascii", "replace").strip()
            raise UnsupportedMediaType(f"ISO media images (brand {brand!r}: HEIC/HEIF and the like) are not supported; send JPEG, PNG, WebP, BMP, GIF, TIFF or AVIF") from None
        raise InvalidImage("the data is not a readable image (JPEG, PNG, WebP, BMP, GIF or TIFF)") from None
    if fmt not in FORMATS:
        raise UnsupportedMediaType(f"{fmt} images are not supported; send JPEG, PNG, WebP, BMP, GIF or TIFF")
    if frames > 1 and fmt not in STILL_MULTIFRAME:
        raise UnsupportedMediaType(f"animated or multi-page {fmt} ({frames} frames) is not supported; send a single frame")
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image is {width}x{height} = {width * height} pixels; the limit is {max_pixels}")
    if min(width, height) < min_side:
        raise ImageTooSmall(f"the image is {width}x{height} pixels; each side needs at least {min_side}")
    return fmt, width, height


def decode_image(data: bytes, max_bytes: int = 10_000_000, max_pixels: int = 40_000_000, min_side: int = 16) -> np.ndarray:
    """Decode to 3-channel BGR uint8 with EXIF orientation applied.

    OpenCV's IMREAD_COLOR turns grayscale, alpha, 16-bit and CMYK sources into 8-bit BGR and
    rotates by EXIF; it returns None for truncated or corrupt data.
    """
    probe(data, max_bytes, max_pixels, min_side)
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise InvalidImage("the image is truncated or corrupt and could not be decoded")
    return image
