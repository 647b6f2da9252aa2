"""CompreFace's v1 API (/api/v1) on facegate, with the default embedder on real LFW photos: the
calls and fields CompreFace's SDK, Double Take and Viseron use, and calibrated similarities that
put a same-person photo above 0.5 and strangers below it; subjects as CompreFace names them (free
text, case-insensitive) on both stores; its answers to a refused key and to `status`."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import cv2
import numpy as np
import pytest
from pydantic import SecretStr

from tests.service.api.test_routes_lfw import people

pytestmark = pytest.mark.data


@pytest.fixture
def cf(model_cache, tmp_path, make_client):
    from service.core.settings import Settings

    return make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu"))


def test_compreface_round_trip(cf, test_data):
    enrolled = people(test_data, 4)
    strangers = people(test_data, 4, skip=4)
    ids = {}
    for name, photos in enrolled:
        answer = cf.post(f"/api/v1/recognition/faces?subject={name}", files={"file": ("a.jpg", photos[0], "image/jpeg")})
        assert answer.status_code == 200, answer.text
        assert answer.json()["subject"] == name and isinstance(answer.json()["image_id"], str)
        ids[name] = answer.json()["image_id"]
    # JSON base64 `file`, as the SDK sends for a base64 string
    name, photos = enrolled[0]
    assert cf.post(f"/api/v1/recognition/faces?subject={name}", json={"file": base64.b64encode(photos[1]).decode()}).status_code == 200

    listed = cf.get("/api/v1/recognition/faces", params={"size": 3}).json()
    assert listed["total_elements"] == 5 and listed["total_pages"] == 2 and len(listed["faces"]) == 3
    assert {f["subject"] for f in cf.get("/api/v1/recognition/faces", params={"subject": name}).json()["faces"]} == {name}
    assert sorted(cf.get("/api/v1/recognition/subjects").json()["subjects"]) == sorted(n for n, _ in enrolled)

    for person, photos in enrolled[1:]:
        result = cf.post("/api/v1/recognition/recognize", params={"prediction_count": 2}, files={"file": photos[1]}).json()["result"]
        best = result[0]["subjects"][0]
        assert best["subject"] == person and best["similarity"] >= 0.5, result
        assert set(result[0]["box"]) == {"probability", "x_min", "y_min", "x_max", "y_max"}
        assert len(result[0]["subjects"]) == 2 and result[0]["subjects"][1]["similarity"] < 0.5
    for _, photos in strangers:
        subjects = cf.post("/api/v1/recognition/recognize", files={"file": photos[0]}).json()["result"][0]["subjects"]
        assert subjects[0]["similarity"] < 0.5, subjects  # a Viseron-default client matches no stranger

    person, photos = enrolled[1]
    same = cf.post("/api/v1/verification/verify", files={"source_image": photos[0], "target_image": photos[1]}).json()
    assert same["result"][0]["face_matches"][0]["similarity"] >= 0.5
    other = cf.post("/api/v1/verification/verify", files={"source_image": photos[0], "target_image": strangers[0][1][0]}).json()
    assert other["result"][0]["face_matches"][0]["similarity"] < 0.5
    assert cf.post("/api/v1/detection/detect", files={"file": photos[0]}).json()["result"][0]["box"]["probability"] > 0.5

    blank = cv2.imencode(".png", np.full((120, 120, 3), 128, np.uint8))[1].tobytes()
    for path in ("/api/v1/recognition/recognize", "/api/v1/detection/detect"):
        answer = cf.post(path, files={"file": blank})
        assert answer.status_code == 400 and answer.json()["code"] == 28 and answer.json()["message"]

    assert cf.delete(f"/api/v1/recognition/faces/{ids[person]}").json() == {"image_id": ids[person], "subject": person}
    assert cf.delete(f"/api/v1/recognition/faces/{ids[person]}").status_code == 404
    assert cf.post("/api/v1/recognition/faces/delete", json=[ids[enrolled[2][0]], "999999"]).json() == [
        {"image_id": ids[enrolled[2][0]], "subject": enrolled[2][0]}
    ]
    assert cf.delete("/api/v1/recognition/faces", params={"subject": name}).json() == {"deleted": 2}
    assert cf.delete(f"/api/v1/recognition/subjects/{enrolled[3][0]}").json() == {"subject": enrolled[3][0]}
    assert cf.post("/api/v1/recognition/subjects", json={"subject": "newcomer"}).json() == {"subject": "newcomer"}
    assert "newcomer" in cf.get("/api/v1/recognition/subjects").json()["subjects"]
    remaining = len(cf.get("/api/v1/recognition/subjects").json()["subjects"])
    assert cf.delete("/api/v1/recognition/subjects").json() == {"deleted": remaining}
    assert cf.get("/api/v1/recognition/subjects").json() == {"subjects": []}


def compreface_error(answer, status: int, code: str) -> None:
    """CompreFace's error shape, `{"message", "code"}`, with facegate's status and code (docs/compat.md)."""
    assert answer.status_code == status and set(answer.json()) == {"message", "code"} and answer.json()["code"] == code, answer.text
    assert answer.json()["message"], answer.text


def test_compreface_errors_keep_its_shape(api):
    compreface_error(
        api.post("/api/v1/recognition/faces", params={"subject": "ada"}, files={"file": b"not an image"}), 400, "invalid_image"
    )
    compreface_error(api.post("/api/v1/recognition/faces", files={"file": b"not an image"}), 422, "invalid_parameters")  # no subject
    compreface_error(api.delete("/api/v1/recognition/faces/abc"), 422, "invalid_parameters")
    assert api.get("/api/v1/recognition/subjects").json() == {"subjects": []}  # nothing made by the refused requests


def test_compreface_add_face_has_enrollment_quality_gate(model_cache, tmp_path, make_client, test_data):
    from service.core.settings import Settings

    ((name, photos),) = people(test_data, 1)
    strict = make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu", enroll_min_face_size=4000))
    answer = strict.post(f"/api/v1/recognition/faces?subject={name}", files={"file": photos[0]})
    assert answer.status_code == 422 and answer.json()["code"] == "low_quality_face" and answer.json()["message"], answer.text
    assert strict.get("/api/v1/recognition/subjects").json() == {"subjects": []}  # no subject half-made
    # one gate: DeepStack's register refuses the same photo (its 400), and a lax gate takes it
    refused = strict.post("/v1/vision/face/register", files={"image": photos[0]}, data={"userid": name})
    assert refused.status_code == 400 and refused.json()["success"] is False, refused.text
    lax = make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "lax", device="cpu"))
    assert lax.post(f"/api/v1/recognition/faces?subject={name}", files={"file": photos[0]}).json()["subject"] == name


def test_compreface_verify_against_a_stored_face(cf, test_data):
    ((name, photos), (_, stranger)) = people(test_data, 2)
    image_id = cf.post(f"/api/v1/recognition/faces?subject={name}", files={"file": photos[0]}).json()["image_id"]
    same = cf.post(f"/api/v1/recognition/faces/{image_id}/verify", files={"file": photos[1]})
    assert same.status_code == 200, same.text
    (face,) = same.json()["result"]
    assert face["subject"] == name and face["similarity"] >= 0.5, face
    assert set(face["box"]) == {"probability", "x_min", "y_min", "x_max", "y_max"} and "execution_time" not in face  # status=false
    # JSON base64 `file` too, and a stranger stays below a Viseron-default 0.5
    other = cf.post(f"/api/v1/recognition/faces/{image_id}/verify", json={"file": base64.b64encode(stranger[0]).decode()}).json()
    assert other["result"][0]["similarity"] < 0.5, other
    compreface_error(cf.post("/api/v1/recognition/faces/999999/verify", files={"file": photos[1]}), 404, "face_not_found")
    compreface_error(cf.post("/api/v1/recognition/faces/abc/verify", files={"file": photos[1]}), 422, "invalid_parameters")


def test_compreface_embedding_routes(cf, test_data):
    enrolled = people(test_data, 3)
    ((_, stranger),) = people(test_data, 1, skip=3)
    for name, photos in enrolled:
        assert cf.post(f"/api/v1/recognition/faces?subject={name}", files={"file": photos[0]}).status_code == 200

    def embedding(photo: bytes) -> list[float]:
        answer = cf.post("/embed", files={"image": photo})
        assert answer.status_code == 200, answer.text
        return answer.json()["faces"][0]["embedding"]

    name, photos = enrolled[1]
    probe, other = embedding(photos[1]), embedding(stranger[0])
    scaled = [3.0 * x for x in probe]  # normalized on receipt
    answer = cf.post(
        "/api/v1/recognition/embeddings/recognize", params={"prediction_count": 2}, json={"embeddings": [probe, scaled, other]}
    )
    assert answer.status_code == 200, answer.text
    (found, again, unknown) = answer.json()["result"]
    assert found["embedding"] == probe and len(found["similarities"]) == 2
    assert found["similarities"][0]["subject"] == name and found["similarities"][0]["similarity"] >= 0.5, found
    assert found["similarities"][1]["similarity"] < 0.5
    assert again["similarities"][0] == found["similarities"][0]
    assert unknown["similarities"][0]["similarity"] < 0.5, unknown
    # the same as recognize answers for the photo itself
    by_image = cf.post("/api/v1/recognition/recognize", files={"file": photos[1]}).json()["result"][0]["subjects"][0]
    assert by_image["subject"] == name and abs(by_image["similarity"] - found["similarities"][0]["similarity"]) < 1e-3

    # CompreFace's calculator plugin gives the same embeddings, which the embedding routes take back
    plugged = cf.post(
        "/api/v1/recognition/recognize", params={"face_plugins": "calculator,age", "status": "true"}, files={"file": photos[1]}
    ).json()
    assert np.allclose(plugged["result"][0]["embedding"], probe, atol=1e-5) and plugged["plugins_versions"]["calculator"]
    detected = cf.post("/api/v1/detection/detect", params={"face_plugins": "calculator"}, files={"file": photos[1]}).json()
    assert np.allclose(detected["result"][0]["embedding"], probe, atol=1e-5)
    assert (
        "embedding"
        not in cf.post("/api/v1/recognition/recognize", params={"face_plugins": "undefined"}, files={"file": photos[1]}).json()["result"][0]
    )

    verified = cf.post("/api/v1/verification/embeddings/verify", json={"source": embedding(photos[0]), "targets": [other, probe]})
    assert verified.status_code == 200, verified.text
    (best, worst) = verified.json()["result"]
    assert best["embedding"] == probe and best["similarity"] >= 0.5 and worst["similarity"] < 0.5, verified.json()

    dim = len(probe)
    bad = [
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": [probe[:-1]]}),  # wrong dimension
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": [probe + [0.0]]}),
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": []}),
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": probe}),  # not a list of lists
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": "abc"}),
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": [[0.0] * dim]}),  # no direction
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": [probe] * 1001}),  # FACEGATE_MAX_IDENTIFY_CANDIDATES
        ("/api/v1/recognition/embeddings/recognize", [probe]),
        ("/api/v1/verification/embeddings/verify", {"source": probe, "targets": [probe[:5]]}),
        ("/api/v1/verification/embeddings/verify", {"source": [probe], "targets": [probe]}),
        ("/api/v1/verification/embeddings/verify", {"source": probe, "targets": probe}),
        ("/api/v1/verification/embeddings/verify", {"source": probe}),
        ("/api/v1/verification/embeddings/verify", {"source": probe, "targets": [probe] * 1001}),
    ]
    bad += [
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": [["0.1"] * dim]}),  # numbers only
        ("/api/v1/recognition/embeddings/recognize", {"embeddings": [[True] * dim]}),
        ("/api/v1/verification/embeddings/verify", {"source": [None] * dim, "targets": [probe]}),
    ]
    for path, body in bad:
        answer = cf.post(path, json=body)
        compreface_error(answer, 422, "invalid_parameters")
    # NaN and infinities, which JSON encoders write as bare words
    for word in ("NaN", "Infinity", "-Infinity", "1e999"):
        raw = '{"embeddings": [[' + ", ".join([word] + ["0.1"] * (dim - 1)) + "]]}"
        answer = cf.post("/api/v1/recognition/embeddings/recognize", content=raw, headers={"content-type": "application/json"})
        compreface_error(answer, 400, "invalid_json")
    # any positive scale is the same direction, huge or tiny
    scales = cf.post(
        "/api/v1/verification/embeddings/verify",
        json={"source": probe, "targets": [[x * 1e300 for x in probe], [x * 1e-300 for x in probe]]},
    ).json()
    assert [r["similarity"] for r in scales["result"]] == [1.0, 1.0], scales
    answer = cf.post("/api/v1/recognition/embeddings/recognize", params={"prediction_count": 2}, json={"embeddings": [probe] * 600})
    assert answer.status_code == 422 and "prediction_count" in answer.json()["message"]


def test_faces_another_model_made_are_deleted_by_id(model_cache, tmp_path, make_client):
    """A face enrolled under an earlier embedder (kept, never compared) is still the gallery's to
    delete by image_id: one by one and in bulk, the answer names its subject, never a 500."""
    from service.core.models.manifest import EmbedderKey
    from service.core.settings import Settings
    from service.gallery.interface import NewFace
    from service.gallery.sqlite import SqliteGallery

    old = SqliteGallery.open(tmp_path / "gallery", EmbedderKey("old-model", "0" * 64, 8))
    old.create_subject("ada", {}, "ada")
    first, second = old.add_faces("ada", [NewFace(np.eye(8, dtype=np.float32)[i]) for i in range(2)])
    old.close()
    cf = make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu"))
    one = cf.delete(f"/api/v1/recognition/faces/{first.id}")
    assert one.status_code == 200 and one.json() == {"image_id": str(first.id), "subject": "ada"}
    bulk = cf.post("/api/v1/recognition/faces/delete", json=[str(second.id), "999"])
    assert bulk.status_code == 200 and bulk.json() == [{"image_id": str(second.id), "subject": "ada"}]
    assert cf.delete(f"/api/v1/recognition/faces/{first.id}").status_code == 404


def test_a_stored_face_is_not_compared_while_no_embedder_is_loaded(model_cache, tmp_path, make_client):
    """verify by image_id answers 503 model_unavailable, not a 500, when the embedder did not load."""
    from service.core.settings import Settings

    cf = make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu", embedder="no-such-model"))
    answer = cf.post("/api/v1/recognition/faces/1/verify", files={"file": ("a.png", b"not read", "image/png")})
    compreface_error(answer, 503, "model_unavailable")


@pytest.fixture(params=["sqlite", "postgres"])
def cf_store(request, model_cache, tmp_path, make_client):
    """A CompreFace client on either gallery store: the names live in the store."""
    from service.core.settings import Settings

    settings = Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu")
    if request.param == "postgres":
        settings = settings.model_copy(update={"database_url": SecretStr(request.getfixturevalue("database_url"))})
    return make_client(settings)


def test_compreface_subjects_are_names(cf_store, test_data):
    """Issue 36, items 1-4: a subject is free text answered as given, one subject whatever its case,
    deleted with its faces; an unknown one deletes and lists nothing, with a 200."""
    cf = cf_store
    (_, a), (_, b), (_, c) = people(test_data, 3)

    def add(name: str, photo: bytes):
        return cf.post("/api/v1/recognition/faces", params={"subject": name}, files={"file": photo})

    def listed() -> list[str]:
        return cf.get("/api/v1/recognition/subjects").json()["subjects"]

    spaced = "Barack Hussein Obama"
    first = add(spaced, a[0])
    assert first.status_code == 200 and first.json()["subject"] == spaced, first.text
    again = add(spaced.lower(), a[1])  # answered as the request named it, as CompreFace does
    assert again.status_code == 200 and again.json()["subject"] == spaced.lower(), again.text
    assert listed() == [spaced]
    (native,) = cf.get("/subjects").json()["subjects"]  # facegate's own id stays an id
    assert native["name"] == spaced and native["face_count"] == 2 and " " not in native["id"]
    faces = cf.get("/api/v1/recognition/faces", params={"subject": spaced.upper()}).json()
    assert faces["total_elements"] == 2 and {f["subject"] for f in faces["faces"]} == {spaced}
    best = cf.post("/api/v1/recognition/recognize", files={"file": a[1]}).json()["result"][0]["subjects"][0]
    assert best["subject"] == spaced and best["similarity"] >= 0.5, best

    assert add("Tony_Blair", b[0]).json()["subject"] == "Tony_Blair"
    assert add("tony_blair", b[1]).json()["subject"] == "tony_blair"  # one subject, as Double Take reads it
    assert listed() == [spaced, "Tony_Blair"]
    assert cf.get("/subjects/Tony_Blair").json()["face_count"] == 2  # a name that is an id keeps it as its id
    exists = cf.post("/api/v1/recognition/subjects", json={"subject": "TONY_BLAIR"})
    assert exists.status_code == 409 and exists.json() == {"message": "Subject already exists", "code": "subject_exists"}

    unicode_name = "Zoë Ørsted / AC-DC"
    assert add(unicode_name, c[0]).json()["subject"] == unicode_name
    assert cf.post("/api/v1/recognition/subjects", json={"subject": "x" * 256}).json() == {"subject": "x" * 256}
    for bad in ("x" * 257, "a\tb", "   ", "", "\ud800", 5):
        body = json.dumps({"subject": bad})  # ASCII-escaped: a lone surrogate travels as \ud800
        answer = cf.post("/api/v1/recognition/subjects", content=body, headers={"content-type": "application/json"})
        assert 400 <= answer.status_code < 500 and set(answer.json()) == {"message", "code"}, (bad, answer.text)
    for bad in ("a\x00b", "\n", "y" * 257):
        answer = add(bad, c[1])
        assert 400 <= answer.status_code < 500 and set(answer.json()) == {"message", "code"}, (bad, answer.text)
    # the stored name comes back from a delete by path, whatever its case; a `/` travels as %2F
    deleted = cf.delete(f"/api/v1/recognition/subjects/{quote(unicode_name.upper(), safe='')}")
    assert deleted.status_code == 200 and deleted.json() == {"subject": unicode_name}, deleted.text
    assert cf.delete("/api/v1/recognition/subjects/" + "x" * 256).json() == {"subject": "x" * 256}

    # one face deleted: the subject stays; every face of it deleted: the subject goes, as CompreFace does
    one = cf.delete(f"/api/v1/recognition/faces/{first.json()['image_id']}")
    assert one.json() == {"image_id": first.json()["image_id"], "subject": spaced} and spaced in listed()
    assert cf.delete("/api/v1/recognition/faces", params={"subject": spaced.upper()}).json() == {"deleted": 1}
    assert listed() == ["Tony_Blair"] and len(cf.get("/subjects").json()["subjects"]) == 1
    after = cf.post("/api/v1/recognition/recognize", files={"file": a[1]}).json()["result"][0]["subjects"]
    assert all(s["subject"] != spaced for s in after), after

    # an unknown subject: nothing deleted, an empty page, each a 200 (a path delete stays CompreFace's 404)
    assert cf.delete("/api/v1/recognition/faces", params={"subject": "Nobody Here"}).json() == {"deleted": 0}
    empty = cf.get("/api/v1/recognition/faces", params={"subject": "Nobody Here"})
    assert empty.status_code == 200 and empty.json()["faces"] == [] and empty.json()["total_elements"] == 0
    gone = cf.delete("/api/v1/recognition/subjects/Nobody%20Here")
    assert gone.status_code == 404 and set(gone.json()) == {"message", "code"}

    # a rename through facegate's own API is one here too; another subject's name is a 409
    assert cf.patch("/subjects/Tony_Blair", json={"name": "Anthony Blair"}).status_code == 200
    assert listed() == ["Anthony Blair"]
    assert add("ANTHONY BLAIR", c[1]).status_code == 200 and cf.get("/subjects/Tony_Blair").json()["face_count"] == 3
    cf.post("/api/v1/recognition/subjects", json={"subject": "Cherie"})
    clash = cf.patch("/subjects/Tony_Blair", json={"name": "cherie"})
    assert clash.status_code == 409 and clash.json()["error"]["code"] == "subject_exists"

    # a subject of facegate's own API is its id here, as before names were mapped
    assert cf.post("/subjects", json={"id": "emp-1", "name": "Ada Lovelace"}).status_code == 201
    assert "emp-1" in listed() and "Ada Lovelace" not in listed()
    assert add("emp-1", a[0]).json()["subject"] == "emp-1" and cf.get("/subjects/emp-1").json()["face_count"] == 1
    assert cf.delete("/api/v1/recognition/faces", params={"subject": "emp-1"}).json() == {"deleted": 1}
    assert cf.get("/subjects/emp-1").status_code == 404


def test_a_refused_key_answers_in_compreface_shape(api_settings, make_client):
    """Issue 36, item 5: Double Take logs `message`; facegate's own routes keep their shape."""
    client = make_client(api_settings.model_copy(update={"api_keys": SecretStr("s3cret")}))
    missing = client.get("/api/v1/recognition/subjects")
    assert missing.status_code == 401 and missing.json() == {"message": "Missing header: x-api-key", "code": 20}
    for headers in ({"x-api-key": "wrong-key"}, [("x-api-key", "s3cret"), ("x-api-key", "s3cret")]):
        wrong = client.post("/api/v1/recognition/recognize", headers=headers, files={"file": b"x"})
        assert wrong.status_code == 401 and wrong.json()["code"] == 10 and wrong.json()["message"], wrong.text
        assert "wrong-key" not in wrong.text  # a key is never echoed
    assert set(client.get("/subjects", headers={"x-api-key": "wrong"}).json()) == {"error"}
    assert client.get("/api/v1/recognition/subjects", headers={"x-api-key": "s3cret"}).json() == {"subjects": []}


def test_compreface_status_adds_execution_time_and_plugins_versions(cf, test_data):
    """Issue 36, item 7: only with `status=true`, as CompreFace answers; execution_time holds what
    the image's detection and embedding took (ms), not a constant."""
    ((name, photos),) = people(test_data, 1)
    image_id = cf.post("/api/v1/recognition/faces", params={"subject": name}, files={"file": photos[0]}).json()["image_id"]
    routes = [
        ("/api/v1/recognition/recognize", {"file": photos[1]}),
        ("/api/v1/detection/detect", {"file": photos[1]}),
        (f"/api/v1/recognition/faces/{image_id}/verify", {"file": photos[1]}),
    ]
    for path, files in routes:
        quiet = cf.post(path, files=files).json()
        assert "plugins_versions" not in quiet and all("execution_time" not in r for r in quiet["result"]), (path, quiet)
        assert cf.post(path, params={"status": "false"}, files=files).json() == quiet
        told = cf.post(path, params={"status": "true"}, files=files).json()
        assert told["plugins_versions"]["detector"] == "facegate", (path, told)
        for entry in told["result"]:
            times = entry["execution_time"]
            assert set(times) == set(told["plugins_versions"]) and times["detector"] > 0, (path, told)  # the plugins it names
            assert "detection" in path or times["calculator"] > 0, (path, told)
    verified = cf.post(
        "/api/v1/verification/verify", params={"status": "true"}, files={"source_image": photos[0], "target_image": photos[1]}
    ).json()
    (entry,) = verified["result"]
    assert entry["source_image_face"]["execution_time"]["calculator"] > 0 and entry["face_matches"][0]["execution_time"]["detector"] > 0
    assert entry["plugins_versions"] == {"detector": "facegate", "calculator": "dlib-resnet-v1"}  # the default embedder
    plain = cf.post("/api/v1/verification/verify", files={"source_image": photos[0], "target_image": photos[1]}).json()
    assert (
        set(plain["result"][0]) == {"source_image_face", "face_matches"} and "execution_time" not in plain["result"][0]["face_matches"][0]
    )
    bad = cf.post("/api/v1/recognition/recognize", params={"status": "maybe"}, files={"file": photos[1]})
    assert bad.status_code == 422 and set(bad.json()) == {"message", "code"}


def test_a_similarity_below_the_match_is_held_to_the_cosine_rule(cf, test_data):
    """Below facegate's decision (Double Take names a face from 0.4 without matching it) a search's
    similarity is no higher than the cosine's rate over the faces searched gives (the rule before the
    margin score): a probe whose best cosine the table alone puts at 0.41 answers under 0.4; a match
    keeps the decision's own similarity."""
    from service.api.compat.similarity import calibrated_similarity
    from service.core.decision import decide_search, search_rate
    from service.core.models.manifest import Manifest
    from service.core.open_set import GalleryShape
    from tests.conftest import REPO

    manifest = Manifest.load(REPO / "models" / "dlib-resnet-v1.json")
    decision = decide_search(manifest, None, None, None, GalleryShape(2, 2), 0.01)
    assert decision.score == "cosine" and decision.margin is not None  # the table's cosine rows decide 2 subjects

    def by_table(c: float) -> float:
        return calibrated_similarity(decision.rate(c), 0.01)

    low, high = 0.8, decision.threshold  # the cosine the table alone puts at 0.41
    for _ in range(40):
        low, high = (low, (low + high) / 2) if by_table((low + high) / 2) >= 0.41 else ((low + high) / 2, high)
    below, above = high, decision.threshold + 0.01
    by_cosine = calibrated_similarity(search_rate(manifest.far_at(below), 2), 0.01)
    assert by_table(below) >= 0.4 > by_cosine

    embeddings = []
    for name, photos in people(test_data, 2):
        assert cf.post(f"/api/v1/recognition/faces?subject={name}", files={"file": photos[0]}).status_code == 200
        embeddings.append(np.array(cf.post("/embed", files={"image": photos[0]}).json()["faces"][0]["embedding"]))
    first, second = embeddings
    other = np.random.default_rng(0).standard_normal(first.size)
    for e in (first, second - (second @ first) * first):  # a direction orthogonal to both enrolled faces
        other -= (other @ e) / (e @ e) * e
    other /= np.linalg.norm(other)
    probes = [(c * first + np.sqrt(1 - c * c) * other).tolist() for c in (below, above)]
    answer = cf.post("/api/v1/recognition/embeddings/recognize", json={"embeddings": probes})
    assert answer.status_code == 200, answer.text
    (near, match) = (r["similarities"][0] for r in answer.json()["result"])
    assert near["subject"] == match["subject"] == people(test_data, 1)[0][0]
    assert near["similarity"] == pytest.approx(by_cosine, abs=2e-3) and near["similarity"] < 0.4, near
    assert match["similarity"] == pytest.approx(by_table(above), abs=2e-3) and match["similarity"] >= 0.5, match
