"""Is a face good enough to be a template? Enrollment's quality gate, measured on what the pipeline
already has: the detection (score, box, YuNet's five landmarks) and the aligned chip. A bad
template costs every later probe of that person, so enrollment refuses it; a probe is never gated
(its one answer is all it costs). Thresholds and what each check costs and saves on LFW and the
training crops: docs/api.md#enrollment-quality, measured by benchmarks/enroll_quality.py."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from service.core.models.detector import Face
from service.core.settings import Settings

SHARPNESS_SIDE = 112  # the chip is measured at this size, so one threshold holds for every template


@dataclass(frozen=True)
class FaceQuality:
    """score: the detector's. side: the box's short side (px of the image as sent). yaw: the nose
    tip's offset from the eyes' midpoint along the eye line, in eye distances (0 frontal, about 0.5
    a half profile). roll: the eye line's angle (degrees). sharpness: variance of the Laplacian of
    the aligned chip's grey levels at 112×112. brightness: mean grey level (0–255) of its centre."""

    score: float
    side: float
    yaw: float
    roll: float
    sharpness: float
    brightness: float


@dataclass(frozen=True)
class QualityProblem:
    """One failed check: its name (the API's `check`), the measure and the limit it missed."""

    check: str
    value: float
    limit: float
    message: str

    def detail(self) -> dict:
        return {"check": self.check, "value": round(self.value, 3), "limit": self.limit}


def chip_measures(crop_rgb: np.ndarray) -> tuple[float, float]:
    """(sharpness, brightness) of an aligned RGB chip."""
    grey = cv2.cvtColor(np.ascontiguousarray(crop_rgb), cv2.COLOR_RGB2GRAY)
    grey = cv2.resize(grey, (SHARPNESS_SIDE, SHARPNESS_SIDE), interpolation=cv2.INTER_AREA)
    q = SHARPNESS_SIDE // 4
    return float(cv2.Laplacian(grey, cv2.CV_64F).var()), float(grey[q:-q, q:-q].mean())


def measure(face: Face, crop_rgb: np.ndarray) -> FaceQuality:
    """The measures of a detected face and its aligned chip."""
    right_eye, left_eye, nose = (face.landmarks[i].astype(np.float64) for i in range(3))
    eyes = left_eye - right_eye
    eye_distance = max(float(np.hypot(*eyes)), 1e-6)
    yaw = float(np.dot(nose - (right_eye + left_eye) / 2, eyes / eye_distance) / eye_distance)
    sharpness, brightness = chip_measures(crop_rgb)
    return FaceQuality(
        score=face.score,
        side=float(min(face.width, face.height)),
        yaw=yaw,
        roll=float(np.degrees(np.arctan2(eyes[1], eyes[0]))),
        sharpness=sharpness,
        brightness=brightness,
    )


def problems(q: FaceQuality, settings: Settings) -> list[QualityProblem]:
    """Every check the face fails, in the order a person would fix them (an empty list passes)."""
    s = settings
    checks = [
        ("too_small", q.side < s.enroll_min_face_size, q.side, s.enroll_min_face_size,
         f"the face is {q.side:.0f} px on its short side; enrollment needs at least {s.enroll_min_face_size}"),
        ("low_detection_score", q.score < s.enroll_min_score, q.score, s.enroll_min_score,
         f"the face's detection score {q.score:.2f} is below the enrollment minimum {s.enroll_min_score}"),
        ("not_frontal", abs(q.yaw) > s.enroll_max_yaw, abs(q.yaw), s.enroll_max_yaw,
         f"the face is turned aside (nose {abs(q.yaw):.2f} eye distances off centre; at most {s.enroll_max_yaw}): face the camera"),
        ("tilted", abs(q.roll) > s.enroll_max_roll, abs(q.roll), s.enroll_max_roll,
         f"the head is tilted {abs(q.roll):.0f}°; enrollment takes at most {s.enroll_max_roll:g}°"),
        ("too_blurred", q.sharpness < s.enroll_min_sharpness, q.sharpness, s.enroll_min_sharpness,
         f"the face is too blurred (sharpness {q.sharpness:.1f}; enrollment needs at least {s.enroll_min_sharpness:g})"),
        ("too_dark", q.brightness < s.enroll_min_brightness, q.brightness, s.enroll_min_brightness,
         f"the face is too dark (brightness {q.brightness:.0f} of 255; enrollment needs at least {s.enroll_min_brightness:g})"),
    ]  # fmt: skip
    return [QualityProblem(name, value, limit, message) for name, failed, value, limit, message in checks if failed]
