"""Enrollment's quality measures on synthetic faces: each check fires on the defect it names and
on nothing else (the API test, tests/service/api/test_routes.py, runs them on LFW photos)."""

import cv2
import numpy as np
import pytest

from service.core.alignment import ARCFACE_112
from service.core.models.detector import Face
from service.core.quality import measure, problems
from service.core.settings import Settings


def _face(angle: float = 0.0, nose_shift: float = 0.0, score: float = 0.95) -> Face:
    """ARCFACE_112's landmarks at twice the size, the nose moved `nose_shift` eye distances along the
    eye line, turned `angle` degrees about their centre."""
    points = ARCFACE_112.astype(np.float64) * 2 + 100
    eye_distance = float(points[1, 0] - points[0, 0])
    points[2, 0] += nose_shift * eye_distance
    centre = points.mean(axis=0)
    turn = np.radians(angle)
    rotation = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]])
    points = (points - centre) @ rotation.T + centre
    return Face(box=np.array([80, 80, 320, 340], np.float32), landmarks=points.astype(np.float32), score=score)


@pytest.fixture(scope="module")
def chip() -> np.ndarray:
    """A textured 150×150 chip of mid brightness (detail like a sharp face's)."""
    noise = np.random.default_rng(5).normal(128, 40, (150, 150, 3))
    return np.clip(cv2.GaussianBlur(noise, (0, 0), 0.8), 0, 255).astype(np.uint8)


def _checks(face: Face, chip: np.ndarray) -> list[str]:
    return [p.check for p in problems(measure(face, chip), Settings())]


def test_a_good_face_passes(chip):
    q = measure(_face(), chip)
    assert abs(q.yaw) < 0.01 and abs(q.roll) < 1 and q.side == 240  # the template's eyes are nearly level
    assert _checks(_face(), chip) == []


def test_each_check_names_its_defect(chip):
    assert _checks(_face(nose_shift=0.5), chip) == ["not_frontal"]
    assert _checks(_face(nose_shift=-0.5), chip) == ["not_frontal"]
    assert _checks(_face(angle=30), chip) == ["tilted"]
    assert _checks(_face(angle=30, nose_shift=0.2), chip) == ["tilted"]  # yaw is read along the eye line, whatever the tilt
    assert _checks(_face(score=0.5), chip) == ["low_detection_score"]
    assert _checks(_face(), cv2.GaussianBlur(chip, (0, 0), 3)) == ["too_blurred"]
    dim = cv2.convertScaleAbs(chip, alpha=1.0, beta=-95)  # as dark, as much detail
    assert _checks(_face(), dim) == ["too_dark"]


def test_a_refusal_says_what_and_by_how_much(chip):
    (problem,) = problems(measure(_face(nose_shift=0.6), chip), Settings())
    assert problem.detail() == {"check": "not_frontal", "value": pytest.approx(0.6, abs=0.01), "limit": 0.4}
    assert "turned aside" in problem.message
