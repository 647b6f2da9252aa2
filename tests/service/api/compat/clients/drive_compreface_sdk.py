"""CompreFace's own Python SDK (`compreface-sdk`, as Viseron uses it), unchanged, against a running
facegate: add → list → recognize → verify (two images, and against a stored face) → delete → rename
(and its merge) → delete all, with
subjects as CompreFace names them (spaces, one subject whatever its case), and its answers to a
wrong key and to an unknown subject. Run by test_real_clients.py in the clients' Python:
drive_compreface_sdk.py URL PORT KEY EXAMPLES."""

import sys
from pathlib import Path

from compreface import CompreFace

url, port, key, examples = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
compre_face = CompreFace(url, port, {"prediction_count": 1})
recognition = compre_face.init_face_recognition(key)
faces = recognition.get_face_collection()
subjects = recognition.get_subjects()

added = faces.add(str(examples / "knn_examples/train/obama/obama.jpg"), "Barack Obama")
assert added["subject"] == "Barack Obama" and added["image_id"], added
# one subject whatever its case, answered as sent
assert faces.add(str(examples / "knn_examples/train/obama/obama2.jpg"), "barack obama")["subject"] == "barack obama"
assert faces.add(str(examples / "knn_examples/train/biden/biden.jpg"), "Joe Biden")["subject"] == "Joe Biden"
listed = faces.list()
assert sorted(f["subject"] for f in listed["faces"]) == ["Barack Obama", "Barack Obama", "Joe Biden"], listed
assert listed["total_elements"] == 3, listed
assert sorted(subjects.list()["subjects"]) == ["Barack Obama", "Joe Biden"]
assert subjects.add("JOE BIDEN") == {"message": "Subject already exists", "code": "subject_exists"}

(result,) = recognition.recognize(str(examples / "knn_examples/test/obama1.jpg"))["result"]
best = result["subjects"][0]
assert best["subject"] == "Barack Obama" and best["similarity"] >= 0.5, result
assert set(result["box"]) >= {"x_min", "y_min", "x_max", "y_max", "probability"}, result
assert "execution_time" not in result, result  # only with status=true, as CompreFace
(stranger,) = recognition.recognize(str(examples / "lin-manuel-miranda.png"))["result"]
assert stranger["subjects"][0]["similarity"] < 0.5, stranger

verification = compre_face.init_face_verification(key)
same = verification.verify(str(examples / "knn_examples/train/obama/obama.jpg"), str(examples / "knn_examples/train/obama/obama2.jpg"))
assert same["result"][0]["face_matches"][0]["similarity"] >= 0.5, same
other = verification.verify(str(examples / "knn_examples/train/obama/obama.jpg"), str(examples / "knn_examples/train/biden/biden.jpg"))
assert other["result"][0]["face_matches"][0]["similarity"] < 0.5, other

# a photo against a stored face (recognition/faces/{image_id}/verify)
(match,) = faces.verify(str(examples / "knn_examples/train/obama/obama2.jpg"), added["image_id"])["result"]
assert match["subject"] == "Barack Obama" and match["similarity"] >= 0.5, match
(mismatch,) = faces.verify(str(examples / "knn_examples/train/biden/biden.jpg"), added["image_id"])["result"]
assert mismatch["similarity"] < 0.5, mismatch

# one face deleted: its subject stays; all of them: the subject goes; an unknown subject: nothing
assert faces.delete(added["image_id"]) == {"image_id": added["image_id"], "subject": "Barack Obama"}
assert "Barack Obama" in subjects.list()["subjects"]
assert faces.delete_all("BARACK OBAMA") == {"deleted": 1}
assert subjects.list()["subjects"] == ["Joe Biden"]
assert faces.delete_all("Nobody") == {"deleted": 0}
assert [f["subject"] for f in faces.list()["faces"]] == ["Joe Biden"]
assert subjects.delete("joe biden") == {"subject": "Joe Biden"}  # the name as stored

# a rename; onto a name another subject holds (whatever its case), a merge, as CompreFace does
assert faces.add(str(examples / "knn_examples/train/obama/obama.jpg"), "Obama")["subject"] == "Obama"
assert faces.add(str(examples / "knn_examples/train/obama/obama2.jpg"), "Barack")["subject"] == "Barack"
assert subjects.update("Barack", "OBAMA") == {"updated": True}
assert subjects.list()["subjects"] == ["Obama"] and len(faces.list()["faces"]) == 2
assert subjects.update("Obama", "Barack Obama") == {"updated": True}
assert subjects.list()["subjects"] == ["Barack Obama"]
assert subjects.delete_all() == {"deleted": 1} and faces.list()["faces"] == []

wrong = CompreFace(url, port).init_face_recognition("wrong-key").get_subjects().list()
assert wrong["code"] == 10 and wrong["message"], wrong  # CompreFace's shape, which its users log
print("compreface-sdk: ok")
