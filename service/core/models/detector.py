"""YuNet face detection through onnxruntime (not cv2.FaceDetectorYN), so the GPU provider logic
serves the detector too. The output decoding is hand-written: no library exposes it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from service.core.batch_shapes import BatchShapes
from service.core.models.manifest import Manifest

if TYPE_CHECKING:  # a session is given: the process that runs none (an HTTP worker under a model host) never imports it
    import onnxruntime as ort

STRIDES = (8, 16, 32)
CANDIDATE = 15  # columns of a candidate detection: score, box x y w h, five landmarks x y


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
        fork: Callable[[], ort.InferenceSession] | None = None,
    ):
        """`sizes`: the square inputs an image may run at (multiples of the largest stride; few and
        fixed, so a GPU warms each shape once at start-up); a graph whose image size is fixed (or
        could not be freed: service/core/models/rebatch.py) runs at its own. `batch_sizes`: the only
        batch sizes the session runs at (`BatchShapes`; YuNet as published fixes 1). A session
        taking uint8 NHWC canvases (service/core/models/in_graph.py, on a GPU) is fed them as they are.
        `fork` (on a GPU): more sessions of the model, one per batch and image size, so no session
        ever changes input shape."""
        self.manifest = manifest
        self.session = session
        self.score_threshold = score_threshold
        self.nms_threshold = nms_threshold
        self.min_face_size = min_face_size
        self.top_k = top_k
        self.input_name = manifest.input.name
        self.output_names = [f"{kind}_{s}" for s in STRIDES for kind in ("cls", "obj", "bbox", "kps")]
        spec = session.get_inputs()[0]
        self.uint8_input = spec.type == "tensor(uint8)"
        width = spec.shape[2] if self.uint8_input else spec.shape[3]
        self.sizes = (manifest.input.width,) if isinstance(width, int) or not sizes else tuple(sorted(set(sizes)))
        self._grids = {size: self._grid(size) for size in self.sizes}
        self.shapes = BatchShapes.for_model(spec.shape[0], batch_sizes)
        self.sessions = {(n, size): fork() for n in self.shapes.sizes for size in self.sizes} if fork else {}

    @staticmethod
    def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
        """Anchor-free grid of every stride's outputs in turn: each row's cell (col, row) of its
        stride, row-major, and that stride."""
        cells, strides = [], []
        for stride in STRIDES:
            axis = np.arange(size // stride, dtype=np.float32)
            xs, ys = np.meshgrid(axis, axis)
            cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
            strides.append(np.full((xs.size, 1), stride, np.float32))
        return np.concatenate(cells), np.concatenate(strides)

    def size_for(self, image_size: tuple[int, int]) -> int:
        """The smallest size holding the image's longer side, else the largest (with 320/480/640: an
        image of at most 320 px runs at 320 rather than upscaled to 640, a larger one shrinks to 640)."""
        longer = max(image_size)
        return next((s for s in self.sizes if s >= longer), self.sizes[-1])

    def letterbox(self, image: np.ndarray, size: int | None = None) -> tuple[np.ndarray, float]:
        """Scale to fit a square network input (`size_for` the image unless given) keeping the
        aspect ratio; pad right/bottom with black. `scale` maps results back. The resized image is
        the canvas when it fills it (a square photo), else padded by OpenCV: no zeroed canvas
        written over (docs/sizing.md#the-cpu-budget-per-image)."""
        h, w = image.shape[:2]
        size = size or self.size_for((h, w))
        scale = min(size / w, size / h)
        new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
        interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
        resized = cv2.resize(image, (new_w, new_h), interpolation=interp)
        if (new_w, new_h) == (size, size):
            return resized, scale
        return cv2.copyMakeBorder(resized, 0, size - new_h, 0, size - new_w, cv2.BORDER_CONSTANT, value=(0, 0, 0)), scale

    def infer(self, canvases: np.ndarray) -> list[np.ndarray]:
        """N letterboxed BGR canvases of one size → each one's candidates (CANDIDATE columns, in
        canvas pixels, before NMS): a few hundred bytes an image instead of the network's dense
        outputs, so a micro-batcher (or the model host, over a socket) hands each image its own; run
        at the detector's batch shapes."""
        return self.shapes.run(self._run, canvases)

    def _run(self, canvases: np.ndarray) -> list[np.ndarray]:
        blob = canvases if self.uint8_input else _nchw_float32(canvases)
        session = self.sessions.get((len(canvases), canvases.shape[1]), self.session)
        outputs = dict(zip(self.output_names, session.run(self.output_names, {self.input_name: blob}), strict=True))
        return self._candidates(outputs, canvases.shape[1], len(canvases))

    def _candidates(self, outputs: dict[str, np.ndarray], size: int, n: int) -> list[np.ndarray]:
        """The anchors scoring at least the threshold, decoded for the whole batch at once (the
        strides' outputs side by side: one pass, not one a stride), then split by image: each
        image's candidates stride by stride, as that image alone gives them."""
        side = {kind: np.concatenate([outputs[f"{kind}_{stride}"] for stride in STRIDES], axis=1) for kind in ("cls", "obj", "bbox", "kps")}
        score = np.sqrt(np.clip(side["cls"][..., 0], 0, 1) * np.clip(side["obj"][..., 0], 0, 1))
        image, anchor = np.nonzero(score >= self.score_threshold)  # image by image: row-major
        cells, strides = self._grids[size]
        grid, stride = cells[anchor], strides[anchor]
        bbox = side["bbox"][image, anchor]
        centre = (grid + bbox[:, :2]) * stride
        extent = np.exp(bbox[:, 2:4]) * stride
        landmarks = (side["kps"][image, anchor].reshape(-1, 5, 2) + grid[:, None, :]) * stride[:, None, :]
        found = np.concatenate([score[image, anchor][:, None], centre - extent / 2, extent, landmarks.reshape(-1, 10)], axis=1)
        return np.split(found.astype(np.float32), np.searchsorted(image, np.arange(1, n)))

    def detect(self, image_bgr: np.ndarray) -> list[Face]:
        """Faces sorted by box area, largest first."""
        canvas, scale = self.letterbox(image_bgr)
        return self.faces(self.infer(canvas[None])[0], scale, image_bgr.shape[:2])

    def faces(self, candidates: np.ndarray, scale: float, image_size: tuple[int, int]) -> list[Face]:
        """One image's candidates from `infer` → its faces in image pixels (through the letterbox's
        scale) after non-maximum suppression, sorted by box area, largest first."""
        if len(candidates) == 0:
            return []
        scores, boxes, landmarks = candidates[:, 0], candidates[:, 1:5], candidates[:, 5:].reshape(-1, 5, 2)
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


def _nchw_float32(canvases: np.ndarray) -> np.ndarray:
    """N×H×W×3 uint8 → N×3×H×W float32, each channel split out by OpenCV then widened as one
    contiguous plane: half the CPU of numpy's strided transpose-and-convert (the model host's, a run)."""
    blob = np.empty((canvases.shape[0], 3, *canvases.shape[1:3]), np.float32)
    for canvas, planes in zip(canvases, blob, strict=True):
        for plane, channel in zip(planes, cv2.split(canvas), strict=True):
            plane[...] = channel
    return blob
