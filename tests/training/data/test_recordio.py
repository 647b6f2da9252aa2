"""The RecordIO reader against a train.rec/.idx this test writes itself, as mxnet's
MXIndexedRecordIO + recordio.pack would (including a record split at an embedded magic)."""

from __future__ import annotations

import struct

import cv2
import numpy as np
import pytest

from training.data.datasets import FaceDataset, open_source
from training.data.recordio import MAGIC, RecordIODataset

MAGIC_BYTES = struct.pack("<I", MAGIC)


def pack(labels, image: bytes, flag_labels: bool = False) -> bytes:
    """InsightFace IRHeader (IfQQ) + labels + image, as mxnet.recordio.pack writes it."""
    labels = np.atleast_1d(np.asarray(labels, np.float32))
    if flag_labels or len(labels) > 1:
        return struct.pack("<IfQQ", len(labels), 0.0, 0, 0) + labels.tobytes() + image
    return struct.pack("<IfQQ", 0, float(labels[0]), 0, 0) + image


def write_rec(path, payloads: list[bytes]) -> None:
    """dmlc RecordIO: magic, length|cflag<<29, data padded to 4 bytes; a payload holding the magic
    is split there into parts flagged 1 (first), 2 (middle), 3 (last)."""
    with open(path.with_suffix(".rec"), "wb") as rec, open(path.with_suffix(".idx"), "w") as idx:
        for key, payload in enumerate(payloads):
            idx.write(f"{key}\t{rec.tell()}\n")
            parts = payload.split(MAGIC_BYTES)
            for i, part in enumerate(parts):
                cflag = 0 if len(parts) == 1 else 1 if i == 0 else 3 if i == len(parts) - 1 else 2
                rec.write(struct.pack("<II", MAGIC, (cflag << 29) | len(part)) + part + b"\0" * ((4 - len(part) % 4) % 4))


@pytest.fixture
def rec(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (112, 112, 3), dtype=np.uint8) for _ in range(5)]
    encoded = [cv2.imencode(".png", im)[1].tobytes() for im in images]  # lossless: exact comparison
    encoded[2] += MAGIC_BYTES + b"trailing bytes after the image"  # forces a split record
    labels = [0, 0, 1, 2, 2]
    header = pack([len(images) + 1, len(images) + 1 + 3], b"", flag_labels=True)  # record 0: [end, ...]
    write_rec(tmp_path / "train", [header] + [pack(lab, enc) for lab, enc in zip(labels, encoded, strict=True)])
    return tmp_path / "train.rec", images, labels


def test_reads_every_image_and_label(rec):
    path, images, labels = rec
    data = RecordIODataset(path)
    assert len(data) == len(images)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        rgb, got = data.load(i)
        np.testing.assert_array_equal(rgb, image[..., ::-1])  # stored BGR by OpenCV → read as RGB
        assert got == label
    np.testing.assert_array_equal(data.labels, labels)


def test_without_header_record_every_key_is_an_image(tmp_path):
    image = cv2.imencode(".jpg", np.zeros((112, 112, 3), np.uint8))[1].tobytes()
    write_rec(tmp_path / "train", [pack(7.0, image), pack([3.0, 1.0], image)])
    data = RecordIODataset(tmp_path / "train.rec")
    assert len(data) == 2 and list(data.labels) == [7, 3]  # multi-label records use label[0]


def test_folder_with_train_rec_opens_as_recordio_and_feeds_the_dataset(rec):
    path, images, _ = rec
    source = open_source(path.parent)
    assert isinstance(source, RecordIODataset)
    x, label = FaceDataset(source)[(1, 0)]
    assert x.shape == (3, 112, 112) and label == 0
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0


def test_bad_magic_is_an_error(tmp_path):
    (tmp_path / "train.rec").write_bytes(b"\0" * 64)
    (tmp_path / "train.idx").write_text("0\t0\n")
    with pytest.raises(ValueError, match="magic"):
        RecordIODataset(tmp_path / "train.rec")
