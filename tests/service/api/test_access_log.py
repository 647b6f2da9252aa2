"""What the access log masks (issue 23, defect 8): credential-like parameters in the query, after
`;` in the query or in a path segment (matrix parameters), and any parameter without a name."""

from __future__ import annotations

import logging

import pytest

from service.api.access_log import install, redact


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/subjects?limit=2&api_key=s3cret", "/subjects?limit=2&api_key=***"),
        ("/subjects?limit=2;api_key=s3cret", "/subjects?limit=2;api_key=***"),  # `;` separates like `&`
        ("/subjects;api_key=s3cret", "/subjects;api_key=***"),  # a matrix parameter
        ("/subjects;api_key=s3cret/a/faces;v=1", "/subjects;api_key=***/a/faces;v=1"),
        ("/subjects?s3cret", "/subjects?***"),  # a bare query: nothing says it is not a key
        ("/subjects?limit=2&s3cret", "/subjects?limit=2&***"),
        ("/subjects;s3cret", "/subjects;***"),
        ("/subjects?a=1&&b=2", "/subjects?a=1&&b=2"),  # empty items hide nothing
        ("/subjects?limit=2&offset=4", "/subjects?limit=2&offset=4"),
        ("/subjects/a.b:c@d-e", "/subjects/a.b:c@d-e"),
        ("/subjects?api%5Fkey=s3cret", "/subjects?api%5Fkey=***"),  # names are compared decoded
    ],
)
def test_redact(target, logged):
    assert redact(target) == logged


def test_the_access_logger_writes_the_masked_target(caplog):
    install()
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/subjects;token=t0k?s3cret", "1.1", 401
        )
    assert "s3cret" not in caplog.text and "t0k" not in caplog.text
    assert "/subjects;token=***?***" in caplog.text
