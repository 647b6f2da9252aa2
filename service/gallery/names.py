"""Unique subject names: a subject created with `unique_name` holds its name's key, which no other
subject may hold, so the name alone finds it. CompreFace's subjects and DeepStack's userids are
such names (service/api/compat/subjects.py); facegate's own subjects keep their ids and free names.

The key is the name in lower case after Unicode normalization (NFC): `Tony_Blair`, `tony_blair` and
`TONY_BLAIR` are one subject, as CompreFace's case-insensitive lookup makes them, and so are a
composed `é` and an `e` with a combining accent (canonically equivalent: one text, two encodings).
Nothing more is folded, because a name is a person's and two spellings may be two people: `Strauß`
and `STRAUSS` stay two (full case folding made ß "ss"), as do `ﬁona` and `Fiona` (compatibility
folding, NFKC, would join a ligature to its letters). The Kelvin sign `K` is a `K` under NFC, so it
is one with `k`: a canonical equivalent, never another name. For an ASCII name the key is the name
in lower case, which is what the migrations compute in SQL (SQLite's lower() and PostgreSQL's under
COLLATE "C" change ASCII letters only) for the subjects made before keys were kept; keys made by the
case folding of before are lowered again by a migration (SQLite 4, PostgreSQL 3).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable


def name_key(name: str) -> str:
    return unicodedata.normalize("NFC", name).lower()


def holding(search: str, subjects: Iterable[tuple[str, str]]) -> list[str]:
    """The ids of those (id, name) whose name or id holds `search`, compared by their keys, in the
    order given: `GET /subjects?search=` on either store, folded here rather than by a database's
    lower(), which PostgreSQL applies as its collation says (ASCII letters only under "C")."""
    key = name_key(search)
    return [subject_id for subject_id, name in subjects if key in name_key(name) or key in name_key(subject_id)]
