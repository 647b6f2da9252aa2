"""An unpaired UTF-16 surrogate (issue 34, defect 5) is refused before anything is written, in a
metadata value, a metadata key, a name, on SQLite and PostgreSQL alike: it was a 500 after the row
was committed, and every later read of the row a 500. A row stored before (or a write that fails in
the store) leaves nothing half done: rows are served with what cannot be carried withheld."""

from __future__ import annotations

import pytest

from service.core.errors import SubjectNotFound
from tests.service.api.test_routes import error


@pytest.fixture
def client(store_settings, make_client):
    client = make_client(store_settings)
    assert client.post("/subjects", json={"id": "known", "name": "Known", "metadata": {"k": "v"}}).status_code == 201
    return client


def _raw(client, method: str, path: str, text: str):
    return client.request(method, path, content=text.encode(), headers={"content-type": "application/json"})


BAD = [
    ("POST", "/subjects", r'{"id": "x", "name": "x", "metadata": {"k": "\ud800"}}'),
    ("POST", "/subjects", r'{"id": "x", "name": "x", "metadata": {"\udfff": 1}}'),
    ("POST", "/subjects", r'{"id": "x", "name": "x", "metadata": {"k": [{"deep": "a\udc00b"}]}}'),
    ("POST", "/subjects", r'{"id": "x", "name": "a\ud83d"}'),  # a high surrogate without its pair
    ("PATCH", "/subjects/known", r'{"metadata": {"k": "\ud800"}}'),
    ("PATCH", "/subjects/known", r'{"name": "\ude00"}'),
    ("POST", "/api/v1/recognition/subjects", r'{"subject": "\ud800"}'),
]


@pytest.mark.parametrize("method,path,text", BAD)
def test_an_unpaired_surrogate_is_refused_and_nothing_is_written(client, method, path, text):
    response = _raw(client, method, path, text)
    assert response.status_code == 422, response.text
    assert "surrogate" in response.text
    assert [(s["id"], s["name"], s["metadata"]) for s in client.get("/subjects").json()["subjects"]] == [("known", "Known", {"k": "v"})]


def test_a_surrogate_pair_is_one_character_and_kept(client):
    created = _raw(client, "POST", "/subjects", r'{"id": "emoji", "name": "\ud83d\ude00", "metadata": {"\ud83d\udc4d": "\ud83d\ude00"}}')
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "😀" and client.get("/subjects/emoji").json()["metadata"] == {"👍": "😀"}


def test_rows_stored_before_are_served_without_what_cannot_be_carried(client):
    """Metadata written with a lone surrogate before the check existed (the store keeps it as a JSON
    escape): the subject, every page holding it, and a name-only PATCH answer, its metadata withheld."""
    gallery = client.app.state.service.gallery
    gallery.create_subject("Old", {"k": "\ud800", "\udfff": 1}, subject_id="old")
    single = client.get("/subjects/old")
    assert single.status_code == 200 and single.json()["metadata"] == {} and "surrogate" in single.json()["metadata_withheld"]
    page = client.get("/subjects")
    assert page.status_code == 200 and [s["id"] for s in page.json()["subjects"]] == ["known", "old"]
    renamed = client.patch("/subjects/old", json={"name": "Renamed"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "Renamed", renamed.text
    repaired = client.patch("/subjects/old", json={"metadata": {"k": "ok"}})
    assert repaired.json()["metadata"] == {"k": "ok"} and repaired.json()["metadata_withheld"] is None


def test_a_write_the_store_refuses_leaves_nothing_committed(client):
    """Below the API's check, a name UTF-8 cannot encode fails in the store (SQLite's binding,
    psycopg's adaptation) inside the transaction: no row, no change."""
    gallery = client.app.state.service.gallery
    with pytest.raises(UnicodeEncodeError):
        gallery.create_subject("a\ud800", {}, subject_id="half")
    with pytest.raises(SubjectNotFound):
        gallery.get_subject("half")
    with pytest.raises(UnicodeEncodeError):
        gallery.update_subject("known", "b\udfff", {"k": "changed"})
    known = gallery.get_subject("known")
    assert (known.name, known.metadata) == ("Known", {"k": "v"})
    error(client.get("/subjects/half"), 404, "subject_not_found")
