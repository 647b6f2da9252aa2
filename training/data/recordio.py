"""InsightFace RecordIO (`train.rec` + `train.idx`) read without mxnet.

The .rec file is dmlc RecordIO: each record is a uint32 magic 0xced7230a, a uint32 whose low 29 bits
are the payload length and top 3 bits a continuation flag (0 whole, 1 first, 2 middle, 3 last part of
a record split where its payload contained the magic), the payload, then padding to 4 bytes. The
payload is InsightFace's IRHeader `IfQQ` (flag, label, id, id2), `flag` extra float32 labels when
flag > 0, then the encoded image. In InsightFace datasets record 0 is a header whose label[0] is one
past the last image key.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_IR_HEADER = struct.Struct("<IfQQ")


def read_index(path: Path) -> dict[int, int]:
    """`.idx` → {key: byte offset}."""
    index = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            key, offset = line.split("\t")
            index[int(key)] = int(offset)
    return index


def unpack(payload: bytes) -> tuple[np.ndarray, int, bytes]:
    """IRHeader payload → (labels as float32 array, flag, image bytes)."""
    flag, label, _, _ = _IR_HEADER.unpack_from(payload)
    body = payload[_IR_HEADER.size :]
    if flag > 0:
        labels = np.frombuffer(body[: 4 * flag], dtype=np.float32).copy()
        return labels, flag, body[4 * flag :]
    return np.array([label], np.float32), flag, body


class RecordReader:
    """Random access to the records of one .rec/.idx pair; opens its file lazily so that each
    data-loader worker gets its own handle after fork."""

    def __init__(self, rec_path: Path, idx_path: Path | None = None) -> None:
        self.rec_path = Path(rec_path)
        self.index = read_index(idx_path or self.rec_path.with_suffix(".idx"))
        self._fh: BinaryIO | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fh": None}

    def read(self, key: int) -> bytes:
        if self._fh is None:
            self._fh = open(self.rec_path, "rb")
        self._fh.seek(self.index[key])
        parts = []
        while True:
            magic, lrecord = struct.unpack("<II", self._fh.read(8))
            if magic != MAGIC:
                raise ValueError(f"{self.rec_path}: bad RecordIO magic at key {key}")
            cflag, length = lrecord >> 29, lrecord & ((1 << 29) - 1)
            parts.append(self._fh.read(length))
            self._fh.read((4 - length % 4) % 4)
            if cflag in (0, 3):
                return _MAGIC_BYTES.join(parts)


class RecordIODataset:
    """Face crops and integer labels from an InsightFace `train.rec`."""

    def __init__(self, rec_path: Path) -> None:
        self.reader = RecordReader(rec_path)
        labels, flag = np.zeros(0, np.float32), 0
        if 0 in self.reader.index:
            labels, flag, _ = unpack(self.reader.read(0))
        if flag > 0:
            self.keys = list(range(1, int(labels[0])))
        else:
            self.keys = sorted(self.reader.index)
        self._labels: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def labels(self) -> np.ndarray:
        """Every record's label; reads all headers once (use `num_classes` in the config to skip it)."""
        if self._labels is None:
            self._labels = np.array([int(unpack(self.reader.read(k))[0][0]) for k in self.keys], np.int64)
        return self._labels

    def load(self, i: int) -> tuple[np.ndarray, int]:
        labels, _, image = unpack(self.reader.read(self.keys[i]))
        bgr = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError(f"{self.reader.rec_path}: record {self.keys[i]} is not a decodable image")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), int(labels[0])
