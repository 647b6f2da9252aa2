"""Enrollment's `possible_duplicate_of`: the other subject /identify would answer for the new face
were its own subject not enrolled, and never an error for an enrollment that was committed."""

from __future__ import annotations

from service.core.errors import GalleryUnavailable
from tests.conftest import aligned_crop_png


def enroll(api, subject: str, seed: int, **extra) -> dict:
    assert api.post("/subjects", json={"id": subject, "name": subject.upper()}).status_code in (201, 409)
    response = api.post(f"/subjects/{subject}/faces", files={"image": aligned_crop_png(seed)}, data={"aligned": "true", **extra})
    assert response.status_code == 201, response.text
    return response.json()


def test_the_same_face_under_a_second_id_is_flagged(api):
    assert enroll(api, "a", 1)["possible_duplicate_of"] is None  # alone in the gallery: nobody else to be
    again = enroll(api, "b", 1)["possible_duplicate_of"]
    assert (again["subject_id"], again["name"]) == ("a", "A") and again["similarity"] > 0.999 and again["score"] >= again["threshold"]
    assert enroll(api, "a", 1)["possible_duplicate_of"]["subject_id"] == "b"  # its own subject's faces never count
    bulk = api.post("/subjects/c/faces", files=[("images", aligned_crop_png(1))], data={"aligned": "true"})
    assert bulk.status_code == 404  # no subject c: nothing enrolled, nothing checked
    listed = api.get("/subjects/a/faces").json()["faces"]
    assert "possible_duplicate_of" not in listed[0]  # an enrollment's answer, not a stored field


def test_a_search_failing_after_the_commit_leaves_the_enrollment_answered(api, monkeypatch):
    enroll(api, "a", 1)
    service = api.app.state.service

    def down(*_args):
        raise GalleryUnavailable("the gallery database is unavailable: test")

    monkeypatch.setattr(service.gallery, "search", down)
    answer = enroll(api, "b", 1)
    assert answer["possible_duplicate_of"] is None and answer["face_id"] > 0
    monkeypatch.undo()
    assert len(api.get("/subjects/b/faces").json()["faces"]) == 1  # committed
