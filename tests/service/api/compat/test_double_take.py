"""Double Take's requests, replayed: it is in no registry, so these are the calls its detectors make,
written by us from reading its source (jakowenko/double-take and the maintained skrashevich/double-take
fork, `api/src/util/detectors/`), byte for byte where it matters (paths, query strings, multipart
field names in its order, headers), and the checks are the fields its `normalize` reads. Double Take
uses axios with form-data: a file part is named after the snapshot's file, typed by its extension."""

from __future__ import annotations

import secrets

import cv2
import numpy as np
import pytest
from pydantic import SecretStr

pytestmark = pytest.mark.data

KEY = "double-take-key"
# Double Take's defaults (`api/src/constants/defaults.js`): detect.match.confidence 60 and
# min_area 10000, detect.unknown.confidence 40; a detector's confidence is similarity × 100.
MATCH_CONFIDENCE, MATCH_MIN_AREA, UNKNOWN_CONFIDENCE = 60, 10_000, 40


@pytest.fixture
def examples(test_data):
    return test_data / "tests" / "face_recognition" / "examples"


@pytest.fixture
def served(model_cache, tmp_path, make_client):
    from service.core.settings import Settings

    def make(keys: str = KEY):
        return make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu", api_keys=SecretStr(keys)))

    return make


def form_data(*parts: tuple) -> tuple[bytes, dict]:
    """A multipart body as the form-data package builds it: parts in append order, a file part
    with the file's base name and its extension's type; (name, value) or (name, filename, bytes)."""
    boundary = "-" * 26 + "".join(secrets.choice("0123456789") for _ in range(24))
    body = b""
    for name, *rest in parts:
        if len(rest) == 1:
            head = f'Content-Disposition: form-data; name="{name}"\r\n'
            content = rest[0].encode()
        else:
            filename, content = rest
            kind = "image/png" if filename.endswith(".png") else "image/jpeg"
            head = f'Content-Disposition: form-data; name="{name}"; filename="{filename}"\r\nContent-Type: {kind}\r\n'
        body += f"--{boundary}\r\n{head}\r\n".encode() + content + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), {"content-type": f"multipart/form-data; boundary={boundary}"}


def snapshot(examples, name: str) -> tuple[str, bytes]:
    return name.rsplit("/", 1)[-1], (examples / name).read_bytes()


def blank() -> tuple[str, bytes]:
    return "blank.jpg", cv2.imencode(".jpg", np.full((240, 240, 3), 128, np.uint8))[1].tobytes()


def match_of(confidence: float, box: dict) -> bool:
    """Double Take's `match` for a face: confidence (%) and box area over its defaults."""
    return confidence >= MATCH_CONFIDENCE and (box["x_max"] - box["x_min"]) * (box["y_max"] - box["y_min"]) >= MATCH_MIN_AREA


# compreface.js: recognize POSTs `file` to /api/v1/recognition/recognize with x-api-key, the query
# ?face_plugins=${FACE_PLUGINS} (the literal "undefined" when unset, its default) and axios's params
# det_prob_threshold (0.8: its default, and what its detector test sends); train POSTs `file` to
# /api/v1/recognition/faces?subject=<name>; remove DELETEs /api/v1/recognition/faces?subject=<name>.
def cf_recognize(client, image: tuple[str, bytes], plugins: str = "undefined", key: str = KEY):
    body, headers = form_data(("file", *image))
    url = f"/api/v1/recognition/recognize?face_plugins={plugins}&det_prob_threshold=0.8"
    return client.post(url, content=body, headers={**headers, "x-api-key": key})


def cf_train(client, name: str, image: tuple[str, bytes], key: str = KEY):
    body, headers = form_data(("file", *image))
    return client.post("/api/v1/recognition/faces", params={"subject": name}, content=body, headers={**headers, "x-api-key": key})


def cf_remove(client, name: str):
    """compreface.js's remove: what untraining a name sends (every face of the subject), any status accepted."""
    return client.delete("/api/v1/recognition/faces", params={"subject": name}, headers={"x-api-key": KEY})


def cf_subjects(client) -> list[str]:
    return client.get("/api/v1/recognition/subjects", headers={"x-api-key": KEY}).json()["subjects"]


def cf_normalize(answer) -> list[dict]:
    """What compreface.js's normalize reads: no `result` and code 28 is no face; else per face
    subjects[0].subject and .similarity, and the box's corners."""
    data = answer.json()
    if "result" not in data:
        assert data["code"] == 28, data
        return []
    faces = []
    for face in data["result"]:
        best = face["subjects"][0] if face["subjects"] else None
        confidence = round(best["similarity"] * 100, 2) if best else 0
        assert all(isinstance(face["box"][k], int) for k in ("x_min", "y_min", "x_max", "y_max")), face
        name = best["subject"].lower() if best and confidence >= UNKNOWN_CONFIDENCE else "unknown"
        faces.append({"name": name, "confidence": confidence, "match": match_of(confidence, face["box"])})
    return faces


def test_double_take_compreface(served, examples):
    client = served()
    for name, photo in (
        ("obama", "knn_examples/train/obama/obama.jpg"),
        ("obama", "knn_examples/train/obama/obama2.jpg"),
        ("biden", "knn_examples/train/biden/biden.jpg"),
    ):
        trained = cf_train(client, name, snapshot(examples, photo))
        assert trained.status_code == 200 and trained.json()["subject"] == name, trained.text  # axios throws on any other
    # a training image without a face: an error Double Take records against the file
    assert cf_train(client, "obama", blank()).status_code == 400

    for plugins in ("undefined", "mask,gender,age"):  # facegate has no plugins: their fields are absent
        (face,) = cf_normalize(cf_recognize(client, snapshot(examples, "knn_examples/test/obama1.jpg"), plugins))
        assert face["name"] == "obama" and face["match"], face
    (stranger,) = cf_normalize(cf_recognize(client, snapshot(examples, "lin-manuel-miranda.png")))
    assert not stranger["match"], stranger
    both = cf_normalize(cf_recognize(client, snapshot(examples, "knn_examples/test/obama_and_biden.jpg")))
    assert {"obama", "biden"} <= {f["name"] for f in both if f["confidence"] >= MATCH_CONFIDENCE}, both

    no_face = cf_recognize(client, blank())
    assert no_face.status_code == 400 and cf_normalize(no_face) == []  # HTTP 400 with code 28: "no face"

    removed = client.delete("/api/v1/recognition/faces", params={"subject": "obama"}, headers={"x-api-key": KEY})
    assert removed.status_code == 200, removed.text
    (face,) = cf_normalize(cf_recognize(client, snapshot(examples, "knn_examples/test/obama1.jpg")))
    assert not face["match"] and face["name"] != "obama", face
    assert cf_recognize(client, snapshot(examples, "obama.jpg"), key="wrong").status_code == 401


# deepstack.js: multipart forms, parts in this order: recognize `image` [+ `api_key`] to
# /v1/vision/face/recognize; train `image`, `userid` [+ `api_key`] to /v1/vision/face/register;
# remove `userid` [+ `api_key`] to /v1/vision/face/delete. aiserver.js (CodeProject.AI) sends the
# same without `api_key`. Both read success, predictions[].userid (lowercased), .confidence and the
# box corners; a match also needs userid ≠ "unknown".
def ds_post(client, path: str, key: str | None, *parts: tuple):
    body, headers = form_data(*parts, *((("api_key", key),) if key else ()))
    return client.post(f"/v1/vision/face/{path}", content=body, headers=headers)


def ds_normalize(answer) -> list[dict]:
    """What deepstack.js's normalize reads from a successful answer. It reads an error answer
    (`success: false`) as no face too, which would hide any error here: these calls must succeed."""
    data = answer.json()
    assert answer.status_code == 200 and data["success"] is True, answer.text
    faces = []
    for p in data["predictions"]:
        confidence = round(p["confidence"] * 100, 2)
        name = p["userid"].lower() if confidence >= UNKNOWN_CONFIDENCE else "unknown"
        faces.append({"name": name, "confidence": confidence, "match": p["userid"] != "unknown" and match_of(confidence, p)})
    return faces


@pytest.mark.parametrize("detector", ["deepstack", "aiserver"])
def test_double_take_deepstack(served, examples, detector):
    key = KEY if detector == "deepstack" else None
    client = served(KEY if key else "")  # aiserver.js sends no key: facegate without keys
    for name, photo in (("obama", "knn_examples/train/obama/obama.jpg"), ("biden", "knn_examples/train/biden/biden.jpg")):
        trained = ds_post(client, "register", key, ("image", *snapshot(examples, photo)), ("userid", name))
        assert trained.status_code == 200 and trained.json()["success"] is True, trained.text

    (face,) = ds_normalize(ds_post(client, "recognize", key, ("image", *snapshot(examples, "knn_examples/test/obama1.jpg"))))
    assert face["name"] == "obama" and face["match"], face
    (stranger,) = ds_normalize(ds_post(client, "recognize", key, ("image", *snapshot(examples, "lin-manuel-miranda.png"))))
    assert stranger == {"name": "unknown", "confidence": 0, "match": False}, stranger
    no_face = ds_post(client, "recognize", key, ("image", *blank()))  # DeepStack's answer: success, no predictions
    assert no_face.json()["predictions"] == [] and ds_normalize(no_face) == [], no_face.text

    assert ds_post(client, "delete", key, ("userid", "obama")).json()["success"] is True
    (face,) = ds_normalize(ds_post(client, "recognize", key, ("image", *snapshot(examples, "knn_examples/test/obama1.jpg"))))
    assert not face["match"], face
    if key:
        assert ds_post(client, "recognize", "wrong", ("image", *snapshot(examples, "obama.jpg"))).status_code == 401


def test_double_take_compreface_subject_names(served, examples):
    """Issue 36, items 1-4, as Double Take's compreface detector meets them: a name with spaces is
    trained and recognized (lowercased, over its 60 % line, a box over 10,000 px²); the same name in
    another case is the same person; untraining removes the person (subject and all); untraining a
    name never trained is a 200, so delete-then-add retraining works."""
    client = served()
    obama, obama2 = snapshot(examples, "knn_examples/train/obama/obama.jpg"), snapshot(examples, "knn_examples/train/obama/obama2.jpg")
    probe = snapshot(examples, "knn_examples/test/obama1.jpg")
    trained = cf_train(client, "Barack Obama", obama)
    assert trained.status_code == 200 and trained.json()["subject"] == "Barack Obama", trained.text  # item 1: was a 422
    (face,) = cf_normalize(cf_recognize(client, probe))
    assert face["name"] == "barack obama" and face["match"], face
    again = cf_train(client, "BARACK OBAMA", obama2)  # item 2: one person, however it is spelled
    assert again.status_code == 200 and cf_subjects(client) == ["Barack Obama"], again.text
    (stranger,) = cf_normalize(cf_recognize(client, snapshot(examples, "lin-manuel-miranda.png")))
    assert not stranger["match"], stranger

    never = cf_remove(client, "Joe Biden")  # item 4: untraining a name this detector never had
    assert never.status_code == 200 and never.json() == {"deleted": 0}, never.text
    removed = cf_remove(client, "barack obama")  # item 3: the name as Double Take shows it
    assert removed.status_code == 200 and removed.json() == {"deleted": 2}, removed.text
    assert cf_subjects(client) == []  # the subject went with its faces
    (face,) = cf_normalize(cf_recognize(client, probe))
    assert face == {"name": "unknown", "confidence": 0, "match": False}, face  # no subject left to name
    # untrain one file: remove the name, then train the files it keeps
    assert cf_remove(client, "Barack Obama").json() == {"deleted": 0}
    assert cf_train(client, "Barack Obama", obama2).status_code == 200
    (face,) = cf_normalize(cf_recognize(client, probe))
    assert face["name"] == "barack obama" and face["match"], face


def test_double_take_compreface_keys(served, examples):
    """Issue 36, items 5 and 6: a refused key is an error with a `message` Double Take logs (not
    "[object Object]"); facegate without keys takes any non-empty key, which Double Take 1.13.1
    must send (docs/compat.md)."""
    client = served()
    refused = cf_train(client, "obama", snapshot(examples, "obama.jpg"), key="wrong")
    assert refused.status_code == 401 and isinstance(refused.json()["message"], str) and refused.json()["message"], refused.text
    unrecognized = cf_recognize(client, snapshot(examples, "obama.jpg"), key="")
    assert unrecognized.status_code == 401 and unrecognized.json()["message"] == "Missing header: x-api-key"
    open_client = served("")
    assert cf_train(open_client, "obama", snapshot(examples, "obama.jpg"), key="anything").status_code == 200
    (face,) = cf_normalize(cf_recognize(open_client, snapshot(examples, "knn_examples/test/obama1.jpg"), key="anything"))
    assert face["name"] == "obama" and face["match"], face


@pytest.mark.parametrize("detector", ["deepstack", "aiserver"])
def test_double_take_deepstack_userid_names(served, examples, detector):
    """Issue 36, items 1, 2 and 7 through Double Take's deepstack and aiserver detectors: a userid
    with spaces, one person whatever its case, and untraining that answers success for any userid."""
    key = KEY if detector == "deepstack" else None
    client = served(KEY if key else "")
    obama = snapshot(examples, "knn_examples/train/obama/obama.jpg")
    trained = ds_post(client, "register", key, ("image", *obama), ("userid", "Barack Obama"))
    assert trained.status_code == 200 and trained.json()["message"] == "face added", trained.text
    again = ds_post(
        client, "register", key, ("image", *snapshot(examples, "knn_examples/train/obama/obama2.jpg")), ("userid", "barack obama")
    )
    assert again.json()["message"] == "face updated"
    probe = snapshot(examples, "knn_examples/test/obama1.jpg")
    (face,) = ds_normalize(ds_post(client, "recognize", key, ("image", *probe)))
    assert face["name"] == "barack obama" and face["match"], face
    assert ds_post(client, "list", key).json()["faces"] == ["Barack Obama"]

    for userid in ("Joe Biden", "x" * 300):  # never registered, or no subject could hold it: success, as DeepStack
        answer = ds_post(client, "delete", key, ("userid", userid))
        assert answer.status_code == 200 and answer.json()["success"] is True, answer.text
    assert ds_post(client, "delete", key, ("userid", "BARACK OBAMA")).json()["success"] is True
    (face,) = ds_normalize(ds_post(client, "recognize", key, ("image", *probe)))
    assert face == {"name": "unknown", "confidence": 0, "match": False}, face
