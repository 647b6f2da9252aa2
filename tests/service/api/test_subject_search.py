"""`GET /subjects?search=`: the console looked a name up by paging through up to 20,000 subjects in
the browser (a larger gallery was searched in part, and said so); the store now finds the subjects
whose name or id contains the text, in any case, through the whole gallery, a page at a time, on
SQLite and PostgreSQL alike. Bad text is a 422 that changes nothing."""

from __future__ import annotations

import pytest


@pytest.fixture
def client(store_settings, make_client):
    client = make_client(store_settings)
    names = {"tb1": "Tony Blair", "tb2": "tony_blair (2)", "zola": "Émile Zola", "anna": "ANNA", "x-blair-id": "Someone"}
    names |= {f"p{i:03d}": f"person {i}" for i in range(40)}
    for subject_id, name in names.items():
        assert client.post("/subjects", json={"id": subject_id, "name": name}).status_code == 201
    return client


def _search(client, text: str, **params) -> dict:
    answer = client.get("/subjects", params={"search": text, **params})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_search_finds_a_part_of_a_name_or_an_id_in_any_case_through_the_whole_gallery(client):
    found = _search(client, "BLAIR")
    assert found["total"] == 3 and [s["id"] for s in found["subjects"]] == ["tb1", "tb2", "x-blair-id"]  # creation order
    first = _search(client, "blair", limit=2)
    assert first["total"] == 3 and len(first["subjects"]) == 2 and first["next_offset"] == 2
    rest = _search(client, "blair", limit=2, offset=2)
    assert [s["id"] for s in rest["subjects"]] == ["x-blair-id"] and rest["next_offset"] is None
    assert [s["id"] for s in _search(client, "person 3")["subjects"]] == ["p003", *(f"p{i:03d}" for i in range(30, 40))]
    assert _search(client, "anna")["total"] == 1 and _search(client, "nobody by that name") == {
        "subjects": [],
        "total": 0,
        "limit": 50,
        "offset": 0,
        "next_offset": None,
    }
    assert client.get("/subjects").json()["total"] == 45  # without search: every subject


def test_a_name_outside_ascii_is_found_in_any_case(client):
    """Folded by the name key's function on both stores (PostgreSQL's lower() follows the database's
    collation: ASCII letters only under "C")."""
    assert [s["id"] for s in _search(client, "Émile")["subjects"]] == ["zola"]
    assert [s["id"] for s in _search(client, "E\u0301mile")["subjects"]] == ["zola"]  # é decomposed: the same text (NFC)
    assert [s["id"] for s in _search(client, "émile")["subjects"]] == ["zola"]


@pytest.mark.parametrize("text", ["", "a\u0000b", "x" * 257])
def test_bad_search_text_is_refused(client, text):
    answer = client.get("/subjects", params={"search": text})
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "invalid_parameters", answer.text
    assert client.get("/subjects").json()["total"] == 45
