"""A JPEG's structure is read before it is decoded (issue 34, defects 1 and 2): components in separate
scans are decoded and limited at full size like a progressive file, with libjpeg's whole-image
coefficient buffer counted; more than 100 scans (or 1,000 marker segments) is refused before any
pixel is decoded; photos read as what they are."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
from PIL import Image

from service.core.decode import probe
from service.core.errors import ImageTooComplex, ImageTooLarge, InvalidImage
from service.core.jpeg import MAX_SCANS, MAX_SEGMENTS, structure
from tests.jpeg_bombs import many_scans, separate_scans, with_app1, with_segments

LIMITS = (10_000_000, 40_000_000, 16, 4000)  # the service's defaults: bytes, pixels, min side, JPEG reduce-to side


def _photo_jpeg(width: int, height: int, **options) -> bytes:
    rng = np.random.default_rng(3)
    image = cv2.resize(rng.integers(0, 256, (height // 50, width // 50, 3), dtype=np.uint8), (width, height))
    out = io.BytesIO()
    Image.fromarray(image).save(out, "JPEG", quality=85, **options)
    return out.getvalue()


def test_components_in_separate_scans_are_decoded_at_full_size_and_counted():
    """The issue's file: 358 bytes declaring 16000×11000, its components in three baseline scans. It
    was decoded at 1/8 and counted as 2.75 MP while libjpeg held 1 GB of coefficients."""
    bomb = separate_scans(16000, 11000)
    assert len(bomb) < 400
    found = structure(bomb)
    assert found.whole_image_buffer and not found.progressive and found.scans == 3
    assert found.coefficient_bytes == 16000 * 11000 * 3 * 2
    with pytest.raises(ImageTooLarge, match="176000000 pixels"):
        probe(bomb, *LIMITS)
    accepted = probe(separate_scans(6000, 6000), *LIMITS)
    assert accepted.reduction == 1 and accepted.decoded_pixels == 36_000_000
    assert accepted.budget_pixels == 36_000_000 + 6000 * 6000 * 3 * 2 // 3  # the buffer, at 3 bytes a pixel


@pytest.mark.parametrize("scans", [MAX_SCANS + 1, 1000])
def test_scans_past_the_cap_are_refused_before_decoding(scans):
    """The issue's 14 KB file of 1,000 scans cost ~30 s of CPU to decode; it is refused from its markers."""
    with pytest.raises(ImageTooComplex, match=f"more than {MAX_SCANS} scans"):
        probe(many_scans(4000, 4000, scans), *LIMITS)
    assert structure(many_scans(4000, 4000, MAX_SCANS)).scans == MAX_SCANS


def test_marker_segments_past_the_cap_are_refused():
    small = separate_scans(64, 64)
    assert structure(with_segments(small, MAX_SEGMENTS - 10)).scans == 3
    with pytest.raises(ImageTooComplex, match="marker segments"):
        structure(with_segments(small, MAX_SEGMENTS + 1))


def test_photos_read_as_what_they_are():
    baseline = structure(_photo_jpeg(4000, 3000))
    assert (baseline.scans, baseline.whole_image_buffer, baseline.coefficient_bytes) == (1, False, 0)
    assert baseline.sampling == ((2, 2), (1, 1), (1, 1))  # 4:2:0
    assert probe(_photo_jpeg(8000, 6000), *LIMITS).reduction == 2  # decoded reduced, as before

    progressive = structure(_photo_jpeg(4000, 3000, progressive=True))
    assert progressive.progressive and progressive.whole_image_buffer and progressive.scans == 10  # libjpeg's default script
    luma, chroma = 500 * 376, 250 * 188  # blocks: 4000×3000 in 8×8, rounded to the 2×2 sampling; chroma at half size
    assert progressive.coefficient_bytes == (luma + 2 * chroma) * 128


def test_the_structure_of_what_is_not_the_first_image_is_not_walked():
    """An EXIF thumbnail is a JPEG inside APP1, and an MPO's second image follows the first one's EOI:
    neither's scans are the decoded image's."""
    crowded = many_scans(160, 120, 300)
    assert structure(with_app1(separate_scans(64, 64), b"Exif\x00\x00" + crowded)).scans == 3
    assert structure(separate_scans(64, 64) + crowded).scans == 3


@pytest.mark.parametrize(
    "data, error",
    [
        (b"\xff\xd8" + separate_scans(64, 64)[2:].replace(b"\xff\xc0", b"\xff\xfe", 1), "no frame header|scan before its frame"),
        (
            separate_scans(64, 64)[:-2].replace(b"\xff\xda", b"\xff\xc0\x00\x0b\x08\x00\x10\x00\x10\x01\x01\x11\x00\xff\xda", 1),
            "second frame",
        ),
        (b"\xff\xd8\xff\xe0\x00\x01", "declares a length of 1"),
    ],
)
def test_a_structure_libjpeg_refuses_is_invalid(data, error):
    with pytest.raises(InvalidImage, match=error):
        structure(data)


def test_a_file_cut_short_is_read_as_far_as_it_goes():
    whole = separate_scans(640, 480)
    assert structure(whole[: whole.index(b"\xff\xda") + 5]).scans == 1  # the first scan's header cut: counted, then the end
    assert structure(whole[:-2]).scans == 3  # no EOI
