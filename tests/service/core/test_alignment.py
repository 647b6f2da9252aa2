import cv2
import numpy as np

from service.core.alignment import ARCFACE_112, DLIB_150, align_face, similarity_transform


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


def _umeyama_svd(src, dst):
    """Umeyama's least-squares similarity through the SVD, as alignment.py computed it before its
    closed form: the reference the closed form must equal."""
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    u, singular, vt = np.linalg.svd(dst_c.T @ src_c / len(src))
    d = np.array([1.0, -1.0 if np.linalg.det(u) * np.linalg.det(vt) < 0 else 1.0])
    rotation = u @ np.diag(d) @ vt
    scale = (singular * d).sum() / ((src_c**2).sum() / len(src))
    return np.hstack([scale * rotation, (dst_mean - scale * rotation @ src_mean)[:, None]])


def test_closed_form_equals_umeyama_svd_mirrored_points_included():
    rng = np.random.default_rng(5)
    for i in range(300):
        landmarks = rng.normal(0, 40, (5, 2)) + rng.uniform(-300, 300, 2)
        if i % 3 == 0:
            landmarks[:, 0] *= -1  # a mirrored face: the best fit is still a rotation, not a reflection
        for template in (ARCFACE_112, DLIB_150):
            matrix = similarity_transform(landmarks.astype(np.float32), template)
            reference = _umeyama_svd(landmarks.astype(np.float32).astype(np.float64), template)
            assert np.allclose(matrix, reference, rtol=1e-9, atol=1e-9)
            assert np.linalg.det(matrix[:, :2]) > 0


def test_landmarks_on_one_spot_give_a_shift_only():
    matrix = similarity_transform(np.full((5, 2), 7.0), ARCFACE_112)
    assert np.allclose(matrix, [[1, 0, ARCFACE_112[:, 0].mean() - 7], [0, 1, ARCFACE_112[:, 1].mean() - 7]])
