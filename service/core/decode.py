"""Bytes → BGR uint8 image, refusing bad input with typed errors before any expensive decode.

A large JPEG may be decoded reduced (libjpeg's DCT scaling, OpenCV's IMREAD_REDUCED_COLOR_2/4/8): the
largest of 1/2, 1/4 and 1/8 whose long side stays at least `reduce_to_side` px, so it costs the
reduced pixels' memory, and the pixel limit applies to what is decoded. The floor is what keeps
faces intact: the detector sees the long side at its input width (640 px) anyway, so a face it can
find (≥ ~16 px there) still spans ≥ 100 px at a 4,000-px long side, the size of the face in the
embedders' 112–150 px crops. Only a JPEG that libjpeg decodes row by row: one whose first scan does
not hold every component (progressive, or baseline with its components in separate scans) makes
libjpeg keep the whole image's coefficients whatever the output scale (`service.core.jpeg`), so it is
decoded and limited at full size, and that buffer is counted in `Probe.budget_pixels`.

In the service both run in decoder processes (`service.runtime.decode_workers`), with a deadline and a
memory limit; the CLI and training call them in place."""

from __future__ import annotations

import io
import warnings
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from service.core.errors import ImageTooLarge, ImageTooSmall, InvalidImage, UnsupportedMediaType
from service.core.jpeg import structure

# Formats Pillow can identify from the header and OpenCV decodes well. MPO is how many phones
# label their JPEGs (a JPEG plus a preview frame): OpenCV decodes its first, full image.
FORMATS = {"JPEG", "MPO", "PNG", "WEBP", "BMP", "GIF", "TIFF", "AVIF"}
STILL_MULTIFRAME = {"MPO"}
JPEG_FORMATS = {"JPEG", "MPO"}
REDUCED = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}


class Probe(NamedTuple):
    format: str
    width: int  # as stored, before EXIF orientation
    height: int
    reduction: int = 1  # decoded at 1/reduction of each side: 1, or 2, 4, 8 for a large JPEG
    buffered: int = 0  # bytes the decoder holds besides its output: libjpeg's whole-image coefficients

    @property
    def decoded_pixels(self) -> int:
        return -(-self.width // self.reduction) * -(-self.height // self.reduction)  # libjpeg rounds up

    @property
    def budget_pixels(self) -> int:
        """What the decoded-pixel budget holds for the image: its pixels, and the decoder's own
        buffer counted at 3 bytes a pixel (a BGR pixel's size)."""
        return self.decoded_pixels + -(-self.buffered // 3)


def reduction(fmt: str, whole_image_buffer: bool, width: int, height: int, reduce_to_side: int) -> int:
    """The scale-down a JPEG libjpeg decodes row by row is decoded at: the largest that keeps its
    long side ≥ reduce_to_side (0: never reduce)."""
    if fmt not in JPEG_FORMATS or whole_image_buffer or reduce_to_side <= 0:
        return 1
    return next((r for r in sorted(REDUCED, reverse=True) if -(-max(width, height) // r) >= reduce_to_side), 1)


def probe(data: bytes, max_bytes: int, max_pixels: int, min_side: int, reduce_to_side: int = 0) -> Probe:
    """Format, size and reduction from the header alone: limits are checked before pixels are decoded."""
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
            raise UnsupportedMediaType(
                f"ISO media images (brand {brand!r}: HEIC/HEIF and the like) are not supported; "
                "send JPEG, PNG, WebP, BMP, GIF, TIFF or AVIF"
            ) from None
        raise InvalidImage("the data is not a readable image (JPEG, PNG, WebP, BMP, GIF or TIFF)") from None
    if fmt not in FORMATS:
        raise UnsupportedMediaType(f"{fmt} images are not supported; send JPEG, PNG, WebP, BMP, GIF or TIFF")
    if frames > 1 and fmt not in STILL_MULTIFRAME:
        raise UnsupportedMediaType(f"animated or multi-page {fmt} ({frames} frames) is not supported; send a single frame")
    buffered = structure(data).coefficient_bytes if fmt in JPEG_FORMATS else 0
    found = Probe(fmt, width, height, reduction(fmt, buffered > 0, width, height, reduce_to_side), buffered)
    if found.decoded_pixels > max_pixels:
        reduced = f", {found.decoded_pixels} decoded at 1/{found.reduction}" if found.reduction > 1 else ""
        raise ImageTooLarge(f"the image is {width}x{height} = {width * height} pixels{reduced}; the limit is {max_pixels}")
    if min(width, height) < min_side:
        raise ImageTooSmall(f"the image is {width}x{height} pixels; each side needs at least {min_side}")
    return found


def decode_image(
    data: bytes, max_bytes: int = 10_000_000, max_pixels: int = 40_000_000, min_side: int = 16, reduce_to_side: int = 0
) -> np.ndarray:
    """Decode to 3-channel BGR uint8 with EXIF orientation applied, at the probe's reduction.

    OpenCV's IMREAD_COLOR (and IMREAD_REDUCED_COLOR_n) turns grayscale, alpha, 16-bit and CMYK
    sources into 8-bit BGR and rotates by EXIF; it returns None for truncated or corrupt data.
    """
    return decode_probed(data, probe(data, max_bytes, max_pixels, min_side, reduce_to_side))


def decode_probed(data: bytes, found: Probe) -> np.ndarray:
    """`decode_image` of data `probe` has passed (`found`): a decoder process probes once."""
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), REDUCED.get(found.reduction, cv2.IMREAD_COLOR))
    if image is None:
        raise InvalidImage("the image is truncated or corrupt and could not be decoded")
    return image
