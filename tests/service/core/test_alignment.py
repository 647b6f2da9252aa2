import cv2
import numpy as np

from service.core.alignment import ARCFACE_112, align_face, similarity_transform


def _apply(matrix, points):
    return points @ matrix[:, :2].T + matrix[:, 2]


def test_template_maps_to_itself():
    matrix = similarity_transform(ARCFACE_112, ARCFACE_112)
    assert np.allclose(matrix, [[1, 0, 0], [0, 1, 0]], atol=1e-9)


def test_known_similarity_is_recovered():
    rng = np.random.default_rng(3)
    for _ in range(20):
        angle, scale = rng.uniform(-np.pi, np.pi), rng.uniform(0.2, 5)
        shift = rng.uniform(-300, 300, 2)
        rot = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        landmarks = (ARCFACE_112 - shift) @ np.linalg.inv(rot).T  # so that rot·p + shift = template
        matrix = similarity_transform(landmarks, ARCFACE_112)
        assert np.abs(_apply(matrix, landmarks) - ARCFACE_112).max() < 1e-3
        assert np.allclose(matrix[:, :2], rot, atol=1e-9)


def test_noisy_landmarks_give_the_least_squares_fit():
    rng = np.random.default_rng(4)
    landmarks = ARCFACE_112 * 2 + 40 + rng.normal(0, 2, ARCFACE_112.shape)
    matrix = similarity_transform(landmarks, ARCFACE_112)
    best = np.square(_apply(matrix, landmarks) - ARCFACE_112).sum()
    for _ in range(200):  # no nearby similarity does better
        delta = np.zeros((2, 3))
        a, b = rng.normal(0, 1e-3, 2)
        delta[:, :2] = [[a, -b], [b, a]]
        delta[:, 2] = rng.normal(0, 1e-2, 2)
        assert np.square(_apply(matrix + delta, landmarks) - ARCFACE_112).sum() >= best - 1e-9


def test_align_face_outputs_rgb_crop_with_points_on_template():
    image = np.zeros((400, 300, 3), np.uint8)
    landmarks = ARCFACE_112 * 2 + [50, 80]
    for x, y in landmarks:
        cv2.circle(image, (int(round(x)), int(round(y))), 3, (255, 0, 0), -1)  # blue in BGR
    crop = align_face(image, landmarks)
    assert crop.shape == (112, 112, 3) and crop.dtype == np.uint8
    for x, y in ARCFACE_112:
        pixel = crop[int(round(y)), int(round(x))]
        assert pixel[2] > 200 and pixel[0] < 50  # blue dot lands on the template point, in RGB order
