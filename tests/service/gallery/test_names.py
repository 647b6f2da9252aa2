"""Unique subject names (service/gallery/names.py), on SQLite and PostgreSQL alike: what a CompreFace
subject or DeepStack userid stands for. One subject per name whatever its case, found by it, a
rename taking the key along; the migration gives the subjects the compatible APIs made before
(id = name) their keys. Synthetic embeddings."""

from __future__ import annotations

import psycopg
import pytest

from service.core.errors import SubjectExists, SubjectNotFound
from service.gallery.interface import NewFace
from service.gallery.migrate import sqlite_to_postgres
from service.gallery.postgres import PostgresGallery, migrations
from service.gallery.sqlite import SCHEMA_VERSION, SqliteGallery
from tests.service.gallery.old_schema import sqlite_at
from tests.service.gallery.test_sqlite import KEY, unit

# Made before names were kept: a CompreFace subject's id was its name, and a second subject could
# differ from it by case only; a native subject has an id and a free name.
LEGACY = [("Tony_Blair", "Tony_Blair", 1.0), ("tony_blair", "tony_blair", 2.0), ("obama", "obama", 3.0), ("emp-1", "Ada Lovelace", 4.0)]


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        gallery = SqliteGallery.open(tmp_path, KEY)
    else:
        gallery = PostgresGallery(request.getfixturevalue("database_url"), KEY, pool_size=2)
    yield gallery
    gallery.close()


def test_a_unique_name_is_one_subject_whatever_its_case(store):
    made = store.create_subject("Tony Blair", {}, unique_name=True)
    assert made.unique_name and made.id != "Tony Blair"  # facegate's ids stay ids: a random one
    for spelled in ("Tony Blair", "tony blair", "TONY BLAIR"):
        assert store.subject_by_name(spelled).id == made.id
    with pytest.raises(SubjectExists, match="named"):
        store.create_subject("TONY blair", {}, unique_name=True)
    # Unicode: lowered after NFC (a composed é is a decomposed one; ẞ is ß), nothing more folded
    straße = store.create_subject("Straße Zoé", {}, subject_id="strasse", unique_name=True)
    assert store.subject_by_name("STRAẞE ZOE\u0301").id == straße.id == "strasse"
    with pytest.raises(SubjectNotFound):
        store.subject_by_name("Tony")
    # native subjects hold no name: any number share one, beside the unique one
    for i in range(2):
        assert not store.create_subject("Tony Blair", {}, subject_id=f"native-{i}").unique_name
    assert store.subject_by_name("tony blair").id == made.id
    assert store.unique_names([made.id, "native-0", "strasse", "missing"]) == {made.id: "Tony Blair", "strasse": "Straße Zoé"}
    listed, _ = store.list_subjects(10, 0)
    assert [(s.name, s.unique_name) for s in listed] == [
        ("Tony Blair", True),
        ("Straße Zoé", True),
        ("Tony Blair", False),
        ("Tony Blair", False),
    ]
    store.delete_subject(made.id)  # frees the name
    assert store.create_subject("tony BLAIR", {}, unique_name=True).name == "tony BLAIR"


@pytest.mark.parametrize(
    "first, second, one",
    [
        ("groß", "GROSS", False),  # full case folding made them one: registering GROSS added a face to groß
        ("Strauß", "STRAUSS", False),
        ("ﬁona", "Fiona", False),  # a ligature is not its letters (no compatibility folding)
        ("\u212aelvin", "kelvin", True),  # the Kelvin sign is a K under NFC: one text, two encodings
        ("Zoe\u0301", "ZOÉ", True),
    ],
)
def test_names_are_lowered_after_nfc_and_nothing_more_is_folded(store, first, second, one):
    """Issue 45 (N7): CompreFace/DeepStack names Strauß/STRAUSS, ﬁona/Fiona were each one subject."""
    made = store.create_subject(first, {}, unique_name=True)
    if one:
        assert store.subject_by_name(second).id == made.id
        with pytest.raises(SubjectExists):
            store.create_subject(second, {}, unique_name=True)
    else:
        with pytest.raises(SubjectNotFound):
            store.subject_by_name(second)
        assert store.create_subject(second, {}, unique_name=True).id != made.id


def test_a_rename_takes_the_name_along(store):
    ada = store.create_subject("Ada", {}, subject_id="ada", unique_name=True)
    store.create_subject("Grace", {}, subject_id="grace", unique_name=True)
    store.add_faces("ada", [NewFace(unit(1))])
    renamed = store.update_subject("ada", "Ada Lovelace", None)
    assert renamed.unique_name and renamed.name == "Ada Lovelace" and renamed.face_count == 1
    assert store.subject_by_name("ada lovelace").id == ada.id
    with pytest.raises(SubjectNotFound):
        store.subject_by_name("Ada")
    with pytest.raises(SubjectExists):
        store.update_subject("ada", "GRACE", None)  # another subject's name
    assert store.get_subject("ada").name == "Ada Lovelace"  # unchanged
    assert store.update_subject("ada", None, {"k": 1}).unique_name  # metadata alone keeps the name
    store.create_subject("Grace", {}, subject_id="native")  # a native subject is free to take any name
    assert store.update_subject("native", "Ada Lovelace", None).unique_name is False


def _legacy_rows() -> list[tuple]:
    return [(i, name, "{}", created, created) for i, name, created in LEGACY]


def _check_legacy(gallery) -> None:
    assert gallery.subject_by_name("TONY_BLAIR").id == "Tony_Blair"  # the older of the two
    assert not gallery.get_subject("tony_blair").unique_name  # the newer stays, found by its id
    assert gallery.subject_by_name("Obama").id == "obama"
    assert not gallery.get_subject("emp-1").unique_name  # facegate's own: unchanged
    assert gallery.unique_names(["Tony_Blair", "tony_blair", "obama", "emp-1"]) == {"Tony_Blair": "Tony_Blair", "obama": "obama"}


def test_sqlite_migration_keys_the_subjects_the_compatible_apis_made(tmp_path):
    db = sqlite_at(tmp_path, 1)  # a gallery at version 1, holding subjects of then
    db.executemany("INSERT INTO subjects (id, name, metadata, created, updated) VALUES (?, ?, ?, ?, ?)", _legacy_rows())
    db.close()
    gallery = SqliteGallery.open(tmp_path, KEY)
    try:
        assert gallery._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        _check_legacy(gallery)
    finally:
        gallery.close()


def test_postgres_migration_keys_the_subjects_the_compatible_apis_made(database_url):
    (first, *_) = migrations()
    with psycopg.connect(database_url) as conn:  # a database at migration 1, holding subjects of then
        conn.execute(first[2])
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", first[:2])
        conn.cursor().executemany("INSERT INTO subjects (id, name, metadata, created, updated) VALUES (%s, %s, %s, %s, %s)", _legacy_rows())
    gallery = PostgresGallery(database_url, KEY, pool_size=2)
    try:
        _check_legacy(gallery)
    finally:
        gallery.close()


def test_keys_made_by_case_folding_are_lowered_again(store):
    """Issue 45 (N7): a gallery keyed by the case folding of before (Strauß's key "strauss") is
    migrated (SQLite 4, PostgreSQL 3): its name is found as spelled, and STRAUSS is another."""
    made = store.create_subject("Strauß", {}, unique_name=True)
    if isinstance(store, SqliteGallery):  # a gallery at version 3 holding the subject as it was keyed then
        db = sqlite_at(store.path.parent / "v3", 3)
        db.execute(
            "INSERT INTO subjects (id, name, metadata, created, updated, name_key) VALUES (?, ?, '{}', 0, 0, 'strauss')",
            (made.id, made.name),
        )
        db.close()
        store = SqliteGallery.open(store.path.parent / "v3", KEY)
    else:
        with psycopg.connect(store.url) as conn:
            conn.execute("UPDATE subjects SET name_key = 'strauss'")
            conn.execute("DELETE FROM schema_migrations WHERE version = 3")
        store = PostgresGallery(store.url, KEY, pool_size=2)
    try:
        assert store.subject_by_name("STRAUß").id == made.id
        with pytest.raises(SubjectNotFound):
            store.subject_by_name("STRAUSS")
    finally:
        store.close()


def test_gallery_migrate_copies_unique_names(tmp_path, database_url):
    source = SqliteGallery.open(tmp_path, KEY)
    source.create_subject("John Smith", {}, unique_name=True)
    source.create_subject("John Smith", {}, subject_id="native")
    source.close()
    source = SqliteGallery.open(tmp_path, KEY, searchable=False)
    target = PostgresGallery(database_url, KEY, searchable=False, pool_size=2)
    try:
        assert sqlite_to_postgres(source, target) == (2, 0)
        assert target.subject_by_name("JOHN SMITH").name == "John Smith"
        assert not target.get_subject("native").unique_name
    finally:
        source.close()
        target.close()


def test_concurrent_makers_of_one_name_make_one_subject(store):
    """The unique key decides between requests creating one name at once (`compat.subjects.ensure`)."""
    from concurrent.futures import ThreadPoolExecutor

    from service.api.compat.subjects import ensure

    spellings = ["Jane Doe", "jane doe", "JANE DOE", "Jane doe"] * 4
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda name: ensure(store, name), spellings))
    assert len({subject.id for subject, _ in outcomes}) == 1 and sum(made for _, made in outcomes) == 1
    assert store.counts()["subjects"] == 1
