"""A collection's name rules (issue 50): the default name, which names are valid, the index folder
a name is kept in, and the ASGI scope key a request's collection is set under. Kept apart from
collections.py (the per-collection gallery states, which import FAISS through the index) so that
`facegate serve`'s own process, which reads the key file (service/api/auth.py), imports no FAISS."""

from __future__ import annotations

import re

DEFAULT = "default"  # a key without `collection=`, every FACEGATE_API_KEYS key, anonymous mode
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # the key file's contract (issue 50)
COLLECTION = "facegate.collection"  # the ASGI scope key the caller's collection is set under


def valid(name: str) -> bool:
    return NAME.fullmatch(name) is not None


def folder(name: str) -> str:
    """The name of a collection's index folder, which no other name's folds to on a case-insensitive
    disk (macOS, Windows: `Home` and `home` would share one and overwrite each other's snapshot): an
    upper-case letter is spelt `%` and its code in lower-case hex (`Home`: `%48ome`), and "." and ".."
    (the folder itself, default's) `%2E`; no name holds `%`, so lower-case names keep their folders."""
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return re.sub("[A-Z]", lambda letter: f"%{ord(letter[0]):02x}", name)
