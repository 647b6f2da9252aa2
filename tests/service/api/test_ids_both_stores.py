"""One validation of ids and names for both stores (issue 23, defect 5): a NUL byte in a path id is
a 404 (it names no subject), in a body's id, name or metadata a 422, on SQLite and PostgreSQL alike
(PostgreSQL's psycopg.DataError was a 500), and the gallery is unchanged."""

from __future__ import annotations

import pytest


@pytest.fixture
def client(store_settings, make_client):
    client = make_client(store_settings)
    assert client.post("/subjects", json={"id": "known", "name": "Known"}).status_code == 201
    return client


PATHS = [
    ("get", "/subjects/a%00b", None),
    ("get", "/subjects/a%00b/faces", None),
    ("patch", "/subjects/a%00b", {"name": "x"}),
    ("delete", "/subjects/a%00b", None),
]
BAD = [
    ("post", "/subjects", {"id": "a\u0000b", "name": "x"}),
    ("post", "/subjects", {"name": "a\u0000b"}),
    ("post", "/subjects", {"name": "x", "metadata": {"k": "a\u0000b"}}),
    ("post", "/subjects", {"name": "x", "metadata": {"a\u0000b": 1}}),
    ("patch", "/subjects/known", {"name": "a\u0000b"}),
    ("patch", "/subjects/known", {"metadata": {"k": ["a\u0000"]}}),
]


@pytest.mark.parametrize(
    "method,path,body,status,code",
    [(*case, 404, "subject_not_found") for case in PATHS] + [(*case, 422, "invalid_parameters") for case in BAD],
)
def test_a_nul_byte_is_refused_alike_on_both_stores(client, method, path, body, status, code):
    response = client.request(method.upper(), path, json=body) if body is not None else client.request(method.upper(), path)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    subjects = client.get("/subjects").json()["subjects"]
    assert [(s["id"], s["name"], s["metadata"]) for s in subjects] == [("known", "Known", {})]
