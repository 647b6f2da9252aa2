"""YuNet face detection through onnxruntime (not cv2.FaceDetectorYN), so the GPU provider logic
serves the detector too. The output decoding is hand-written: no library exposes it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import cv2
import numpy as np
import onnxruntime as ort

from service.core.batch_shapes import BatchShapes
from service.core.models.manifest import Manifest

STRIDES = (8, 16, 32)


@dataclass(frozen=True)
class Face:
    """One detection in image pixels.

    box: x1, y1, x2, y2. landmarks: 5×2 (x, y) — subject's right eye, left eye, nose tip, right
    mouth corner, left mouth corner; on an upright face the first eye and first mouth corner have
    the smaller x (the ArcFace template's order).
    """

    box: np.ndarray
    landmarks: np.ndarray
    score: float

    @property
    def width(self) -> float:
        return float(self.box[2] - self.box[0])

    @property
    def height(self) -> float:
        return float(self.box[3] - self.box[1])

    @property
    def area(self) -> float:
        return self.width * self.height

    def scaled(self, factor: float) -> Face:
        """The same detection in an image scaled by `factor` (a reduced decode's pixels and back)."""
        return Face(box=self.box * np.float32(factor), landmarks=self.landmarks * np.float32(factor), score=self.score)

    def as_json(self) -> dict:
        """box, landmarks and score as rounded JSON numbers, as the API and the CLI print them."""
        return {
            "box": [round(float(v), 2) for v in self.box],
            "landmarks": [[round(float(x), 2), round(float(y), 2)] for x, y in self.landmarks],
            "score": round(self.score, 4),
        }


class FaceDetector:
    def __init__(
        self,
        manifest: Manifest,
        session: ort.InferenceSession,
        score_threshold: float = 0.6,
        nms_threshold: float = 0.3,
        min_face_size: int = 20,
        top_k: int = 5000,
        sizes: tuple[int, ...] = (),
        batch_sizes: Iterable[int] = (1,),
    ):
        """`sizes`: the square inputs an image may run at (multiples of the largest stride; few and
        fixed, so a GPU warms each shape once at start-up); a graph whose image size is fixed (or
        could not be freed: service/core/models/rebatch.py) runs at its own. `batch_sizes`: the only
        batch sizes the session runs at (`BatchShapes`; YuNet as published fixes 1)."""
        self.manifest = manifest
        self.session = session
        self.score_threshold = score_threshold
        self.nms_threshold = nms_threshold
        self.min_face_size = min_face_size
        self.top_k = top_k
        self.input_name = manifest.input.name
        self.output_names = [f"{kind}_{s}" for s in STRIDES for kind in ("cls", "obj", "bbox", "kps")]
        width = session.get_inputs()[0].shape[3]
        self.sizes = (manifest.input.width,) if isinstance(width, int) or not sizes else tuple(sorted(set(sizes)))
        self._grids = {size: self._grid(size) for size in self.sizes}
        # Where each output sits in an `infer` row of each size, and its width: computed once.
        self._layouts = {size: self._layout(size) for size in self.sizes}
        self.shapes = BatchShapes.for_model(session.get_inputs()[0].shape[0], batch_sizes)

    @staticmethod
    def _grid(size: int) -> dict[int, np.ndarray]:
        """Anchor-free grid: each output row is the cell (col, row) of its stride, row-major."""
        grid = {}
        for stride in STRIDES:
            cells = np.arange(size // stride, dtype=np.float32)
            xs, ys = np.meshgrid(cells, cells)
            grid[stride] = np.stack([xs.ravel(), ys.ravel()], axis=1)
        return grid

    def _layout(self, size: int) -> list[tuple[str, int, int, int]]:
        layout, start = [], 0
        for name in self.output_names:
            kind, stride = name.split("_")
            width = {"cls": 1, "obj": 1, "bbox": 4, "kps": 10}[kind]
            end = start + (size // int(stride)) ** 2 * width
            layout.append((name, start, end, width))
            start = end
        return layout

    def size_for(self, image_size: tuple[int, int]) -> int:
        """The smallest size holding the image's longer side, else the largest (with 320/480/640: an
        image of at most 320 px runs at 320 rather than upscaled to 640, a larger one shrinks to 640)."""
        longer = max(image_size)
        return next((s for s in self.sizes if s >= longer), self.sizes[-1])

    def letterbox(self, image: np.ndarray, size: int | None = None) -> tuple[np.ndarray, float]:
        """Scale to fit a square network input (`size_for` the image unless given) keeping the
        aspect ratio; pad right/bottom. `scale` maps results back."""
        h, w = image.shape[:2]
        size = size or self.size_for((h, w))
        scale = min(size / w, size / h)
        new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
        interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
        canvas = np.zeros((size, size, 3), dtype=np.uint8)
        canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h), interpolation=interp)
        return canvas, scale

    def infer(self, canvases: np.ndarray) -> np.ndarray:
        """N letterboxed BGR canvases of one size → N rows of the network's outputs, flattened and
        packed (`_unpack` reads one back), so a micro-batcher can hand each image its own row; run
        at the detector's batch shapes."""
        return self.shapes.run(self._run, canvases)

    def _run(self, canvases: np.ndarray) -> np.ndarray:
        blob = np.ascontiguousarray(canvases.transpose(0, 3, 1, 2), dtype=np.float32)
        values = self.session.run(self.output_names, {self.input_name: blob})
        return np.concatenate([v.reshape(len(blob), -1) for v in values], axis=1)

    def _unpack(self, row: np.ndarray, size: int) -> dict[str, np.ndarray]:
        return {name: row[start:stop].reshape(1, -1, width) for name, start, stop, width in self._layouts[size]}

    def _decode(self, outputs: dict[str, np.ndarray], size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        boxes, landmarks, scores = [], [], []
        for stride in STRIDES:
            cls = outputs[f"cls_{stride}"][0, :, 0]
            obj = outputs[f"obj_{stride}"][0, :, 0]
            score = np.sqrt(np.clip(cls, 0, 1) * np.clip(obj, 0, 1))
            keep = score >= self.score_threshold
            if not keep.any():
                continue
            grid = self._grids[size][stride][keep]
            bbox = outputs[f"bbox_{stride}"][0][keep]
            kps = outputs[f"kps_{stride}"][0][keep].reshape(-1, 5, 2)
            centre = (grid + bbox[:, :2]) * stride
            extent = np.exp(bbox[:, 2:4]) * stride
            boxes.append(np.concatenate([centre - extent / 2, extent], axis=1))  # x, y, w, h
            landmarks.append((kps + grid[:, None, :]) * stride)
            scores.append(score[keep])
        if not boxes:
            return np.zeros((0, 4), np.float32), np.zeros((0, 5, 2), np.float32), np.zeros((0,), np.float32)
        return np.concatenate(boxes), np.concatenate(landmarks), np.concatenate(scores)

    def detect(self, image_bgr: np.ndarray) -> list[Face]:
        """Faces sorted by box area, largest first."""
        canvas, scale = self.letterbox(image_bgr)
        return self.faces(self.infer(canvas[None])[0], len(canvas), scale, image_bgr.shape[:2])

    def faces(self, row: np.ndarray, size: int, scale: float, image_size: tuple[int, int]) -> list[Face]:
        """One image's row of `infer` at `size` → its faces in image pixels (through the letterbox's
        scale), sorted by box area, largest first."""
        boxes, landmarks, scores = self._decode(self._unpack(row, size), size)
        if len(scores) == 0:
            return []
        keep = cv2.dnn.NMSBoxes(boxes.tolist(), scores.tolist(), self.score_threshold, self.nms_threshold, top_k=self.top_k)
        h, w = image_size
        faces = []
        for i in np.asarray(keep).reshape(-1):
            x, y, bw, bh = boxes[i] / scale
            box = np.array([max(0.0, x), max(0.0, y), min(float(w), x + bw), min(float(h), y + bh)], dtype=np.float32)
            face = Face(box=box, landmarks=(landmarks[i] / scale).astype(np.float32), score=float(scores[i]))
            if min(face.width, face.height) >= self.min_face_size:
                faces.append(face)
        faces.sort(key=lambda f: f.area, reverse=True)
        return faces
