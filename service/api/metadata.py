"""Subject metadata limits (FACEGATE_MAX_METADATA_DEPTH, _BYTES). Checked before every write, so no
client can store metadata that a later answer fails to serialize; checked again when a stored row
is served, so a row written before the limits (or by hand) is withheld, never a broken page."""

from __future__ import annotations

import json
from typing import Any

from service.core.errors import InvalidParameters
from service.core.settings import Settings


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` levels (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            if level > limit:
                return True
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _holds_nul(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def problem(metadata: dict[str, Any], settings: Settings) -> str | None:
    """Why `metadata` exceeds the limits, or None."""
    if _deeper_than(metadata, settings.max_metadata_depth):
        return f"metadata nests deeper than {settings.max_metadata_depth} levels (FACEGATE_MAX_METADATA_DEPTH)"
    if _holds_nul(metadata):  # PostgreSQL's jsonb refuses NUL where SQLite stored it: refused for both
        return "metadata may not hold a NUL character (\\u0000)"
    size = len(json.dumps(metadata))  # as the gallery stores it (ASCII: characters are bytes)
    if size > settings.max_metadata_bytes:
        return f"metadata is {size} bytes as JSON; the limit is {settings.max_metadata_bytes} (FACEGATE_MAX_METADATA_BYTES)"
    return None


def check(metadata: dict[str, Any] | None, settings: Settings) -> None:
    """Refuse metadata over the limits (422), before anything is written."""
    reason = problem(metadata, settings) if metadata is not None else None
    if reason:
        raise InvalidParameters(reason)
