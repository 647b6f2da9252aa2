"""JSON bodies (issue 23, defects 4, 5 and 8): what used to be a 500 or silently accepted is a 400
invalid_json on every JSON route, and parsing runs off the event loop."""

from __future__ import annotations

import pytest

import service.api.requests as requests_module
from tests.service.api.test_event_loop import on_event_loop


@pytest.mark.parametrize("path", ["/subjects", "/verify", "/identify", "/embed"])
@pytest.mark.parametrize(
    "body",
    [
        b'{"n": ' + b"9" * 5000 + b"}",  # past Python's 4,300-digit int limit: was a 500
        b"[" + b"{}," * 20_000 + b"{}]",  # millions of these cost seconds and hundreds of MB
        '{"name": "x"}'.encode("utf-16"),  # the docs say UTF-8
        b'{"name": "x", "metadata": {"a": NaN}}',  # was stored as null
        b'{"name": "x", "metadata": {"a": -Infinity}}',
        b'{"name": "x", "metadata": {"a": 1e400}}',  # overflows a double: was stored as Infinity, served as null
        b'{"name": "x", "metadata": {"a": [-1.5e309]}}',
    ],
    ids=["long-int", "many-containers", "utf16", "nan", "infinity", "overflow", "negative-overflow"],
)
def test_bad_json_is_400_invalid_json(api, path, body):
    response = api.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"


def test_finite_floats_are_kept(api):
    metadata = {"big": 1.7e308, "small": -2.5e-300, "plain": 0.5}
    created = api.post("/subjects", json={"id": "f", "name": "x", "metadata": metadata})
    assert created.status_code == 201 and created.json()["metadata"] == metadata
    assert api.get("/subjects/f").json()["metadata"] == metadata


def test_json_is_parsed_off_the_event_loop(api, monkeypatch):
    on_loop = []
    original = requests_module.parse_json

    def spy(raw):
        on_loop.append(on_event_loop())
        return original(raw)

    monkeypatch.setattr(requests_module, "parse_json", spy)
    assert api.post("/subjects", json={"id": "p1", "name": "x"}).status_code == 201
    refused = api.post("/verify", json={"image1": "AAAA"})  # parsed, then refused: no image2 nor subject_id
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_parameters", refused.text
    assert on_loop == [False, False]
