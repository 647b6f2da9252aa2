"""Keeps credentials out of the access log. uvicorn logs every request's path with its query string,
so a client that puts its API key in the URL (it is never read from there) would have it written to
disk. Before the line is formatted, every parameter of the URL is looked at: the query's items,
split at `&` and at `;` (which some servers take as a separator), and the `;` parameters of each path
segment (matrix parameters, `/subjects;api_key=…`). A `name=value` whose name looks like a credential
keeps its name and loses its value (`api_key=***`); an item without `=` (`?SECRET`, `;SECRET`) is
masked whole, since it can only be a value and some clients pass their key so. No route here takes
either form, so only the log loses detail."""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

CREDENTIAL_NAME = re.compile(r"key|token|secret|passw|auth|credential|signature|session", re.IGNORECASE)
SEPARATOR = re.compile(r"([&;])")
MASK = "***"


def redact(target: str) -> str:
    """`path?query` with credential-like parameter values, and bare parameters, replaced by ***."""
    path, separator, query = target.partition("?")
    segments = []
    for segment in path.split("/"):
        head, semicolon, parameters = segment.partition(";")
        segments.append(f"{head};{_mask(parameters)}" if semicolon else segment)
    return "/".join(segments) + (f"?{_mask(query)}" if separator else "")


def _mask(parameters: str) -> str:
    items = SEPARATOR.split(parameters)  # items at even indexes, separators kept between them
    for i in range(0, len(items), 2):
        name, equals, _ = items[i].partition("=")
        if not equals:
            items[i] = MASK if items[i] else ""
        elif CREDENTIAL_NAME.search(unquote_plus(name)):
            items[i] = f"{name}={MASK}"
    return "".join(items)


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
