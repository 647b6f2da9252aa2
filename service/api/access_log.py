"""Keeps credentials out of the access log. uvicorn logs every request's path with its query string,
so a client that puts its API key in the URL (it is never read from there) would have it written to
disk: query values whose names look like credentials are masked before the line is formatted."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

CREDENTIAL_NAME = re.compile(r"key|token|secret|passw|auth|credential|signature|session", re.IGNORECASE)
MASK = "***"


def redact(target: str) -> str:
    """`path?query` with the values of credential-like query names replaced by ***."""
    path, separator, query = target.partition("?")
    if not separator:
        return target
    pairs = []
    for pair in query.split("&"):
        name, equals, _ = pair.partition("=")
        pairs.append(f"{name}={MASK}" if equals and CREDENTIAL_NAME.search(unquote_plus(name)) else pair)
    return f"{path}?{'&'.join(pairs)}"


class RedactQuery(logging.Filter):
    """On the `uvicorn.access` logger, whose records carry (client, method, path, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact(args[2]), *args[3:])
        return True


_FILTER = RedactQuery()


def install() -> None:
    """Idempotent: the same filter object is added once, however many apps are created."""
    logging.getLogger("uvicorn.access").addFilter(_FILTER)
