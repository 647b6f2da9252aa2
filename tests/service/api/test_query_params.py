"""Query strings on the gallery's GET routes (issue 23, defect 8): a repeated or unknown parameter
is a 422 invalid_parameters in the JSON shape, as the docs say, not silently ignored."""

from __future__ import annotations

import pytest

from tests.service.api.test_routes import error, new_subject


@pytest.mark.parametrize(
    "query",
    ["limit=1&limit=2", "offset=0&offset=0", "limt=5", "api_key=x", "limit=2&bogus", "LIMIT=2"],
    ids=["repeated-limit", "repeated-offset", "misspelt", "key-in-query", "bare-name", "wrong-case"],
)
def test_gallery_lists_refuse_repeated_or_unknown_query_parameters(api, query):
    new_subject(api, "a")
    for path in ("/subjects", "/subjects/a", "/subjects/a/faces"):  # limit and offset are unknown off the list
        message = error(api.get(f"{path}?{query}"), 422, "invalid_parameters")
        assert "query parameter" in message, message


def test_declared_query_parameters_still_work(api):
    for subject_id in ("a", "b", "c"):
        new_subject(api, subject_id)
    page = api.get("/subjects?limit=1&offset=1")
    assert page.status_code == 200 and [s["id"] for s in page.json()["subjects"]] == ["b"]
    assert api.get("/subjects?").status_code == 200
    assert api.get("/subjects/a").status_code == 200
    assert api.get("/subjects/a/faces").status_code == 200
