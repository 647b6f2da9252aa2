"""CompreFace's own Python SDK (`compreface-sdk`, as Viseron uses it), unchanged, against a running
facegate: add → list → recognize → verify (two images, and against a stored face) → delete. Run by
test_real_clients.py in the clients' Python: drive_compreface_sdk.py URL PORT KEY EXAMPLES."""

import sys
from pathlib import Path

from compreface import CompreFace

url, port, key, examples = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
compre_face = CompreFace(url, port, {"prediction_count": 1})
recognition = compre_face.init_face_recognition(key)
faces = recognition.get_face_collection()

added = faces.add(str(examples / "knn_examples/train/obama/obama.jpg"), "obama")
assert added["subject"] == "obama" and added["image_id"], added
assert faces.add(str(examples / "knn_examples/train/biden/biden.jpg"), "biden")["subject"] == "biden"
listed = faces.list()
assert sorted(f["subject"] for f in listed["faces"]) == ["biden", "obama"] and listed["total_elements"] == 2, listed
assert sorted(recognition.get_subjects().list()["subjects"]) == ["biden", "obama"]

(result,) = recognition.recognize(str(examples / "knn_examples/test/obama1.jpg"))["result"]
best = result["subjects"][0]
assert (
    best["subject"] == "obama" and best["similarity"] >= 0.5 and set(result["box"]) >= {"x_min", "y_min", "x_max", "y_max", "probability"}
), result
(stranger,) = recognition.recognize(str(examples / "lin-manuel-miranda.png"))["result"]
assert stranger["subjects"][0]["similarity"] < 0.5, stranger

verification = compre_face.init_face_verification(key)
same = verification.verify(str(examples / "knn_examples/train/obama/obama.jpg"), str(examples / "knn_examples/train/obama/obama2.jpg"))
assert same["result"][0]["face_matches"][0]["similarity"] >= 0.5, same
other = verification.verify(str(examples / "knn_examples/train/obama/obama.jpg"), str(examples / "knn_examples/train/biden/biden.jpg"))
assert other["result"][0]["face_matches"][0]["similarity"] < 0.5, other

# a photo against a stored face (recognition/faces/{image_id}/verify)
(match,) = faces.verify(str(examples / "knn_examples/train/obama/obama2.jpg"), added["image_id"])["result"]
assert match["subject"] == "obama" and match["similarity"] >= 0.5, match
(mismatch,) = faces.verify(str(examples / "knn_examples/train/biden/biden.jpg"), added["image_id"])["result"]
assert mismatch["similarity"] < 0.5, mismatch

assert faces.delete(added["image_id"]) == {"image_id": added["image_id"], "subject": "obama"}
assert [f["subject"] for f in faces.list()["faces"]] == ["biden"]
assert recognition.get_subjects().delete("biden") == {"subject": "biden"}
print("compreface-sdk: ok")
