"""CompreFace's remaining documented semantics (its Rest-API-description), on the test embedder with
aligned crops (`detect_faces=false`): rename and its merge, deleting every face, UUID image ids,
a request without its image, a stored face's image, and errors of routes it does not offer."""

from __future__ import annotations

import uuid

import pytest

from tests.conftest import aligned_crop_png

ALIGNED = {"detect_faces": "false"}


def add(api, subject: str, seed: int) -> str:
    answer = api.post("/api/v1/recognition/faces", params={"subject": subject, **ALIGNED}, files={"file": aligned_crop_png(seed)})
    assert answer.status_code == 200, answer.text
    return answer.json()["image_id"]


def error(answer, status: int, code) -> None:
    assert (answer.status_code, set(answer.json()), answer.json()["code"]) == (status, {"message", "code"}, code), answer.text


def test_detect_faces_false_takes_the_image_as_the_face(api):
    image_id = add(api, "Ada Lovelace", 1)
    (face,) = api.post("/api/v1/recognition/recognize", params=ALIGNED, files={"file": aligned_crop_png(1)}).json()["result"]
    assert face["box"] == {"probability": 1.0, "x_min": 0, "y_min": 0, "x_max": 112, "y_max": 112}
    assert face["subjects"][0]["subject"] == "Ada Lovelace" and face["subjects"][0]["similarity"] > 0.5
    (verified,) = api.post(f"/api/v1/recognition/faces/{image_id}/verify", params=ALIGNED, files={"file": aligned_crop_png(1)}).json()[
        "result"
    ]
    assert verified["similarity"] > 0.5
    error(
        api.post("/api/v1/recognition/recognize", params={"detect_faces": "maybe"}, files={"file": aligned_crop_png(1)}),
        422,
        "invalid_parameters",
    )


def test_rename_and_rename_onto_a_taken_name_merges(api):
    add(api, "Ada", 1)
    add(api, "Ada King", 2)
    add(api, "Ada King", 3)
    assert api.put("/api/v1/recognition/subjects/ada", json={"subject": "Ada Lovelace"}).json() == {"updated": True}
    assert sorted(api.get("/api/v1/recognition/subjects").json()["subjects"]) == ["Ada King", "Ada Lovelace"]
    # onto a name another subject holds, whatever its case: its faces move there, the old subject goes
    assert api.put("/api/v1/recognition/subjects/Ada King", json={"subject": "ADA LOVELACE"}).json() == {"updated": True}
    assert api.get("/api/v1/recognition/subjects").json()["subjects"] == ["Ada Lovelace"]
    faces = api.get("/api/v1/recognition/faces", params={"subject": "Ada Lovelace"}).json()
    assert faces["total_elements"] == 3
    error(api.put("/api/v1/recognition/subjects/nobody", json={"subject": "x"}), 404, "subject_not_found")
    error(api.put("/api/v1/recognition/subjects/Ada Lovelace", json={"subject": " "}), 422, "invalid_parameters")
    # a subject of facegate's own API holds no name here: renamed through PATCH /subjects/{id}
    assert api.post("/subjects", json={"id": "emp-1", "name": "Native"}).status_code == 201
    error(api.put("/api/v1/recognition/subjects/emp-1", json={"subject": "Someone"}), 422, "invalid_parameters")
    assert api.get("/subjects/emp-1").json()["name"] == "Native"


def test_delete_faces_without_a_subject_deletes_every_face(api):
    add(api, "Ada", 1)
    add(api, "Ada", 2)
    add(api, "Grace", 3)
    assert api.delete("/api/v1/recognition/faces").json() == {"deleted": 3}
    assert api.get("/api/v1/recognition/faces").json()["total_elements"] == 0
    assert api.get("/api/v1/recognition/subjects").json() == {"subjects": []}
    assert api.delete("/api/v1/recognition/faces").json() == {"deleted": 0}


def test_a_uuid_image_id_is_a_face_not_held(api):
    kept = add(api, "Ada", 1)
    unknown = str(uuid.uuid4())
    error(api.delete(f"/api/v1/recognition/faces/{unknown}"), 404, "face_not_found")
    error(api.post(f"/api/v1/recognition/faces/{unknown}/verify", files={"file": aligned_crop_png(1)}), 404, "face_not_found")
    error(api.get(f"/api/v1/recognition/faces/{unknown}/img"), 404, "face_not_found")
    assert api.post("/api/v1/recognition/faces/delete", json=[unknown, "999999"]).json() == []
    error(api.post("/api/v1/recognition/faces/delete", json=["abc"]), 422, "invalid_parameters")
    assert api.get("/api/v1/recognition/faces").json()["faces"] == [{"image_id": kept, "subject": "Ada"}]


@pytest.mark.parametrize("path", ["/api/v1/recognition/recognize", "/api/v1/detection/detect", "/api/v1/verification/verify"])
def test_a_request_without_its_image_is_code_34(api, path):
    error(api.post(path), 400, 34)
    error(api.post(path, files={"x": (None, "1")}), 400, 34)  # a multipart body without the part
    error(api.post(path, json={}), 400, 34)


def test_a_stored_face_image_is_served_when_kept(api_settings, make_client):
    keeping = make_client(api_settings.model_copy(update={"store_crops": True}))
    image_id = add(keeping, "Ada", 1)
    answer = keeping.get(f"/api/v1/recognition/faces/{image_id}/img")
    assert answer.status_code == 200 and answer.headers["content-type"] == "image/png" and answer.content.startswith(b"\x89PNG")
    assert answer.headers["cache-control"] == "no-store"
    error(keeping.get("/api/v1/recognition/faces/999999/img"), 404, "face_not_found")


def test_without_stored_images_the_image_route_says_why(api):
    image_id = add(api, "Ada", 1)
    answer = api.get(f"/api/v1/recognition/faces/{image_id}/img")
    error(answer, 404, "face_chip_not_stored")
    assert "FACEGATE_STORE_CROPS" in answer.json()["message"]


def test_subjects_are_listed_at_the_url_its_description_writes(api):
    add(api, "Ada", 1)
    assert api.get("/api/v1/recognition/subjects/").json() == {"subjects": ["Ada"]}  # with the slash, as documented


def test_routes_it_does_not_offer_answer_in_its_shape(api):
    error(api.get("/api/v1/recognition/nothing-here"), 404, "not_found")
    error(api.patch("/api/v1/recognition/subjects"), 405, "method_not_allowed")
    error(api.get("/api/v1/static/key/images/1"), 404, "not_found")
    assert set(api.get("/nothing-here").json()) == {"error"}  # facegate's own routes keep facegate's shape


def test_plugins_versions_names_every_plugin_execution_time_does(api):
    add(api, "Ada", 1)
    for params in ({"status": "true", **ALIGNED}, {"status": "true", "face_plugins": "calculator", **ALIGNED}):
        answer = api.post("/api/v1/detection/detect", params=params, files={"file": aligned_crop_png(1)}).json()
        for face in answer["result"]:
            assert set(face["execution_time"]) == set(answer["plugins_versions"]), answer
