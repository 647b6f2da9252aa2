"""Subject metadata limits (FACEGATE_MAX_METADATA_DEPTH, _BYTES) and what any store can hold. Checked
before every write (on a worker thread, with the body's parsing: `read_json_model`), so no client can
store metadata that a later answer fails to serialize; checked again when a stored row is served, so
a row written before the limits (or by hand) is withheld, never a broken page."""

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
        if level > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _unstorable_text(value: Any) -> str | None:
    """What no store can hold in a key or string: NUL (PostgreSQL's jsonb refuses it where SQLite
    stored it) or an unpaired surrogate (not text: UTF-8 cannot encode it, no answer can carry it)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "a NUL character (\\u0000)"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "an unpaired UTF-16 surrogate (\\ud800–\\udfff)"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def problem(metadata: dict[str, Any], settings: Settings) -> str | None:
    """Why `metadata` exceeds the limits or cannot be stored, or None. The size comes first: it is
    measured at C speed, and bounds the walks after it."""
    try:
        size = len(json.dumps(metadata))  # as the gallery stores it (ASCII: characters are bytes)
    except RecursionError:
        size = 0  # nested beyond the encoder's recursion: the depth check says so
    if size > settings.max_metadata_bytes:
        return f"metadata is {size} bytes as JSON; the limit is {settings.max_metadata_bytes} (FACEGATE_MAX_METADATA_BYTES)"
    if _deeper_than(metadata, settings.max_metadata_depth):
        return f"metadata nests deeper than {settings.max_metadata_depth} levels (FACEGATE_MAX_METADATA_DEPTH)"
    unstorable = _unstorable_text(metadata)
    if unstorable:
        return f"metadata may not hold {unstorable}"
    return None


def check(metadata: dict[str, Any] | None, settings: Settings) -> None:
    """Refuse metadata over the limits, or that no store can hold (422), before anything is written."""
    reason = problem(metadata, settings) if metadata is not None else None
    if reason:
        raise InvalidParameters(reason)
