"""The one face alignment used by training, export and serving: a least-squares similarity
transform from the five detected landmarks onto a model's template (its manifest names it).

A loose chip (`loose_chip`) keeps what re-alignment onto any other template needs: a
similarity-normalized crop with room around the face, and the landmarks mapped into it."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

# Order: subject's right eye, left eye, nose tip, right mouth corner, left mouth corner —
# the order the detector emits (the subject's right eye is the one on the image's left).
ARCFACE_112 = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ],
    dtype=np.float64,
)
# Where YuNet's five points fall in dlib's 150×150 face chip (padding 0.25 around dlib's own 5-point
# shape), measured as the per-coordinate median over 300 photos of the training set (not LFW):
# dlib's chip mapping applied to YuNet's points. Median absolute deviation 2.0–3.2 px per coordinate.
# `scripts/measure_dlib_template.py` repeats the measurement.
DLIB_150 = np.array(
    [
        [47.0008, 45.4942],
        [101.7544, 45.4297],
        [73.7201, 76.3793],
        [51.4818, 101.2573],
        [98.2415, 100.9049],
    ],
    dtype=np.float64,
)
# The loose frame: the ArcFace 112×112 region scaled to 192 px and centred in a 320×320 chip, so the
# face fills the central 60% and any model's template region (tighter or looser) lies inside, with
# the eyes 60 px apart: more than any template here asks for (dlib_150: 55), so no model is served
# an upsampled face.
LOOSE = "loose_320"
LOOSE_320 = (ARCFACE_112 - 55.5) * (192 / 112) + 159.5  # pixel centres: [-0.5, 111.5] → [63.5, 255.5]
TEMPLATES = {"arcface_112": (ARCFACE_112, 112), "dlib_150": (DLIB_150, 150), LOOSE: (LOOSE_320, 320)}


def model_templates() -> tuple[str, ...]:
    """The templates an embedder manifest may name as its `alignment` (every one but the loose frame)."""
    return tuple(name for name in TEMPLATES if name != LOOSE)


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """2×3 matrix of the rotation, uniform scale and translation that maps src onto dst with the
    least squared error (Umeyama 1991). In 2-D Umeyama's SVD has a closed form: a similarity is a
    complex factor s·e^(iθ), and the best one is Σ conj(p)·q / Σ |p|² over the centred points p of
    src and q of dst (a rotation always, as Umeyama's with its reflection flip). Five points are
    summed in plain floats: numpy's per-call cost was most of the SVD version's ~100 µs
    (docs/sizing.md#the-cpu-budget-per-image). OpenCV's estimateAffinePartial2D is a robust fit
    (RANSAC/LMedS), not least squares."""
    src_points = np.asarray(src, dtype=np.float64).tolist()
    dst_points = np.asarray(dst, dtype=np.float64).tolist()
    n = len(src_points)
    src_x, src_y = (sum(axis) / n for axis in zip(*src_points, strict=True))
    dst_x, dst_y = (sum(axis) / n for axis in zip(*dst_points, strict=True))
    var = dot = cross = 0.0
    for (x, y), (u, v) in zip(src_points, dst_points, strict=True):
        x, y, u, v = x - src_x, y - src_y, u - dst_x, v - dst_y
        var += x * x + y * y
        dot += x * u + y * v
        cross += x * v - y * u
    # every point on one spot: no rotation or scale to fit, a shift only
    cos, sin = (dot / var, cross / var) if var > 0 else (1.0, 0.0)
    return np.array([[cos, -sin, dst_x - cos * src_x + sin * src_y], [sin, cos, dst_y - sin * src_x - cos * src_y]])


def _warp(image: np.ndarray, landmarks: np.ndarray, template: str) -> tuple[np.ndarray, np.ndarray]:
    """The image warped onto the template (channel order kept), and the 2×3 matrix used."""
    points, size = TEMPLATES[template]
    matrix = similarity_transform(landmarks, points)
    crop = cv2.warpAffine(image, matrix, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    return crop, matrix


def align_face(image_bgr: np.ndarray, landmarks: np.ndarray, template: str = "arcface_112") -> np.ndarray:
    """Warp the face onto the template: uint8 RGB, size × size."""
    crop, _ = _warp(image_bgr, landmarks, template)
    return cv2.cvtColor(crop, cv2.COLOR_BGR2RGB)


@dataclass(frozen=True)
class FaceChip:
    """An RGB image of one face and its five landmarks in that image's coordinates: enough to align
    the face onto any template. `frame` names the template the chip was cut to (LOOSE for a detected
    face; a model's template for an upload already aligned for it)."""

    image: np.ndarray  # uint8 RGB, H×W×3
    landmarks: np.ndarray  # 5×2, float64, same order as the detector's
    frame: str

    def align(self, template: str) -> np.ndarray:
        """The face re-aligned onto the template: uint8 RGB, size × size (as align_face on the original)."""
        crop, _ = _warp(self.image, self.landmarks, template)
        return crop


def loose_chip(image_bgr: np.ndarray, landmarks: np.ndarray) -> FaceChip:
    """The face's loose 320×320 chip and its landmarks mapped into it."""
    chip, matrix = _warp(image_bgr, landmarks, LOOSE)
    points = np.asarray(landmarks, np.float64) @ matrix[:, :2].T + matrix[:, 2]
    return FaceChip(cv2.cvtColor(chip, cv2.COLOR_BGR2RGB), points, LOOSE)


def template_chip(crop_rgb: np.ndarray, template: str) -> FaceChip:
    """A crop already aligned onto the template (an aligned upload, or a crop stored before loose
    chips): the template's points are its landmarks."""
    points, size = TEMPLATES[template]
    if crop_rgb.shape[:2] != (size, size):
        raise ValueError(f"a {template} crop is {size}x{size}, got {crop_rgb.shape[1]}x{crop_rgb.shape[0]}")
    return FaceChip(crop_rgb, points.copy(), template)
