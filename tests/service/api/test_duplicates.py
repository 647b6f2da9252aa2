"""GET /gallery/duplicates: the pairs of subjects /identify would answer for each other, read from the
open-set guard the gallery keeps (on both stores), or scored from the database where none is kept,
within a bound; bad parameters 422, no key 401."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from service.api.routes import duplicates as routes_duplicates
from service.core import open_set
from service.gallery import duplicates
from tests.conftest import aligned_crop_png

PEOPLE = 12


def enroll(api, subject: str, seed: int, **headers) -> None:
    assert api.post("/subjects", json={"id": subject, "name": f"Name of {subject}"}, headers=headers).status_code == 201
    response = api.post(f"/subjects/{subject}/faces", files={"image": aligned_crop_png(seed)}, data={"aligned": "true"}, headers=headers)
    assert response.status_code == 201, response.text


def enroll_people(api, **headers) -> None:
    for i in range(PEOPLE):
        enroll(api, f"p{i}", 100 + i, **headers)


def test_one_person_under_two_ids_is_listed_from_the_guard(store_settings, make_client, monkeypatch):
    api = make_client(store_settings)
    enroll_people(api)
    assert api.get("/gallery/duplicates").json()["pairs"] == []  # distinct people: nothing to merge
    enroll(api, "again", 103)  # p3's face under a second id

    def no_rebuild(_gallery):
        raise AssertionError("the route scored the gallery again instead of reading its guard")

    monkeypatch.setattr(duplicates, "build", no_rebuild)
    answer = api.get("/gallery/duplicates").json()
    assert (answer["total"], answer["limit"], answer["fpir"], answer["subjects"], answer["faces"]) == (1, 50, 0.01, PEOPLE + 1, PEOPLE + 1)
    (pair,) = answer["pairs"]
    assert {pair["subject_id"], pair["other_subject_id"]} == {"p3", "again"}
    assert pair["name"] == f"Name of {pair['subject_id']}" and pair["other_name"] == f"Name of {pair['other_subject_id']}"
    assert pair["similarity"] > 0.999 and pair["score"] >= answer["threshold"]
    faces = {f["face_id"] for s in ("p3", "again") for f in api.get(f"/subjects/{s}/faces").json()["faces"]}
    assert pair["face_id"] in faces

    assert api.delete("/subjects/again").status_code == 204  # the guard follows the gallery
    assert api.get("/gallery/duplicates").json()["total"] == 0


def test_a_sampled_guard_answers_for_one_subject_at_a_time(store_settings, make_client, monkeypatch):
    """A large gallery's guard lists a sample of its faces (lowered here to 8 faces, 4 listed): every
    pair is then asked for per subject, that subject's faces searched exactly whether sampled or not;
    all the pairs at once are a 503 that says so."""
    monkeypatch.setattr(open_set, "SAMPLE_FROM", 8)
    monkeypatch.setattr(open_set, "LISTED", 4)
    api = make_client(store_settings)
    enroll_people(api)
    enroll(api, "again", 103)  # p3's face under a second id
    refused = api.get("/gallery/duplicates")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "duplicates_unavailable", refused.text
    assert "subject_id" in refused.json()["error"]["message"]
    for subject, other in (("again", "p3"), ("p3", "again")):
        answer = api.get("/gallery/duplicates", params={"subject_id": subject}).json()
        (pair,) = answer["pairs"]
        assert (pair["subject_id"], pair["other_subject_id"], answer["total"]) == (subject, other, 1)
        assert pair["similarity"] > 0.999 and pair["score"] >= answer["threshold"]
        assert (answer["subjects"], answer["faces"]) == (PEOPLE + 1, PEOPLE + 1)
    assert api.get("/gallery/duplicates", params={"subject_id": "p5"}).json()["total"] == 0
    missing = api.get("/gallery/duplicates", params={"subject_id": "ghost"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "subject_not_found"
    monkeypatch.setattr(duplicates, "MAX_SUBJECT_PRODUCTS", PEOPLE)  # 1 face × 13: a request's CPU, bounded
    bounded = api.get("/gallery/duplicates", params={"subject_id": "again"})
    assert bounded.status_code == 503 and bounded.json()["error"]["code"] == "duplicates_unavailable", bounded.text


def test_merging_a_pair_moves_the_faces_and_clears_it(store_settings, make_client):
    """POST /subjects/{id}/merge: the other subject's faces move, it is deleted, and the pair is gone;
    bad merges are 4xx and change nothing."""
    api = make_client(store_settings)
    enroll_people(api)
    enroll(api, "again", 103)
    assert api.get("/gallery/duplicates").json()["total"] == 1
    for target, body, status, code in (
        ("p3", {"subject_id": "p3"}, 422, "invalid_parameters"),
        ("p3", {"subject_id": "ghost"}, 404, "subject_not_found"),
        ("ghost", {"subject_id": "again"}, 404, "subject_not_found"),
        ("p3", {"subject": "again"}, 422, "invalid_parameters"),
    ):
        answer = api.post(f"/subjects/{target}/merge", json=body)
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code), answer.text
    assert api.get("/subjects/again").json()["face_count"] == 1
    merged = api.post("/subjects/p3/merge", json={"subject_id": "again"})
    assert merged.status_code == 200 and (merged.json()["id"], merged.json()["face_count"]) == ("p3", 2)
    assert api.get("/subjects/again").status_code == 404
    answer = api.get("/gallery/duplicates").json()
    assert (answer["total"], answer["subjects"], answer["faces"]) == (0, PEOPLE, PEOPLE + 1)


def test_pairs_are_ranked_limited_and_flagged_at_the_fpir_asked(api):
    enroll_people(api)
    enroll(api, "again3", 103)
    enroll(api, "again7", 107)
    answer = api.get("/gallery/duplicates", params={"fpir": "1e-2"}).json()
    assert (answer["fpir"], answer["score"], answer["total"]) == (0.01, "cosine", 2)  # the test model has no open-set table
    assert [p["score"] for p in answer["pairs"]] == sorted((p["score"] for p in answer["pairs"]), reverse=True)
    assert {frozenset((p["subject_id"], p["other_subject_id"])) for p in answer["pairs"]} == {
        frozenset(("p3", "again3")),
        frozenset(("p7", "again7")),
    }
    first = api.get("/gallery/duplicates", params={"limit": "1", "fpir": "1e-2"}).json()
    assert first["total"] == 2 and first["pairs"] == answer["pairs"][:1]
    strict = api.get("/gallery/duplicates", params={"fpir": "1e-3"}).json()
    assert strict["threshold"] > 1 and strict["total"] == 0  # the test model's 1e-3 is beyond any cosine


def test_without_a_guard_the_pairs_are_scored_per_request_within_a_bound(api_settings, make_client, monkeypatch):
    api = make_client(api_settings.model_copy(update={"open_set_guard": False}))
    enroll_people(api)
    enroll(api, "again", 103)
    (pair,) = api.get("/gallery/duplicates").json()["pairs"]
    assert {pair["subject_id"], pair["other_subject_id"]} == {"p3", "again"}
    monkeypatch.setattr(duplicates, "MAX_BUILT_FACES", PEOPLE)
    refused = api.get("/gallery/duplicates")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "duplicates_unavailable"
    assert "facegate gallery duplicates" in refused.json()["error"]["message"]
    monkeypatch.setattr(duplicates, "MAX_BUILT_FACES", 10 * PEOPLE)
    with routes_duplicates._building:  # another request scoring the gallery
        busy = api.get("/gallery/duplicates")
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "overloaded" and busy.headers["retry-after"] == "1"
    assert api.get("/gallery/duplicates").status_code == 200


@pytest.mark.parametrize(
    "query",
    [{"fpir": "0"}, {"fpir": "0.9"}, {"fpir": "often"}, {"limit": "0"}, {"limit": "1001"}, {"limt": "5"}, {"far": "1e-3"}],
)
def test_bad_parameters_are_422(api, query):
    response = api.get("/gallery/duplicates", params=query)
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_parameters", response.text


def test_a_key_is_needed(api_settings, make_client):
    api = make_client(api_settings.model_copy(update={"api_keys": SecretStr("s3cret")}))
    enroll(api, "a", 1, **{"X-API-Key": "s3cret"})
    assert api.get("/gallery/duplicates").status_code == 401
    assert api.get("/gallery/duplicates", headers={"X-API-Key": "wrong"}).json()["error"]["code"] == "unauthorized"
    assert api.get("/gallery/duplicates", headers={"X-API-Key": "s3cret"}).json()["total"] == 0


def test_the_guard_and_a_fresh_build_list_the_same_pairs(api):
    """What the route reads from the guard, whose rows a delete reorders, is what the CLI builds from
    the database: pairs, the face chosen for each (of equal scores, the older), and their order."""
    enroll_people(api)
    enroll(api, "again3", 103)
    enroll(api, "again7", 107)
    assert api.delete("/subjects/p0").status_code == 204  # the guard's last row moves into the freed one
    enroll(api, "again5", 105)
    answer = api.get("/gallery/duplicates", params={"fpir": "0.5", "limit": "1000"}).json()
    service = api.app.state.service
    built = duplicates.find(duplicates.build(service.gallery), service.ready().manifest, 0.5, service.settings.default_fpir)
    listed = [(p["face_id"], p["subject_id"], p["other_subject_id"], p["score"]) for p in answer["pairs"]]
    assert listed == [(p.face_id, p.subject_id, p.other_subject_id, round(p.score, 6)) for p in built.pairs]
    assert answer["total"] == len(built.pairs) >= 3
