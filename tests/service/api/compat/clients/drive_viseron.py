"""Viseron's `compreface` component is no library, but it drives CompreFace through `compreface-sdk`:
this makes the calls it makes (viseron/components/compreface/face_recognition.py, read, not copied),
through that SDK unchanged, against a running facegate. Its options are its defaults (limit 0,
det_prob_threshold 0.8, prediction_count 1, status False; face_plugins unset), images are JPEG bytes,
and a face is known where subjects[0].similarity ≥ its similarity_threshold, 0.5. Run by
test_real_clients.py in the clients' Python: drive_viseron.py URL PORT KEY EXAMPLES."""

import io
import sys
from pathlib import Path

from compreface import CompreFace
from PIL import Image

url, port, key, examples = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
SIMILARITY_THRESHOLD = 0.5
options = {"limit": 0, "det_prob_threshold": 0.8, "prediction_count": 1, "status": False}
recognition = CompreFace(domain=url, port=port, options=options).init_face_recognition(key)
blank = io.BytesIO()
Image.new("RGB", (240, 240), (128, 128, 128)).save(blank, "JPEG")
# its train folder: a folder per subject, named as the person is, each photo sent as JPEG bytes
train = {
    "Barack Obama": [(examples / "knn_examples/train/obama" / n).read_bytes() for n in ("obama.jpg", "obama2.jpg")],
    "Joe Biden": [(examples / "knn_examples/train/biden" / n).read_bytes() for n in ("biden.jpg", "biden2.jpg")] + [blank.getvalue()],
}


def train_all() -> tuple[int, list]:
    """CompreFaceTrain.train: per subject, delete_all then add each photo; an answer with a
    `message` is a photo "not suitable for training" (logged). Returns how many were, and what
    each delete_all answered."""
    collection = recognition.get_face_collection()
    unsuitable, cleared = 0, []
    for subject, photos in train.items():
        cleared.append(collection.delete_all(subject))
        for photo in photos:
            unsuitable += "message" in collection.add(image_path=photo, subject=subject)
    return unsuitable, cleared


# the blank photo: CompreFace's 400 {"message", "code": 28}; the first run clears subjects no one has yet
assert train_all() == (1, [{"deleted": 0}, {"deleted": 0}])
assert train_all() == (1, [{"deleted": 2}, {"deleted": 2}])
assert recognition.get_face_collection().list()["total_elements"] == 4  # training again on restart replaces
assert sorted(recognition.get_subjects().list()["subjects"]) == ["Barack Obama", "Joe Biden"]  # use_subjects

found = {}
for photo in ("knn_examples/test/obama1.jpg", "knn_examples/test/obama_and_biden.jpg", "lin-manuel-miranda.png"):
    detections = recognition.recognize((examples / photo).read_bytes())
    assert "result" in detections, detections
    for result in detections["result"]:
        subject = result["subjects"][0]
        known = subject["similarity"] >= SIMILARITY_THRESHOLD
        assert all(isinstance(result["box"][k], int) for k in ("x_min", "y_min", "x_max", "y_max")), result
        found.setdefault(photo, []).append(subject["subject"] if known else "unknown")
assert found["knn_examples/test/obama1.jpg"] == ["Barack Obama"], found
assert {"Barack Obama", "Joe Biden"} <= set(found["knn_examples/test/obama_and_biden.jpg"]), found
assert found["lin-manuel-miranda.png"] == ["unknown"], found
print("viseron (compreface-sdk): ok")
