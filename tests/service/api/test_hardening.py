"""Regression tests for the defects a hostile probe found (issue 17): bad input gets a 4xx in the one
error schema and changes nothing; nothing a client can store makes a later answer fail."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from pydantic import SecretStr

from tests.conftest import LFW_PEOPLE
from tests.service.api.test_routes import b64, error, new_subject

BUSH = LFW_PEOPLE[0]


def nested(depth: int) -> dict:
    return json.loads('{"a":' * depth + "1" + "}" * depth)


def raw_json(api, method: str, path: str, text: str | bytes):
    return api.request(method, path, content=text, headers={"content-type": "application/json"})


# 1, 2: metadata depth and size are checked before the write; stored rows never break a page


@pytest.mark.parametrize("depth", [40, 300, 900])
def test_deep_metadata_is_refused_before_the_write(api, depth):
    error(api.post("/subjects", json={"id": "deep", "name": "x", "metadata": nested(depth)}), 422, "invalid_parameters")
    new_subject(api, "ok")
    error(api.patch("/subjects/ok", json={"metadata": nested(depth)}), 422, "invalid_parameters")
    page = api.get("/subjects")
    assert page.status_code == 200 and [s["id"] for s in page.json()["subjects"]] == ["ok"]
    assert api.get("/subjects/ok").json()["metadata"] == {}


def test_metadata_within_the_limits_is_kept(api):
    metadata = {"deep": nested(10), "text": "x" * 1000}
    created = api.post("/subjects", json={"id": "a", "name": "A", "metadata": metadata})
    assert created.status_code == 201 and created.json()["metadata"] == metadata


def test_metadata_size_is_capped(api_settings, make_client):
    api = make_client(api_settings.model_copy(update={"max_metadata_bytes": 1000}))
    message = error(api.post("/subjects", json={"name": "x", "metadata": {"blob": "x" * 2000}}), 422, "invalid_parameters")
    assert "FACEGATE_MAX_METADATA_BYTES" in message
    new_subject(api, "a")
    error(api.patch("/subjects/a", json={"metadata": {"blob": "x" * 2000}}), 422, "invalid_parameters")
    assert api.get("/subjects").json()["total"] == 1


def test_stored_rows_that_cannot_be_served_do_not_break_a_page(api, api_settings):
    """Rows written before the limits existed: served without their metadata, with the reason."""
    from service.gallery.sqlite import DATABASE

    for subject_id in ("before", "poisoned", "big", "after"):
        new_subject(api, subject_id)
    db = sqlite3.connect(api_settings.data_dir / DATABASE)
    with db:
        db.execute("UPDATE subjects SET metadata = ? WHERE id = 'poisoned'", (json.dumps(nested(900)),))
        db.execute("UPDATE subjects SET metadata = ? WHERE id = 'big'", (json.dumps({"blob": "x" * 100_000}),))
    db.close()
    page = api.get("/subjects")
    assert page.status_code == 200, page.text
    subjects = {s["id"]: s for s in page.json()["subjects"]}
    assert list(subjects) == ["before", "poisoned", "big", "after"]
    for subject_id in ("poisoned", "big"):
        assert subjects[subject_id]["metadata"] == {} and "PATCH" in subjects[subject_id]["metadata_withheld"]
        single = api.get(f"/subjects/{subject_id}")
        assert single.status_code == 200 and single.json()["metadata_withheld"]
    assert subjects["before"]["metadata_withheld"] is None
    repaired = api.patch("/subjects/poisoned", json={"metadata": {"ok": 1}}).json()
    assert repaired["metadata"] == {"ok": 1} and repaired["metadata_withheld"] is None


def test_a_page_is_bounded_in_bytes(api_settings, make_client):
    api = make_client(api_settings.model_copy(update={"max_page_bytes": 20_000}))
    for i in range(6):
        assert api.post("/subjects", json={"id": f"s{i}", "name": "x", "metadata": {"blob": "x" * 6000}}).status_code == 201
    seen, offset = [], 0
    while offset is not None:
        response = api.get("/subjects", params={"limit": 1000, "offset": offset})
        assert response.status_code == 200 and len(response.content) <= 20_000
        page = response.json()
        assert 1 <= len(page["subjects"]) < 6 and page["total"] == 6
        seen += [s["id"] for s in page["subjects"]]
        offset = page["next_offset"]
    assert seen == [f"s{i}" for i in range(6)]
    assert api.get("/subjects", params={"limit": 2, "offset": 4}).json()["next_offset"] is None


# 3: faces per image, faces × top_k


def test_too_many_faces_are_refused(api_settings, make_client, two_faces_jpeg):
    api = make_client(api_settings.model_copy(update={"max_faces": 1}))
    for route, fields in (("/identify", {"faces": "all"}), ("/embed", {})):
        message = error(api.post(route, files={"image": two_faces_jpeg}, data=fields), 422, "too_many_faces")
        assert "FACEGATE_MAX_FACES" in message
    assert api.post("/identify", files={"image": two_faces_jpeg}).status_code == 200  # the largest face only


def test_faces_times_top_k_is_bounded(api_settings, make_client, two_faces_jpeg):
    api = make_client(api_settings.model_copy(update={"max_identify_candidates": 5}))
    message = error(api.post("/identify", files={"image": two_faces_jpeg}, data={"faces": "all", "top_k": 3}), 422, "too_many_faces")
    assert "top_k" in message
    assert api.post("/identify", files={"image": two_faces_jpeg}, data={"faces": "all", "top_k": 2}).status_code == 200


# 4: deeply nested or malformed JSON is 400 invalid_json everywhere


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/verify"),
        ("POST", "/identify"),
        ("POST", "/embed"),
        ("POST", "/subjects/a/faces"),
        ("POST", "/subjects"),
        ("PATCH", "/subjects/a"),
    ],
)
def test_deep_or_malformed_json_is_invalid_json(api, method, path):
    new_subject(api, "a")
    for body in (DEEP, '{"image": ' + DEEP[:50_000], "{not json", b"\xff\xfe"):
        error(raw_json(api, method, path, body), 400, "invalid_json")
    assert api.get("/subjects").json()["total"] == 1 and api.get("/subjects/a").json()["name"] == "a"


# 6: the smaller ones


def test_repeated_fields_are_refused(api, lfw_faces):
    image = lfw_faces[BUSH][0]
    files = [("image1", image), ("image2", image)]
    error(api.post("/verify", files=files, data={"threshold": ["0.1", "0.9"]}), 422, "invalid_parameters")
    error(api.post("/verify", files=[*files, ("image1", image)]), 422, "invalid_parameters")
    error(
        raw_json(api, "POST", "/verify", f'{{"image1": "{b64(image)}", "image2": "{b64(image)}", "threshold": 0.1, "threshold": 0.9}}'),
        422,
        "invalid_parameters",
    )
    error(raw_json(api, "POST", "/subjects", '{"name": "a", "name": "b"}'), 422, "invalid_parameters")
    assert api.post("/verify", files=files, data={"threshold": "0.1"}).status_code == 200


def test_query_string_credentials_are_not_logged(api, caplog):
    access = logging.getLogger("uvicorn.access")
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/subjects?limit=2&api_key=s3cret&X-API-Key=other", "1.1", 401)
    assert "s3cret" not in caplog.text and "other" not in caplog.text
    assert "limit=2" in caplog.text and "api_key=" in caplog.text


def test_readyz_is_minimal_without_a_key(api_settings, make_client):
    api = make_client(api_settings.model_copy(update={"api_keys": SecretStr("s3cret")}))
    anonymous = api.get("/readyz")
    assert anonymous.status_code == 200 and anonymous.json() == {"ready": True}
    assert api.get("/readyz", headers={"X-API-Key": "wrong"}).json() == {"ready": True}
    full = api.get("/readyz", headers={"X-API-Key": "s3cret"}).json()
    assert full["models"]["embedder"]["sha256"] and "gallery" in full


def test_error_codes_match_the_table(api):
    heic = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 200
    assert "HEI" in error(api.post("/embed", files={"image": heic}), 415, "unsupported_media_type")
    error(raw_json(api, "POST", "/subjects", "{bad"), 400, "invalid_json")
    message = error(api.post("/embed", files=[("images", b"x")] * 100), 400, "bad_request")
    assert "files" in message
    message = error(api.post("/embed", files={"image": b"x"}, data={f"f{i}": "1" for i in range(100)}), 400, "bad_request")
    assert "fields" in message
