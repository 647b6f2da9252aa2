"""Every route through the app (httpx TestClient, lifespan run), both image encodings, every error
code, pagination, FAR choices and deletes leaving search. Uses the test embedder (not a face model:
similarities here prove the mechanics, not recognition) and the real YuNet detector on LFW images."""

from __future__ import annotations

import base64
import io

import cv2
import numpy as np
import pytest
from PIL import Image
from pydantic import SecretStr

from tests.conftest import LFW_PEOPLE, aligned_crop_png

BUSH, POWELL, BLAIR = LFW_PEOPLE[:3]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return body["error"]["message"]


def new_subject(api, subject_id: str, name: str | None = None) -> dict:
    response = api.post("/subjects", json={"id": subject_id, "name": name or subject_id})
    assert response.status_code == 201, response.text
    return response.json()


def enroll(api, subject_id: str, image: bytes, **fields) -> dict:
    response = api.post(f"/subjects/{subject_id}/faces", files={"image": image}, data=fields)
    assert response.status_code == 201, response.text
    return response.json()


# recognition routes


def test_verify_both_encodings_agree(api, lfw_faces):
    a, b = lfw_faces[BUSH][0], lfw_faces[POWELL][0]
    multipart = api.post("/verify", files={"image1": a, "image2": b})
    as_json = api.post("/verify", json={"image1": b64(a), "image2": b64(b)})
    assert multipart.status_code == as_json.status_code == 200
    m, j = multipart.json(), as_json.json()
    assert m["similarity"] == pytest.approx(j["similarity"], abs=1e-6)
    assert m["far"] == "1e-3" and m["threshold"] == 0.9  # the default FAR's manifest threshold
    assert m["match"] is (m["similarity"] >= m["threshold"])
    assert len(m["faces"]) == 2 and len(m["faces"][0]["landmarks"]) == 5 and len(m["faces"][0]["box"]) == 4
    assert m["model"]["name"] == "test-embedder"


def test_verify_same_image_matches_and_far_choices(api, lfw_faces):
    image = lfw_faces[BUSH][0]
    same = api.post("/verify", files={"image1": image, "image2": image}).json()
    assert same["match"] and same["similarity"] > 0.999
    at_1e2 = api.post("/verify", files={"image1": image, "image2": image}, data={"far": "0.01"}).json()
    assert (at_1e2["far"], at_1e2["threshold"]) == ("1e-2", 0.8)
    explicit = api.post("/verify", json={"image1": b64(image), "image2": b64(image), "threshold": 1.0}).json()
    assert explicit["far"] is None and explicit["threshold"] == 1.0
    message = error(api.post("/verify", files={"image1": image, "image2": image}, data={"far": "1e-5"}), 422, "unknown_far")
    assert "1e-3" in message and "1e-2" in message
    error(
        api.post("/verify", files={"image1": image, "image2": image}, data={"far": "1e-3", "threshold": "0.5"}), 422, "invalid_parameters"
    )


def test_verify_against_a_subject_uses_the_best_enrolled_face(api, lfw_faces):
    new_subject(api, "bush")
    enroll(api, "bush", lfw_faces[POWELL][0])  # a poor face for this subject: the max must ignore it
    enroll(api, "bush", lfw_faces[BUSH][0])
    result = api.post("/verify", files={"image1": lfw_faces[BUSH][0]}, data={"subject_id": "bush"}).json()
    assert result["match"] and result["similarity"] > 0.999 and result["subject_id"] == "bush" and len(result["faces"]) == 1
    assert result["subject_faces"] == 2  # why its threshold is above the model's for the FAR: each face is one try
    pair = api.post("/verify", files={"image1": lfw_faces[BUSH][0], "image2": lfw_faces[BUSH][1]}).json()
    assert pair["subject_faces"] is None and pair["threshold"] < result["threshold"]
    error(api.post("/verify", files={"image1": lfw_faces[BUSH][0]}, data={"subject_id": "nobody"}), 404, "subject_not_found")
    new_subject(api, "empty")
    error(api.post("/verify", files={"image1": lfw_faces[BUSH][0]}, data={"subject_id": "empty"}), 422, "no_enrolled_faces")
    error(
        api.post("/verify", files={"image1": lfw_faces[BUSH][0], "image2": lfw_faces[BUSH][0]}, data={"subject_id": "bush"}),
        422,
        "invalid_parameters",
    )
    error(api.post("/verify", files={"image1": lfw_faces[BUSH][0]}), 422, "invalid_parameters")


def test_face_policy_and_multiple_faces(api, two_faces_jpeg, lfw_faces):
    largest = api.post("/verify", files={"image1": two_faces_jpeg, "image2": lfw_faces[BUSH][0]})
    assert largest.status_code == 200
    error(
        api.post("/verify", files={"image1": two_faces_jpeg, "image2": lfw_faces[BUSH][0]}, data={"face_policy": "reject_multiple"}),
        422,
        "multiple_faces",
    )
    error(
        api.post("/verify", files={"image1": two_faces_jpeg, "image2": two_faces_jpeg}, data={"face_policy": "sometimes"}),
        422,
        "invalid_parameters",
    )


def test_identify_ranks_subjects_and_says_unknown(api, lfw_faces):
    for name in (BUSH, POWELL, BLAIR):
        new_subject(api, name.lower(), name)
        enroll(api, name.lower(), lfw_faces[name][0])
    enroll(api, "george_w_bush", lfw_faces[BUSH][1])  # a second face: the subject must still appear once
    found = api.post("/identify", files={"image": lfw_faces[POWELL][0]}).json()
    assert found["match"]["subject_id"] == "colin_powell" and found["match"]["name"] == POWELL
    ids = [c["subject_id"] for c in found["candidates"]]
    assert sorted(ids) == sorted({"george_w_bush", "colin_powell", "tony_blair"}) and ids[0] == "colin_powell"
    sims = [c["similarity"] for c in found["candidates"]]
    assert sims == sorted(sims, reverse=True)
    # each candidate's number on the threshold's own scale (a cosine decision here: the similarity itself)
    assert [c["score"] for c in found["candidates"]] == sims and found["best_score"] == sims[0] >= found["threshold"]
    assert found["face"]["score"] > 0.5 and found["results"] is None
    # decided at the default FPIR over the 4 faces searched: each comparison at 1 − 0.99^(1/4)
    assert (found["fpir"], found["gallery_faces"], found["far"], found["extrapolated"]) == (0.01, 4, "2.50943e-3", False)
    assert 0.8 < found["threshold"] < 0.9  # between the test embedder's 1e-2 and 1e-3 thresholds
    by_far = api.post("/identify", files={"image": lfw_faces[POWELL][0]}, data={"far": "1e-3"}).json()
    assert (by_far["far"], by_far["threshold"], by_far["fpir"]) == ("1e-3", 0.9, None)
    error(api.post("/identify", files={"image": lfw_faces[POWELL][0]}, data={"far": "1e-3", "fpir": "1e-3"}), 422, "invalid_parameters")
    top1 = api.post("/identify", json={"image": b64(lfw_faces[POWELL][0]), "top_k": 1}).json()
    assert [c["subject_id"] for c in top1["candidates"]] == ["colin_powell"]
    unknown = api.post("/identify", files={"image": lfw_faces[POWELL][0]}, data={"threshold": "1.0001"})
    assert unknown.status_code == 422  # thresholds are cosines in [-1, 1]
    strict = api.post("/identify", files={"image": lfw_faces[LFW_PEOPLE[4]][0]}).json()
    assert strict["match"] is None and strict["candidates"]  # not enrolled: candidates, but no match
    for top_k in ("0", "101"):
        error(api.post("/identify", files={"image": lfw_faces[POWELL][0]}, data={"top_k": top_k}), 422, "invalid_parameters")


def test_identify_every_face(api, two_faces_jpeg, lfw_faces):
    new_subject(api, "powell")
    enroll(api, "powell", lfw_faces[POWELL][0])
    result = api.post("/identify", files={"image": two_faces_jpeg}, data={"faces": "all"}).json()
    assert len(result["results"]) == 2
    assert result["results"][0]["face"] == result["face"]
    best = max(result["results"], key=lambda r: r["candidates"][0]["similarity"])
    assert best["candidates"][0]["subject_id"] == "powell"


def test_identify_on_an_empty_gallery(api, lfw_faces):
    result = api.post("/identify", files={"image": lfw_faces[BUSH][0]}).json()
    assert result["candidates"] == [] and result["match"] is None


def test_embed_returns_unit_vectors_for_every_face(api, two_faces_jpeg):
    result = api.post("/embed", json={"image": b64(two_faces_jpeg)}).json()
    assert len(result["faces"]) == 2 and result["dim"] == 64
    for face in result["faces"]:
        assert np.linalg.norm(face["embedding"]) == pytest.approx(1.0, abs=1e-4)
        assert face["face"]["score"] > 0.5
    areas = [(f["face"]["box"][2] - f["face"]["box"][0]) * (f["face"]["box"][3] - f["face"]["box"][1]) for f in result["faces"]]
    assert areas == sorted(areas, reverse=True)


def test_aligned_crops_skip_detection(api):
    crop = aligned_crop_png(1)
    embedded = api.post("/embed", files={"image": crop}, data={"aligned": "true"}).json()
    assert embedded["faces"][0]["face"] is None and len(embedded["faces"][0]["embedding"]) == 64
    new_subject(api, "crop")
    stored = enroll(api, "crop", crop, aligned="true")
    assert stored["box"] is None and stored["score"] is None
    assert api.post("/identify", json={"image": b64(crop), "aligned": True}).json()["match"]["subject_id"] == "crop"
    assert api.post("/verify", json={"image1": b64(crop), "subject_id": "crop", "aligned": True}).json()["match"]
    error(api.post("/embed", files={"image": aligned_crop_png(1)[:0] or _png(100)}, data={"aligned": "true"}), 422, "invalid_aligned_crop")


def _png(side: int, value: int = 128) -> bytes:
    return cv2.imencode(".png", np.full((side, side, 3), value, np.uint8))[1].tobytes()


# gallery routes


def test_subject_crud_and_pagination(api):
    created = new_subject(api, "emp-1", "Ada")
    assert created["face_count"] == 0 and created["metadata"] == {}
    generated = api.post("/subjects", json={"name": "No id", "metadata": {"team": "x"}}).json()
    assert len(generated["id"]) == 32 and generated["metadata"] == {"team": "x"}
    error(api.post("/subjects", json={"id": "emp-1", "name": "again"}), 409, "subject_exists")
    error(api.post("/subjects", json={"id": "bad id!", "name": "x"}), 422, "invalid_parameters")
    error(api.post("/subjects", json={"name": ""}), 422, "invalid_parameters")
    error(api.post("/subjects", json={"name": "x", "unknown": 1}), 422, "invalid_parameters")
    for i in range(3):
        new_subject(api, f"p{i}")
    page = api.get("/subjects", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5 and page["limit"] == 2 and [s["id"] for s in page["subjects"]] == [generated["id"], "p0"]
    everyone = [s["id"] for s in api.get("/subjects", params={"limit": 2, "offset": 0}).json()["subjects"]]
    everyone += [s["id"] for s in page["subjects"]] + [s["id"] for s in api.get("/subjects", params={"offset": 3}).json()["subjects"]]
    assert everyone[:1] + everyone[2:] == ["emp-1", generated["id"], "p0", "p1", "p2"]
    error(api.get("/subjects", params={"limit": 0}), 422, "invalid_parameters")
    patched = api.patch("/subjects/emp-1", json={"metadata": {"level": 3}}).json()
    assert patched["name"] == "Ada" and patched["metadata"] == {"level": 3}
    assert api.get("/subjects/emp-1").json()["metadata"] == {"level": 3}
    error(api.patch("/subjects/ghost", json={"name": "x"}), 404, "subject_not_found")
    error(api.get("/subjects/ghost"), 404, "subject_not_found")
    assert api.delete("/subjects/emp-1").status_code == 204
    error(api.delete("/subjects/emp-1"), 404, "subject_not_found")


def test_enroll_list_and_delete_faces(api, lfw_faces):
    new_subject(api, "bush")
    stored = enroll(api, "bush", lfw_faces[BUSH][0])
    assert stored["face_id"] > 0 and stored["searchable"] and stored["score"] > 0.75 and len(stored["box"]) == 4
    second = api.post("/subjects/bush/faces", json={"image": b64(lfw_faces[BUSH][1])})
    assert second.status_code == 201
    faces = api.get("/subjects/bush/faces").json()["faces"]
    assert [f["face_id"] for f in faces] == [stored["face_id"], second.json()["face_id"]]
    assert api.get("/subjects/bush").json()["face_count"] == 2
    assert api.delete(f"/faces/{stored['face_id']}").status_code == 204
    error(api.delete(f"/faces/{stored['face_id']}"), 404, "face_not_found")
    error(api.delete("/faces/not-a-number"), 422, "invalid_parameters")
    error(api.delete(f"/faces/{2**70}"), 422, "invalid_parameters")
    error(api.get("/subjects", params={"offset": 2**70}), 422, "invalid_parameters")
    error(api.get("/subjects/ghost/faces"), 404, "subject_not_found")
    error(api.post("/subjects/ghost/faces", files={"image": lfw_faces[BUSH][0]}), 404, "subject_not_found")


def test_deletes_remove_faces_from_search(api, lfw_faces):
    new_subject(api, "bush")
    new_subject(api, "powell")
    face = enroll(api, "bush", lfw_faces[BUSH][0])
    enroll(api, "powell", lfw_faces[POWELL][0])
    assert api.post("/identify", files={"image": lfw_faces[BUSH][0]}).json()["match"]["subject_id"] == "bush"
    api.delete(f"/faces/{face['face_id']}")
    after_face = api.post("/identify", files={"image": lfw_faces[BUSH][0]}).json()
    assert after_face["match"] is None and all(c["subject_id"] != "bush" for c in after_face["candidates"])
    api.delete("/subjects/powell")
    assert api.post("/identify", files={"image": lfw_faces[POWELL][0]}).json()["candidates"] == []
    assert api.get("/readyz").json()["gallery"]["faces"] == 0


def test_bulk_enrollment_reports_each_image(api, lfw_faces):
    new_subject(api, "bush")
    response = api.post("/subjects/bush/faces", files=[("images", lfw_faces[BUSH][0]), ("images", b"not an image"), ("images", _png(200))])
    assert response.status_code == 201
    body = response.json()
    assert body["enrolled"] == 1
    assert [r["index"] for r in body["results"]] == [0, 1, 2]
    assert body["results"][0]["face"]["face_id"] > 0
    assert body["results"][1]["error"]["code"] == "invalid_image" and body["results"][2]["error"]["code"] == "no_face"
    as_json = api.post("/subjects/bush/faces", json={"images": [b64(lfw_faces[BUSH][1])]})
    assert as_json.status_code == 201 and as_json.json()["enrolled"] == 1
    failed = api.post("/subjects/bush/faces", json={"images": [b64(_png(200))]})
    error(failed, 422, "enrollment_failed")
    assert failed.json()["error"]["details"][0]["code"] == "no_face"
    error(
        api.post("/subjects/bush/faces", files=[("images", lfw_faces[BUSH][0]), ("image", lfw_faces[BUSH][0])]), 422, "invalid_parameters"
    )
    error(api.post("/subjects/bush/faces", json={"images": [b64(_png(20))] * 21}), 422, "invalid_parameters")
    assert api.get("/subjects/bush").json()["face_count"] == 2


def test_quality_gate(api_settings, make_client, lfw_faces):
    api = make_client(api_settings.model_copy(update={"enroll_min_face_size": 400}))
    new_subject(api, "bush")
    assert "short side" in error(api.post("/subjects/bush/faces", files={"image": lfw_faces[BUSH][0]}), 422, "low_quality_face")
    api = make_client(api_settings.model_copy(update={"enroll_min_score": 0.99, "data_dir": api_settings.data_dir / "2"}))
    new_subject(api, "bush")
    assert "score" in error(api.post("/subjects/bush/faces", files={"image": lfw_faces[BUSH][0]}), 422, "low_quality_face")
    assert api.get("/subjects/bush").json()["face_count"] == 0


def _altered(jpeg: bytes, change) -> bytes:
    return cv2.imencode(".png", change(cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)))[1].tobytes()


def test_quality_gate_names_the_check_and_enrolls_on_request(api, lfw_faces):
    new_subject(api, "bush")
    photo = lfw_faces[BUSH][0]
    blurred = _altered(photo, lambda image: cv2.GaussianBlur(image, (0, 0), 3))
    refused = api.post("/subjects/bush/faces", files={"image": blurred})
    assert "blurred" in error(refused, 422, "low_quality_face")
    assert [d["check"] for d in refused.json()["error"]["details"]] == ["too_blurred"]
    dark = api.post("/subjects/bush/faces", files={"image": _altered(photo, lambda image: cv2.convertScaleAbs(image, alpha=0.25))})
    assert "too dark" in error(dark, 422, "low_quality_face")
    assert "too_dark" in [d["check"] for d in dark.json()["error"]["details"]]
    bulk = api.post("/subjects/bush/faces", files=[("images", blurred), ("images", blurred)])
    assert bulk.json()["error"]["details"][0]["code"] == "low_quality_face"
    assert api.get("/subjects/bush").json()["face_count"] == 0
    assert "blurred" in enroll(api, "bush", blurred, allow_low_quality="true")["quality_warning"]
    assert enroll(api, "bush", photo)["quality_warning"] is None
    assert api.get("/subjects/bush").json()["face_count"] == 2


def test_quality_gate_off(api_settings, make_client, lfw_faces):
    api = make_client(api_settings.model_copy(update={"enroll_quality_gate": False, "enroll_min_face_size": 400}))
    new_subject(api, "bush")
    assert enroll(api, "bush", _altered(lfw_faces[BUSH][0], lambda image: cv2.GaussianBlur(image, (0, 0), 3)))["quality_warning"] is None


# bad input: one error schema, never a 5xx, nothing changed


def test_image_errors(api, lfw_faces):
    for route, field in (("/embed", "image"), ("/identify", "image")):
        error(api.post(route, files={field: b"definitely not an image"}), 400, "invalid_image")
        error(api.post(route, json={field: "%%%not base64"}), 422, "invalid_base64")
        error(api.post(route, files={field: _png(200)}), 422, "no_face")
        error(api.post(route, files={field: _png(8)}), 422, "image_too_small")
    ppm = io.BytesIO()
    Image.new("RGB", (64, 64)).save(ppm, format="PPM")
    error(api.post("/embed", files={"image": ppm.getvalue()}), 415, "unsupported_media_type")
    error(api.post("/embed", json={"image": 123}), 422, "invalid_parameters")
    message = error(api.post("/embed", data={"image": "text"}, files={"images": b"x"}), 422, "invalid_parameters")
    assert "file part" in message
    error(api.post("/embed", data={"image": "a form field"}), 415, "unsupported_media_type")
    error(api.post("/embed", files={"picture": lfw_faces[BUSH][0]}), 422, "invalid_parameters")
    error(api.post("/embed", json={}), 422, "invalid_parameters")
    error(api.post("/embed", json=[1, 2]), 422, "invalid_parameters")
    error(api.post("/embed", json={"image": None}), 422, "invalid_parameters")
    error(api.post("/embed", files={"image": lfw_faces[BUSH][0]}, data={"aligned": ""}), 422, "invalid_parameters")
    for far in ("", "abc", "1e400", "2", "nan"):
        error(api.post("/identify", files={"image": lfw_faces[BUSH][0]}, data={"far": far}), 422, "invalid_parameters")


def test_body_errors(api_settings, make_client, lfw_faces):
    api = make_client(api_settings.model_copy(update={"max_request_bytes": 50_000}))
    error(api.post("/embed", content=b"{not json", headers={"content-type": "application/json"}), 400, "invalid_json")
    error(api.post("/embed", content=b"x", headers={"content-type": "text/plain"}), 415, "unsupported_media_type")
    error(api.post("/embed", content=b"x"), 415, "unsupported_media_type")
    big = b"x" * 60_000
    error(api.post("/embed", content=big, headers={"content-type": "application/json"}), 413, "body_too_large")

    def chunks():  # no Content-Length: the streaming cap answers
        for _ in range(10):
            yield b"x" * 10_000

    error(api.post("/embed", content=chunks(), headers={"content-type": "application/json"}), 413, "body_too_large")
    error(api.post("/subjects", content=chunks(), headers={"content-type": "application/json"}), 413, "body_too_large")
    error(api.get("/nowhere"), 404, "not_found")
    error(api.put("/verify"), 405, "method_not_allowed")
    assert api.get("/subjects").json()["total"] == 0


def test_image_limit_inside_the_body(api_settings, make_client, lfw_faces):
    api = make_client(api_settings.model_copy(update={"max_image_bytes": 1000}))
    error(api.post("/embed", files={"image": lfw_faces[BUSH][0]}), 413, "image_too_large")


# operations


def test_readyz_metrics_and_docs(api, lfw_faces):
    ready = api.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] and body["models"]["embedder"]["name"] == "test-embedder"
    assert body["models"]["detector"]["providers"] == ["CPUExecutionProvider"] and len(body["models"]["embedder"]["sha256"]) == 64
    assert body["warmup"] == "done" and body["serving"]["embed_batch_sizes"] == [1, 2, 4, 8]
    assert "CPUExecutionProvider" in body["models"]["embedder"]["provider_options"]
    index = {"backend": "faiss-flat", "factory": "Flat", "search_params": "", "search_params_source": "default", "size": 0, "trained": True}
    index["recall"] = {"recall_at_1": 1.0, "exact": True}  # a flat index is exact: never sampled
    assert body["gallery"] == {
        "subjects": 0,
        "faces": 0,
        "searchable_faces": 0,
        "incompatible_faces": 0,
        "incompatible_models": {},
        "loading": False,
        "index": index,
    }
    api.post("/verify", files={"image1": lfw_faces[BUSH][0], "image2": lfw_faces[BUSH][1]})
    api.get("/subjects/ghost")
    text = api.get("/metrics").text
    assert 'facegate_requests_total{method="POST",route="/verify",status="200"} 1.0' in text
    assert 'facegate_requests_total{method="GET",route="/subjects/{subject_id}",status="404"} 1.0' in text
    assert "facegate_embed_batch_size_count" in text and "facegate_faces_embedded_total 2.0" in text
    assert (
        'facegate_gallery_faces{collection="default",searchable="true"} 0.0' in text
        and 'facegate_gallery_index_size{backend="faiss-flat",collection="default"} 0.0' in text
    )
    assert api.get("/docs").status_code == 200
    schema = api.get("/openapi.json").json()
    body = schema["paths"]["/verify"]["post"]["requestBody"]["content"]
    assert body["multipart/form-data"]["schema"]["properties"]["image1"]["format"] == "binary"
    assert body["application/json"]["schema"]["properties"]["image1"]["contentEncoding"] == "base64"
    assert "far" in body["application/json"]["schema"]["properties"]
    assert "422" in schema["paths"]["/verify"]["post"]["responses"]
    for path in (
        "/verify",
        "/identify",
        "/embed",
        "/subjects",
        "/subjects/{subject_id}",
        "/subjects/{subject_id}/faces",
        "/faces/{face_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in schema["paths"]


def test_batching_off_gives_the_same_answers(api_settings, make_client, lfw_faces):
    on = make_client(api_settings)
    off = make_client(api_settings.model_copy(update={"batching": False, "data_dir": api_settings.data_dir / "off"}))
    files = {"image1": lfw_faces[BUSH][0], "image2": lfw_faces[BLAIR][0]}
    assert on.post("/verify", files=files).json()["similarity"] == pytest.approx(
        off.post("/verify", files=files).json()["similarity"], abs=1e-6
    )


def test_starts_without_models_and_says_why(tmp_path, make_client):
    from service.core.settings import Settings

    settings = Settings(model_cache=tmp_path / "empty-cache", embedder="my-face", data_dir=tmp_path / "gallery", device="cpu")
    api = make_client(settings)
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 503
    problems = {p["model"]: p for p in ready.json()["problems"]}
    assert problems["embedder"]["name"] == "my-face" and "FACEGATE_EMBEDDER" in problems["embedder"]["fix"]
    assert "detector" not in problems  # the detector ships in models/: an empty cache does not lose it
    error(api.post("/verify", files={"image1": _png(200), "image2": _png(200)}), 503, "model_unavailable")
    error(api.post("/identify", json={"image": b64(_png(200))}), 503, "model_unavailable")
    error(api.post("/embed", files={"image": _png(200)}), 503, "model_unavailable")
    assert api.post("/subjects", json={"id": "a", "name": "A"}).status_code == 201
    error(api.post("/subjects/a/faces", files={"image": _png(200)}), 503, "model_unavailable")
    assert api.patch("/subjects/a", json={"name": "B"}).json()["name"] == "B"
    assert api.get("/subjects").json()["total"] == 1
    assert api.get("/subjects/a/faces").json()["faces"] == []
    assert api.delete("/subjects/a").status_code == 204


def test_api_key_settings_from_env(monkeypatch, api_settings):
    monkeypatch.setenv("FACEGATE_API_KEYS", "k1,k2")
    from service.core.settings import Settings

    assert Settings().api_keys == SecretStr("k1,k2") and "k1" not in repr(Settings())


def test_enrollment_stores_chips_only_with_store_crops(api_settings, make_client, lfw_faces):
    import json
    import sqlite3

    from service.core.alignment import ARCFACE_112, LOOSE_320
    from service.gallery.sqlite import DATABASE, decode_crop

    for store in (False, True):
        settings = api_settings.model_copy(update={"store_crops": store, "data_dir": api_settings.data_dir / str(store)})
        api = make_client(settings)
        new_subject(api, "bush")
        enroll(api, "bush", lfw_faces[BUSH][0])
        assert api.post("/subjects/bush/faces", files={"image": aligned_crop_png(1)}, data={"aligned": "true"}).status_code == 201
        db = sqlite3.connect(settings.data_dir / DATABASE)
        rows = db.execute("SELECT crop, crop_frame, crop_landmarks FROM faces ORDER BY id").fetchall()
        db.close()
        if not store:
            assert rows == [(None, None, None)] * 2
            continue
        (detected, frame, landmarks), (uploaded, upload_frame, upload_landmarks) = rows
        assert frame == "loose_320" and decode_crop(detected).shape == (320, 320, 3)
        assert np.abs(np.array(json.loads(landmarks)) - LOOSE_320).max() < 18  # near the loose frame's points
        assert upload_frame == "arcface_112" and np.allclose(json.loads(upload_landmarks), ARCFACE_112)
        assert np.array_equal(
            decode_crop(uploaded)[..., ::-1], cv2.imdecode(np.frombuffer(aligned_crop_png(1), np.uint8), cv2.IMREAD_COLOR)
        )


def test_identify_with_a_cohort_decides_on_as_norm_scores(api_settings, make_client, embedder_manifest, lfw_faces, tmp_path):
    """FACEGATE_COHORT: FPIR decisions hold the best candidate's AS-norm score to the cohort's curve
    (here a synthetic cohort and a standard-normal impostor curve); far and threshold stay cosines.
    A cohort made for another embedder leaves the service unready rather than deciding differently."""
    from statistics import NormalDist

    import numpy as np

    from service.core.models.manifest import Manifest
    from training.cohort_builder import write
    from training.thresholds import far_curve

    embedder = Manifest.load(embedder_manifest)
    rng = np.random.default_rng(0)
    faces = rng.normal(size=(400, embedder.embedding_dim)).astype(np.float32)
    faces /= np.linalg.norm(faces, axis=1, keepdims=True)
    write(tmp_path / "cohort", embedder, faces, far_curve(rng.normal(size=200_000)), 50, {}, {}, {"name": "synthetic"})
    api = make_client(api_settings.model_copy(update={"cohort": tmp_path / "cohort.json"}))
    for name in (POWELL, BUSH):
        new_subject(api, name.lower(), name)
        enroll(api, name.lower(), lfw_faces[name][0])
    found = api.post("/identify", files={"image": lfw_faces[POWELL][0]}).json()
    assert found["score"] == "as-norm" and found["match"]["subject_id"] == "colin_powell"
    # the curve is a standard normal's: at FPIR 1% over 2 faces the best of two impostor scores passes
    # with probability 1 − Φ(t)², so t = Φ⁻¹(0.99^½) (200 000 samples: the curve is within 0.03 of it)
    assert found["threshold"] == pytest.approx(NormalDist().inv_cdf(0.99**0.5), abs=0.03)
    assert api.post("/identify", files={"image": lfw_faces[POWELL][0]}, data={"far": "1e-3"}).json()["score"] == "cosine"

    other = Manifest.load(embedder_manifest).model_copy(update={"name": "another-embedder"})
    write(tmp_path / "other", other, faces, far_curve(rng.normal(size=200_000)), 50, {}, {}, {"name": "synthetic"})
    unready = make_client(api_settings.model_copy(update={"cohort": tmp_path / "other.json", "data_dir": tmp_path / "g2"}))
    ready = unready.get("/readyz")
    assert ready.status_code == 503 and any(p["model"] == "cohort" for p in ready.json()["problems"])
    error(unready.post("/identify", files={"image": lfw_faces[POWELL][0]}), 503, "model_unavailable")


def test_verify_without_far_falls_back_when_the_default_far_is_not_calibrated(
    api_settings, make_client, embedder_manifest, lfw_faces, tmp_path
):
    """Issue 48, item 6: a model calibrated on 12 people has only FAR 1e-2's threshold. /verify naming no
    far answers at 1e-2 with a warning (not 422 unknown_far), /readyz says so once, and a request
    naming the missing FAR is still refused."""
    import json
    import shutil

    few = tmp_path / "few" / embedder_manifest.name
    few.parent.mkdir()
    shutil.copy(embedder_manifest.with_suffix(".onnx"), few.parent)
    manifest = json.loads(embedder_manifest.read_text())
    few.write_text(json.dumps({**manifest, "thresholds": {"1e-2": manifest["thresholds"]["1e-2"]}, "far_curve": None}))
    api = make_client(api_settings.model_copy(update={"embedder": str(few)}))
    image = lfw_faces[BUSH][0]
    answer = api.post("/verify", files={"image1": image, "image2": image})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["far"], body["threshold"]) == ("1e-2", manifest["thresholds"]["1e-2"]) and "default FAR 1e-3" in body["warning"]
    assert api.post("/verify", files={"image1": image, "image2": image}, data={"far": "1e-2"}).json()["warning"] is None
    error(api.post("/verify", files={"image1": image, "image2": image}, data={"far": "1e-3"}), 422, "unknown_far")
    (problem,) = api.get("/readyz").json()["problems"]
    assert "FACEGATE_DEFAULT_FAR" in problem["error"] and "FACEGATE_DEFAULT_FAR=1e-2" in problem["fix"]
