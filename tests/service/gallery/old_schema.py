"""A SQLite gallery file as an older facegate left it: the version-0 schema and the migrations up
to `version`, applied as `SqliteGallery._migrate` applies them (the tests of each migration open it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from service.gallery import sqlite as store


def sqlite_at(folder: Path, version: int) -> sqlite3.Connection:
    """The gallery file under `folder` at schema `version`, open for the test to fill (autocommit)."""
    folder.mkdir(parents=True, exist_ok=True)
    db = store.connect(folder / store.DATABASE)
    db.executescript(store.SCHEMA)
    for number, statements in enumerate(store.MIGRATIONS[:version], 1):
        for statement in statements:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {number}")
    return db
