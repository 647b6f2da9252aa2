"""The one face alignment used by training, export and serving: a least-squares similarity
transform from the five detected landmarks onto a model's template (its manifest names it)."""

from __future__ import annotations

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
TEMPLATES = {"arcface_112": (ARCFACE_112, 112), "dlib_150": (DLIB_150, 150)}


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """2×3 matrix of the rotation, uniform scale and translation that maps src onto dst with the
    least squared error (Umeyama 1991). OpenCV's estimateAffinePartial2D is robust-fit (RANSAC/
    LMedS), not least squares, so five clean landmarks are solved in closed form here."""
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    cov = dst_c.T @ src_c / len(src)
    u, singular, vt = np.linalg.svd(cov)
    d = np.ones(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        d[-1] = -1  # a reflection is not a similarity: flip the weakest axis
    rotation = u @ np.diag(d) @ vt
    src_var = (src_c**2).sum() / len(src)
    scale = (singular * d).sum() / src_var if src_var > 0 else 1.0
    matrix = np.empty((2, 3))
    matrix[:, :2] = scale * rotation
    matrix[:, 2] = dst_mean - scale * rotation @ src_mean
    return matrix


def align_face(image_bgr: np.ndarray, landmarks: np.ndarray, template: str = "arcface_112") -> np.ndarray:
    """Warp the face onto the template: uint8 RGB, size × size."""
    points, size = TEMPLATES[template]
    matrix = similarity_transform(landmarks, points)
    crop = cv2.warpAffine(image_bgr, matrix, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    return cv2.cvtColor(crop, cv2.COLOR_BGR2RGB)
