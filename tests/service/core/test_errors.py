"""The error tree is complete: every class is a FacegateError with its own code, and the HTTP layer
answers only with codes from it (one code a status where the status alone says what happened)."""

from __future__ import annotations

import io

import pytest
from PIL import Image
from pydantic import SecretStr

from service.core import errors
from service.core.errors import FacegateError, all_errors, error_for_status


def test_every_error_class_is_in_the_tree_with_a_unique_code():
    declared = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, Exception) and c is not FacegateError]
    assert declared and sorted(map(str, declared)) == sorted(map(str, all_errors()))
    codes = [c.code for c in all_errors()]
    assert len(codes) == len(set(codes)), codes
    for cls in all_errors():
        assert issubclass(cls, FacegateError) and isinstance(cls.code, str) and 400 <= cls.status < 600
    assert errors.ModelError in all_errors() and errors.ModelError.status >= 500


@pytest.mark.parametrize("status", [400, 401, 404, 405, 413, 415, 422, 500, 503])
def test_a_bare_status_maps_to_a_class_of_that_status(status):
    assert error_for_status(status).status == status
    assert error_for_status(status) in all_errors()


def test_other_statuses_fall_back_to_a_class_in_the_tree():
    assert error_for_status(418) is errors.BadRequest and error_for_status(502) is errors.InternalError


def _answer(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_http_answers_use_codes_from_the_tree_only(api_settings, make_client):
    """Routing, the body limit, the key check and parsing: each code is a class's code, and the
    two kinds of 415 (content type, image format) give one code."""
    keyed = make_client(
        api_settings.model_copy(
            update={"api_keys": SecretStr("secret"), "max_request_bytes": 50_000, "data_dir": api_settings.data_dir / "k"}
        )
    )
    headers = {"X-API-Key": "secret"}
    ppm = io.BytesIO()
    Image.new("RGB", (64, 64)).save(ppm, format="PPM")
    answers = [
        _answer(keyed.get("/subjects")),
        _answer(keyed.get("/nowhere", headers=headers)),
        _answer(keyed.put("/verify", headers=headers)),
        _answer(keyed.post("/embed", content=b"x" * 60_000, headers={**headers, "content-type": "application/json"})),
        _answer(keyed.post("/embed", content=b"x", headers={**headers, "content-type": "text/plain"})),
        _answer(keyed.post("/embed", files={"image": ppm.getvalue()}, headers=headers)),
        _answer(keyed.get("/subjects", params={"limit": 0}, headers=headers)),
    ]
    assert answers == [
        (401, errors.Unauthorized.code),
        (404, errors.NotFound.code),
        (405, errors.MethodNotAllowed.code),
        (413, errors.BodyTooLarge.code),
        (415, errors.UnsupportedMediaType.code),
        (415, errors.UnsupportedMediaType.code),
        (422, errors.InvalidParameters.code),
    ]
    codes = {c.code for c in all_errors()}
    assert all(code in codes for _, code in answers)
