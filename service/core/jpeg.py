"""A JPEG's marker structure, read before any pixel is decoded: what libjpeg will spend on it.

libjpeg's cost is not its pixels alone. A JPEG whose first scan does not hold every component
(progressive, or a baseline file with its components in separate scans) makes libjpeg keep the
coefficients of the whole image, at full size whatever scale the output is decoded at (2 bytes a
coefficient, 64 a block), and every scan is one more pass over them: 1,000 empty scans cost half a
minute of CPU. The walk here counts scans and marker segments (libjpeg-turbo's tools cap scans at
100), says whether the whole-image buffer will be needed, and how large it is. It follows libjpeg's
own reading: marker segments by their length, a scan's entropy-coded data up to the next marker
that is neither stuffing (FF 00) nor a restart (RSTn), the first image only (an MPO's previews
follow its EOI)."""

from __future__ import annotations

import re
from typing import NamedTuple

from service.core.errors import ImageTooComplex, InvalidImage

MAX_SCANS = 100  # libjpeg-turbo's djpeg/tjbench -maxscans; a camera's progressive JPEG has about 10
MAX_SEGMENTS = 1_000  # marker segments (APPn, DQT, DHT, SOS…); a photo has a few dozen
SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
SOS, EOI = 0xDA, 0xD9
STANDALONE = {0x01, 0xD8} | set(range(0xD0, 0xD8))  # TEM, SOI, RSTn: no length follows
# A marker is FF and a code; fill bytes (more FFs) before it are skipped by matching the last FF.
# A single literal first byte lets the regex engine scan for it at C speed (a 1 MB photo: 0.4 ms).
NEXT_MARKER = re.compile(rb"\xff[^\x00\xff]")  # between segments
SCAN_END = re.compile(rb"\xff[^\x00\xff\xd0-\xd7]")  # in entropy-coded data: the first marker not stuffing or RSTn


class Structure(NamedTuple):
    width: int
    height: int
    sampling: tuple[tuple[int, int], ...]  # each component's (horizontal, vertical) sampling factor
    scans: int
    progressive: bool
    whole_image_buffer: bool  # libjpeg keeps every coefficient: progressive, or components in separate scans

    @property
    def coefficient_bytes(self) -> int:
        """Bytes of libjpeg's whole-image coefficient buffer (0 when it decodes row by row): per
        component, its blocks (rounded up to its sampling factors) × 64 coefficients × 2 bytes."""
        if not self.whole_image_buffer:
            return 0
        h_max, v_max = max(h for h, _ in self.sampling), max(v for _, v in self.sampling)
        total = 0
        for h, v in self.sampling:
            wide, high = -(-self.width * h // (8 * h_max)), -(-self.height * v // (8 * v_max))
            total += (-(-wide // h) * h) * (-(-high // v) * v) * 128
        return total


def structure(data: bytes) -> Structure:
    """The first image's frame and scans; InvalidImage for a structure libjpeg refuses anyway
    (no frame before a scan, two frames), ImageTooComplex past MAX_SCANS or MAX_SEGMENTS. A file
    cut short is read as far as it goes: libjpeg decodes what arrived."""
    if data[:2] != b"\xff\xd8":
        raise InvalidImage("the data is not a JPEG (no SOI marker)")
    frame: tuple[int, int, tuple[tuple[int, int], ...], bool] | None = None
    scans = segments = 0
    whole = False
    pos = 2
    while (found := NEXT_MARKER.search(data, pos)) is not None:
        code, pos = data[found.end() - 1], found.end()
        if code == EOI:
            break
        if code in STANDALONE:
            continue
        if pos + 2 > len(data):
            break
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2:
            raise InvalidImage(f"a JPEG marker segment (0xFF{code:02X}) declares a length of {length}")
        payload, pos = data[pos + 2 : pos + length], pos + length
        segments += 1
        if segments > MAX_SEGMENTS:
            raise ImageTooComplex(f"the JPEG holds more than {MAX_SEGMENTS} marker segments")
        if code in SOF:
            if frame is not None:
                raise InvalidImage("the JPEG declares a second frame before its end")
            frame = _frame(payload, code in PROGRESSIVE)
        elif code == SOS:
            if frame is None:
                raise InvalidImage("the JPEG has a scan before its frame header")
            scans += 1
            if scans > MAX_SCANS:
                raise ImageTooComplex(f"the JPEG holds more than {MAX_SCANS} scans (a photo has at most a few dozen)")
            if scans == 1:  # as libjpeg decides it: on the first scan, for the whole decode
                whole = frame[3] or (len(payload) > 0 and payload[0] < len(frame[2]))
            end = SCAN_END.search(data, pos)
            if end is None:
                break
            pos = end.start()
    if frame is None:
        raise InvalidImage("the JPEG has no frame header")
    width, height, sampling, progressive = frame
    return Structure(width, height, sampling, scans, progressive, whole)


def _frame(payload: bytes, progressive: bool) -> tuple[int, int, tuple[tuple[int, int], ...], bool]:
    """A frame header (SOFn) → (width, height, each component's sampling, progressive)."""
    if len(payload) < 6:
        raise InvalidImage("the JPEG frame header is cut short")
    height, width, count = int.from_bytes(payload[1:3], "big"), int.from_bytes(payload[3:5], "big"), payload[5]
    if count == 0 or len(payload) < 6 + 3 * count:
        raise InvalidImage("the JPEG frame header declares no component, or is cut short")
    sampling = tuple((payload[7 + 3 * i] >> 4, payload[7 + 3 * i] & 0x0F) for i in range(count))
    if any(not (1 <= h <= 4 and 1 <= v <= 4) for h, v in sampling):
        raise InvalidImage("the JPEG frame header declares a sampling factor outside 1–4")
    return width, height, sampling, progressive
