"""Unique subject names: a subject created with `unique_name` holds its name's key, which no other
subject may hold, so the name alone finds it. CompreFace's subjects and DeepStack's userids are
such names (service/api/compat/subjects.py); facegate's own subjects keep their ids and free names.

The key is the name case-folded after Unicode normalization (NFC): `Tony_Blair`, `tony_blair` and
`TONY_BLAIR` are one subject, as CompreFace's case-insensitive lookup makes them. For an ASCII name
it is the name in lower case, which is what the migrations compute in SQL (SQLite's lower() and
PostgreSQL's under COLLATE "C" change ASCII letters only) for the subjects made before keys were kept.
"""

from __future__ import annotations

import unicodedata


def name_key(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()
