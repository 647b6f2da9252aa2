"""JPEGs written marker by marker, as a hostile client makes them (issue 34): a few hundred bytes that
declare a large frame and whose scans hold next to no data (libjpeg decodes the missing data as
flat grey, with a warning). Every block is then one DC code and one end-of-block: each Huffman
table has a single one-bit code for the symbol 0."""

from __future__ import annotations

import struct


def segment(marker: int, payload: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload


def _frame(marker: int, width: int, height: int, components: int) -> bytes:
    return segment(
        marker, struct.pack(">BHHB", 8, height, width, components) + b"".join(bytes([i, 0x11, 0]) for i in range(1, components + 1))
    )


def _scan(components: list[int], start: int = 0, end: int = 63) -> bytes:
    return segment(0xDA, bytes([len(components)]) + b"".join(bytes([c, 0]) for c in components) + bytes([start, end, 0])) + b"\x00"


TABLES = (
    segment(0xDB, b"\x00" + bytes([1] * 64))
    + segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")
    + segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
)


def separate_scans(width: int, height: int) -> bytes:
    """Baseline, its three components each in a scan of its own: libjpeg keeps the coefficients of
    the whole image (width × height × 3 × 2 bytes), whatever scale it decodes at."""
    return b"\xff\xd8" + _frame(0xC0, width, height, 3) + TABLES + b"".join(_scan([c]) for c in (1, 2, 3)) + b"\xff\xd9"


def many_scans(width: int, height: int, scans: int) -> bytes:
    """Progressive, one grey component: a DC scan, then `scans` - 1 empty AC scans, each one more
    pass over the whole image's coefficients."""
    return b"\xff\xd8" + _frame(0xC2, width, height, 1) + TABLES + _scan([1], 0, 0) + _scan([1], 1, 63) * (scans - 1) + b"\xff\xd9"


def with_segments(jpeg: bytes, count: int) -> bytes:
    """`jpeg` with `count` empty comment segments after its SOI."""
    return jpeg[:2] + segment(0xFE, b"") * count + jpeg[2:]


def with_app1(jpeg: bytes, payload: bytes) -> bytes:
    """`jpeg` with an APP1 segment (where EXIF keeps its thumbnail, a JPEG of its own) after its SOI."""
    return jpeg[:2] + segment(0xE1, payload) + jpeg[2:]
