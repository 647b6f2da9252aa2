"""Collections (issue 50): each API key sees and changes one collection. The same subject in two
collections through each API (facegate's own, CompreFace's, DeepStack's), isolation checked; a
subject of another collection is 404 exactly as a missing one; the key file's `collection=` suffix;
a gallery of the previous schema opened into `default`; concurrent writes in two collections."""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import threading

import numpy as np
import pytest
from pydantic import SecretStr

from service.api.auth import ApiKeys, KeyConfigError
from tests.conftest import LFW_PEOPLE, aligned_crop_png
from tests.polling import wait_until
from tests.service.api.test_event_loop import on_event_loop
from tests.service.api.test_routes import error
from tests.service.gallery.old_schema import sqlite_at

HOME, OFFICE = {"X-API-Key": "home-key"}, {"X-API-Key": "office-key"}
ALIGNED = {"aligned": "true"}


def with_keys(settings, tmp_path):
    path = tmp_path / "keys"
    path.write_text("home-key collection=home\noffice-key collection=office\ndefault-key\n")
    return settings.model_copy(update={"api_keys": SecretStr(""), "api_keys_file": path})


@pytest.fixture
def keyed(api_settings, tmp_path):
    return with_keys(api_settings, tmp_path)


@pytest.fixture
def two(store_settings, tmp_path, make_client):
    """A service with a key of `home`, one of `office` and one of `default`, on SQLite and on PostgreSQL."""
    return make_client(with_keys(store_settings, tmp_path))


def enroll(client, headers, subject_id: str, seed: int) -> int:
    made = client.post("/subjects", json={"id": subject_id, "name": subject_id.title()}, headers=headers)
    assert made.status_code in (201, 409), made.text
    added = client.post(f"/subjects/{subject_id}/faces", files={"image": aligned_crop_png(seed)}, data=ALIGNED, headers=headers)
    assert added.status_code == 201, added.text
    return added.json()["face_id"]


def without_id(answer) -> tuple:
    """An error answer less the id it names: what tells a missing subject from another collection's."""
    body = answer.json()["error"]
    return answer.status_code, body["code"], body["message"].split("'")[0]


# the key file


def test_a_key_line_names_its_collection_and_bare_keys_are_defaults(keyed, tmp_path):
    keys = ApiKeys.from_settings(keyed.model_copy(update={"api_keys": SecretStr("env-key")}))
    assert (keys.collection("home-key"), keys.collection("office-key"), keys.collection("default-key")) == ("home", "office", "default")
    assert keys.collection("env-key") == "default" and keys.collection("nope") is None
    assert keys.collections == {"home", "office", "default"}
    assert (hashlib.sha256(b"home-key").hexdigest()[:12], "home") in keys.listed()


@pytest.mark.parametrize(
    "line",
    [
        "k collection=",
        "k collection=a/b",
        "k collection=" + "x" * 65,
        "k collection=home extra",
        "k colection=home",
        "k  collection=home",
    ],
)
def test_a_bad_collection_suffix_stops_start_up_with_its_line(settings, tmp_path, line):
    path = tmp_path / "keys"
    path.write_text(f"good-key\n{line}\n")
    with pytest.raises(KeyConfigError, match="line 2"):
        ApiKeys.from_settings(settings.model_copy(update={"api_keys": SecretStr(""), "api_keys_file": path}))


def test_every_name_of_the_contract_is_a_collection_with_an_index_folder_of_its_own(settings, tmp_path):
    """Names are 1-64 of [A-Za-z0-9_.-], dots and dashes first included; "." and ".." (which as a
    path would be the collections' folder or default's) get folders of their own inside it."""
    from service.gallery.factory import index_config

    names = [".", "..", "-x", ".hidden", "a" * 64]
    path = tmp_path / "keys"
    path.write_text("".join(f"key-{i} collection={name}\n" for i, name in enumerate(names)))
    keys = ApiKeys.from_settings(settings.model_copy(update={"api_keys": SecretStr(""), "api_keys_file": path}))
    assert set(keys.collections) >= set(names)
    folders = {name: index_config(settings, name).directory for name in [*names, "default"]}
    root = index_config(settings, "default").directory / "collections"
    assert all(folders[name].parent == root for name in names)  # each inside collections/, none is it or above it
    assert len({f.resolve() for f in folders.values()}) == len(folders)


def test_names_differing_in_case_never_share_a_folder_on_a_case_insensitive_disk(settings):
    """`Home` and `home` are two collections: on macOS's or Windows' disks, folders that differ in
    case only are one, and each would overwrite the other's snapshot. Lower-case names keep the
    folders they had (nothing to move)."""
    from service.gallery.factory import index_config

    names = ["home", "Home", "HOME", "hOmE", "J", "j", "Z" * 64, "a.B-c_9"]
    folders = {name: index_config(settings, name).directory.name for name in names}
    assert len({f.casefold() for f in folders.values()}) == len(folders), folders
    assert folders["home"] == "home" and folders["j"] == "j"  # where they were
    assert folders["Home"] == "%48ome" and all(len(f) <= 255 for f in folders.values())


def test_one_key_for_two_collections_is_refused(settings, tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"k collection=home\nsha256:{hashlib.sha256(b'k').hexdigest()} collection=office\n")
    with pytest.raises(KeyConfigError, match="two collections"):
        ApiKeys.from_settings(settings.model_copy(update={"api_keys": SecretStr(""), "api_keys_file": path}))


def test_reload_moves_a_key_to_another_collection(keyed):
    keys = ApiKeys.from_settings(keyed)
    keyed.api_keys_file.write_text("home-key collection=garden\n")
    keys.reload()
    assert keys.collection("home-key") == "garden" and keys.collection("office-key") is None


def test_a_reloaded_key_of_a_new_collection_gets_a_gallery_of_its_own(two, keyed):
    """What SIGHUP runs (tests/chaos/test_key_rotation.py sends the signal): the new collection's
    gallery is opened in the background, empty, beside the others."""
    enroll(two, HOME, "ada", 1)
    keyed.api_keys_file.write_text(keyed.api_keys_file.read_text() + "garden-key collection=garden\n")
    two.app.state.service.reload_keys()
    garden = {"X-API-Key": "garden-key"}
    assert wait_until(lambda: two.get("/subjects", headers=garden).status_code == 200, "the garden collection opened")
    assert two.get("/subjects", headers=garden).json()["total"] == 0
    assert two.post("/subjects", json={"id": "ada", "name": "Ada"}, headers=garden).status_code == 201
    assert two.get("/subjects/ada/faces", headers=garden).json()["faces"] == []
    assert len(two.get("/subjects/ada/faces", headers=HOME).json()["faces"]) == 1


def test_a_reload_closes_the_collections_no_key_names_any_more(two, keyed):
    """What SIGHUP runs: office's key removed, office's gallery is closed (its follower stopped, its
    handles released) once no request uses it; the requests made before released their lease."""
    enroll(two, OFFICE, "ada", 1)
    service = two.app.state.service
    office = service.collections.get("office")
    keyed.api_keys_file.write_text("home-key collection=home\ndefault-key\n")
    service.reload_keys()
    wait_until(lambda: office.gallery.follower._closed, "office's follower stopped, its handles released")
    assert "office" not in service.collections.opened()
    assert two.get("/subjects", headers=OFFICE).status_code == 401
    assert two.get("/subjects", headers=HOME).status_code == 200


def test_a_collection_is_never_opened_on_the_event_loop_and_answers_loading_meanwhile(keyed, make_client, monkeypatch):
    """A DeepStack request (its key in a form field) for a collection no key named at start-up: the
    gallery opens on a thread (migrations, a PostgreSQL pool: seconds), and the request answers 503
    gallery_loading with Retry-After until it is open."""
    from service.api import app as app_module

    client = make_client(keyed)
    release, calls = threading.Event(), []
    original = app_module.open_gallery

    def held_open(*args, **kwargs):
        calls.append(on_event_loop())
        assert release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(app_module, "open_gallery", held_open)
    keyed.api_keys_file.write_text(keyed.api_keys_file.read_text() + "garden-key collection=garden\n")
    client.app.state.service.keys.reload()  # the keys alone, as before the fix: the request is the first to ask
    listed = client.post("/v1/vision/face/list", data={"api_key": "garden-key"})
    assert listed.status_code == 503 and listed.headers["retry-after"] == "2", listed.text
    assert "being opened" in listed.json()["error"]
    assert error(client.get("/subjects", headers={"X-API-Key": "garden-key"}), 503, "gallery_loading")
    ready = client.get("/readyz", headers={"X-API-Key": "garden-key"})  # the readiness report, not the error body
    assert ready.status_code == 503 and ready.json()["collection"] == "garden" and not ready.json()["ready"], ready.text
    assert ready.json()["gallery"]["loading"] and ready.json()["gallery"]["faces"] is None and ready.json()["models"]
    assert any(p["name"] == "loading" for p in ready.json()["problems"])
    release.set()
    assert wait_until(lambda: client.post("/v1/vision/face/list", data={"api_key": "garden-key"}).status_code == 200, "garden open")
    assert calls == [False]  # opened once, off the loop


def test_readyz_is_503_for_everyone_until_every_start_up_collection_is_built(keyed, monkeypatch):
    """One process (no ReadyWorkers): home's index still building keeps /readyz 503 for a caller
    without a key and for default's key too (a load balancer would send home's callers to 503s), home's
    key sees its own gallery loading; once built, 200 for all."""
    import warnings

    from service.gallery import sqlite

    release = threading.Event()
    build = sqlite.derived_state

    def held(db, path, collection, *args):
        if collection == "home":
            release.wait(60)
        return build(db, path, collection, *args)

    monkeypatch.setattr(sqlite, "derived_state", held)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient` is deprecated")
        from fastapi.testclient import TestClient
    from service.api.app import create_app

    try:
        with TestClient(create_app(keyed)) as api:
            service = api.app.state.service
            assert service.readiness.warmed.wait(120) and service.gallery.wait_loaded(60)
            anonymous, default = api.get("/readyz"), api.get("/readyz", headers={"X-API-Key": "default-key"})
            assert (anonymous.status_code, anonymous.json()) == (503, {"ready": False})
            assert default.status_code == 503 and not default.json()["gallery"]["loading"]
            assert any("home" in p["error"] for p in default.json()["problems"]), default.json()["problems"]
            home = api.get("/readyz", headers=HOME)
            assert home.status_code == 503 and home.json()["gallery"]["loading"]
            release.set()
            assert wait_until(lambda: api.get("/readyz").status_code == 200, "every collection built")
            assert api.get("/readyz", headers=HOME).status_code == 200
    finally:
        release.set()


# facegate's own API


def test_same_subject_in_two_collections_through_facegate_api(two):
    home_face = enroll(two, HOME, "ada", 1)
    enroll(two, OFFICE, "ada", 2)
    enroll(two, HOME, "only-home", 3)
    enroll(two, OFFICE, "bob", 4)

    def ids(headers):
        return sorted(s["id"] for s in two.get("/subjects", headers=headers).json()["subjects"])

    assert (ids(HOME), ids(OFFICE), ids({"X-API-Key": "default-key"})) == (["ada", "only-home"], ["ada", "bob"], [])
    # another collection's subject is 404 exactly as one that does not exist
    for method, path in [("get", "/subjects/{}"), ("get", "/subjects/{}/faces"), ("delete", "/subjects/{}")]:
        other = getattr(two, method)(path.format("only-home"), headers=OFFICE)
        missing = getattr(two, method)(path.format("nobody-at-all"), headers=OFFICE)
        assert without_id(other) == without_id(missing) and other.status_code == 404, (path, other.text)
    crop = base64.b64encode(aligned_crop_png(3)).decode()
    verify = two.post("/verify", json={"image1": crop, "aligned": True, "subject_id": "only-home"}, headers=OFFICE)
    assert verify.status_code == 404 and verify.json()["error"]["code"] == "subject_not_found"
    assert two.delete(f"/faces/{home_face}", headers=OFFICE).status_code == 404
    # identify answers from the caller's collection only
    found = two.post("/identify", json={"image": crop, "aligned": True, "top_k": 5}, headers=HOME).json()
    assert found["match"]["subject_id"] == "only-home"
    office = two.post("/identify", json={"image": crop, "aligned": True, "top_k": 5}, headers=OFFICE).json()
    assert {c["subject_id"] for c in office["candidates"]} <= {"ada", "bob"} and (office["match"] or {}).get("subject_id") != "only-home"
    # /readyz with a key: that collection's counts
    ready = two.get("/readyz", headers=HOME).json()
    assert ready["collection"] == "home" and (ready["gallery"]["subjects"], ready["gallery"]["faces"]) == (2, 2)
    assert two.get("/readyz", headers=OFFICE).json()["gallery"]["faces"] == 2
    # deleting in one leaves the other
    assert two.delete("/subjects/ada", headers=HOME).status_code == 204
    assert len(two.get("/subjects/ada/faces", headers=OFFICE).json()["faces"]) == 1
    assert two.get("/subjects/ada", headers=HOME).status_code == 404
    assert two.get("/gallery/duplicates", headers=OFFICE).status_code == 200


# CompreFace's API


def test_metrics_gallery_gauges_are_the_callers_collection_labelled(two):
    """/metrics' gallery gauges carry `collection`: the caller's, and no other collection's series."""
    enroll(two, HOME, "ada", 1)
    enroll(two, HOME, "bob", 2)
    enroll(two, OFFICE, "cy", 3)
    home, office = two.get("/metrics", headers=HOME).text, two.get("/metrics", headers=OFFICE).text
    assert 'facegate_gallery_subjects{collection="home"} 2.0' in home and 'collection="office"' not in home
    assert 'facegate_gallery_subjects{collection="office"} 1.0' in office and 'collection="home"' not in office
    assert 'facegate_gallery_index_recall{collection="office"}' in office


def test_same_name_in_two_collections_through_compreface(two):
    recognition = "/api/v1/recognition"

    def add(headers, subject, seed):
        answer = two.post(
            f"{recognition}/faces",
            params={"subject": subject, "detect_faces": "false"},
            files={"file": aligned_crop_png(seed)},
            headers=headers,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["image_id"]

    home_image = add(HOME, "Ada Lovelace", 11)
    add(OFFICE, "Ada Lovelace", 12)
    add(HOME, "Home Only", 13)
    assert sorted(two.get(f"{recognition}/subjects", headers=HOME).json()["subjects"]) == ["Ada Lovelace", "Home Only"]
    assert two.get(f"{recognition}/subjects", headers=OFFICE).json()["subjects"] == ["Ada Lovelace"]
    (face,) = two.post(
        f"{recognition}/recognize", params={"detect_faces": "false"}, files={"file": aligned_crop_png(13)}, headers=OFFICE
    ).json()["result"]
    assert all(s["subject"] == "Ada Lovelace" for s in face["subjects"])
    assert two.delete(f"{recognition}/faces/{home_image}", headers=OFFICE).status_code == 404
    assert two.get(f"{recognition}/faces/{home_image}/img", headers=OFFICE).status_code == 404
    assert two.delete(f"{recognition}/subjects/Home Only", headers=OFFICE).status_code == 404
    assert two.delete(f"{recognition}/subjects/Ada Lovelace", headers=HOME).status_code == 200
    assert two.get(f"{recognition}/subjects", headers=OFFICE).json()["subjects"] == ["Ada Lovelace"]
    assert two.get(f"{recognition}/faces", params={"subject": "Ada Lovelace"}, headers=OFFICE).json()["total_elements"] == 1


# DeepStack's API (the key in the form, as its clients send it, and in the header)


@pytest.mark.data
def test_same_userid_in_two_collections_through_deepstack(two, lfw_faces):
    face = "/v1/vision/face"
    first, second = LFW_PEOPLE[0], LFW_PEOPLE[1]
    home = {"api_key": "home-key"}
    assert two.post(f"{face}/register", files={"image": lfw_faces[first][0]}, data={"userid": "pat", **home}).json()["success"]
    assert two.post(f"{face}/register", files={"image": lfw_faces[second][0]}, data={"userid": "pat"}, headers=OFFICE).json()["success"]
    assert two.post(f"{face}/list", data=home).json()["faces"] == ["pat"]
    assert two.post(f"{face}/list", headers=OFFICE).json()["faces"] == ["pat"]
    # the home person is no one in the office: its "pat" is another face (the photo registered: the test embedder's match)
    (seen,) = two.post(f"{face}/recognize", files={"image": lfw_faces[first][0]}, headers=OFFICE).json()["predictions"]
    (known,) = two.post(f"{face}/recognize", files={"image": lfw_faces[first][0]}, data=home).json()["predictions"]
    assert known["userid"] == "pat" and seen["userid"] == "unknown"
    assert two.post(f"{face}/delete", data={"userid": "pat", **home}).json()["success"]
    assert two.post(f"{face}/list", data=home).json()["faces"] == []
    assert two.post(f"{face}/list", headers=OFFICE).json()["faces"] == ["pat"]


# the store


def test_a_gallery_of_the_previous_schema_moves_into_default(tmp_path, settings):
    from service.core.models.manifest import EmbedderKey
    from service.gallery import sqlite as store

    path = tmp_path / store.DATABASE
    db = sqlite_at(tmp_path, 4)  # version 4: the schema before collections
    blob = (np.ones(4, "<f4") / 2).tobytes()
    db.execute("INSERT INTO subjects (id, name, metadata, created, updated, name_key) VALUES ('ada', 'Ada', '{}', 1, 1, 'ada')")
    for _ in range(3):
        db.execute(
            "INSERT INTO faces (subject_id, embedding, model_name, model_sha256, created) VALUES ('ada', ?, 'm', 'f' || 'x', 1)", (blob,)
        )
    db.execute("DELETE FROM faces WHERE id = 3")  # the largest id used stays used
    db.close()

    key = EmbedderKey("m", "fx", 4)
    gallery = store.SqliteGallery.open(tmp_path, key)
    try:
        assert gallery.get_subject("ada").face_count == 2 and gallery.subject_by_name("ADA").id == "ada"
        assert gallery.collection_counts() == {"default": {"subjects": 1, "faces": 2}}
        (new,) = gallery.add_faces("ada", [store.NewFace(np.ones(4, np.float32) / 2)])
        assert new.id == 4  # ids are never reused across the migration
    finally:
        gallery.close()
    office = store.SqliteGallery.open(tmp_path, key, collection="office")
    try:
        with pytest.raises(Exception, match="no subject"):
            office.get_subject("ada")
        office.create_subject("Ada", {}, subject_id="ada", unique_name=True)  # the same id and name, another collection
        assert office.search(np.ones(4, np.float32) / 2, 5) == []  # none of default's faces
    finally:
        office.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == store.SCHEMA_VERSION


# concurrent writes


def test_concurrent_writes_in_two_collections_never_answer_across(two):
    """Two threads per collection enroll and identify at once; every answer names only subjects of
    the caller's collection (ids carry the collection's prefix)."""
    wrong: list[str] = []

    def work(headers, prefix: str, seeds: range) -> None:
        for seed in seeds:
            enroll(two, headers, f"{prefix}-{seed}", seed)
            crop = base64.b64encode(aligned_crop_png(seed + 1000 if seed % 2 else seed)).decode()
            found = two.post("/identify", json={"image": crop, "aligned": True, "top_k": 10}, headers=headers).json()
            wrong.extend(c["subject_id"] for c in found["candidates"] if not c["subject_id"].startswith(prefix))

    threads = [
        threading.Thread(target=work, args=(HOME, "home", range(100, 115))),
        threading.Thread(target=work, args=(OFFICE, "office", range(100, 115))),  # the same crops: the same faces
        threading.Thread(target=work, args=(HOME, "home", range(200, 215))),
        threading.Thread(target=work, args=(OFFICE, "office", range(300, 315))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not wrong, wrong[:10]
    assert two.get("/readyz", headers=HOME).json()["gallery"]["faces"] == 30
    assert two.get("/readyz", headers=OFFICE).json()["gallery"]["faces"] == 30


def test_a_postgres_gallery_of_the_previous_schema_moves_into_default(database_url):
    import psycopg

    from service.core.models.manifest import EmbedderKey
    from service.gallery import postgres
    from service.gallery.sqlite import NewFace

    with psycopg.connect(database_url, autocommit=True) as conn:  # the schema of migrations 1-4, as facegate left it
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied TIMESTAMPTZ DEFAULT now())")
        for version, name, sql in postgres.migrations()[:4]:
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
        conn.execute("INSERT INTO subjects (id, name, metadata, created, updated, name_key) VALUES ('ada', 'Ada', '{}', 1, 1, 'ada')")
        blob = (np.ones(4, "<f4") / 2).tobytes()
        for _ in range(2):
            conn.execute(
                "INSERT INTO faces (subject_id, embedding, model_name, model_sha256, created) VALUES ('ada', %s, 'm', 'fx', 1)", (blob,)
            )
    key = EmbedderKey("m", "fx", 4)
    gallery = postgres.PostgresGallery(database_url, key)
    office = postgres.PostgresGallery(database_url, key, collection="office")
    try:
        assert gallery.get_subject("ada").face_count == 2 and gallery.subject_by_name("ADA").id == "ada"
        assert len(gallery.search(np.ones(4, np.float32) / 2, 5)) == 1
        with pytest.raises(Exception, match="no subject"):
            office.get_subject("ada")
        office.create_subject("Ada", {}, subject_id="ada", unique_name=True)  # the same id and name, another collection
        office.add_faces("ada", [NewFace(np.ones(4, np.float32) / 2)])
        assert office.get_subject("ada").face_count == 1 and gallery.get_subject("ada").face_count == 2
        assert [c.subject_id for c in office.search(np.ones(4, np.float32) / 2, 5)] == ["ada"]
        assert gallery.collection_counts() == {"default": {"subjects": 1, "faces": 2}, "office": {"subjects": 1, "faces": 1}}
        gallery.follower.catch_up()  # office's change, read here as one that changes nothing
        assert gallery.shape().faces == 2
    finally:
        office.close()
        gallery.close()


def test_postgres_replicas_follow_each_collection_by_notify(database_url):
    from service.core.models.manifest import EmbedderKey
    from service.gallery.postgres import PostgresGallery
    from service.gallery.sqlite import NewFace
    from tests.polling import wait_until

    key, face = EmbedderKey("m", "fx", 4), np.ones(4, np.float32) / 2
    writer, reader, office = (PostgresGallery(database_url, key, pool_size=2, collection=c) for c in ("home", "home", "office"))
    try:
        writer.create_subject("Ada", {}, subject_id="ada")
        writer.add_faces("ada", [NewFace(face)])
        wait_until(lambda: reader.shape().faces == 1, "the other replica of `home` applied the change (LISTEN/NOTIFY)")
        assert [c.subject_id for c in reader.search(face, 5)] == ["ada"]
        wait_until(lambda: office.follower.applied == reader.follower.applied, "`office` read the change too")
        assert office.shape().faces == 0 and office.search(face, 5) == []
    finally:
        for gallery in (writer, reader, office):
            gallery.close()


def test_postgres_collections_of_one_process_share_one_pool_and_one_listener(api_settings, database_url, tmp_path, make_client):
    """5 collections in one worker: one LISTEN connection and one pool (FACEGATE_DATABASE_POOL_SIZE in
    all), not one of each per collection (5 collections x 4 workers passed max_connections 100).
    Another replica's write in `home` reaches this process's `home` through the shared listener."""
    from benchmarks.pg_connections import sessions
    from service.gallery.pg_connections import LISTENER_NAME, POOL_NAME
    from service.gallery.postgres import PostgresGallery
    from service.gallery.sqlite import NewFace

    settings = with_keys(api_settings, tmp_path).model_copy(update={"database_url": SecretStr(database_url), "database_pool_size": 2})
    settings.api_keys_file.write_text(settings.api_keys_file.read_text() + "garden-key collection=garden\nattic-key collection=attic\n")
    client = make_client(settings)
    service = client.app.state.service
    assert sorted(service.collections.opened()) == ["attic", "default", "garden", "home", "office"]

    def settled() -> dict[str, int] | None:  # the indexes' builds' own connections closed
        found = sessions(database_url)
        return found if set(found) <= {LISTENER_NAME, POOL_NAME} else None

    found = wait_until(settled, "only the pool's and the listener's connections left")
    assert found[LISTENER_NAME] == 1 and found[POOL_NAME] <= 2, found
    replica = PostgresGallery(database_url, service.gallery.embedder, collection="home")  # another process's, its own connections
    try:
        replica.create_subject("Ada", {}, subject_id="ada")
        replica.add_faces("ada", [NewFace(np.ones(replica.embedder.dim, np.float32) / np.sqrt(replica.embedder.dim))])
    finally:
        replica.close()
    wait_until(lambda: service.collections.get("home").gallery.index.size == 1, "home followed the other replica's write")
    assert service.gallery.index.size == 0 and service.collections.get("office").gallery.index.size == 0


# the commands


def test_keys_add_prints_the_key_once_and_keys_list_shows_hashes(tmp_path, cli_env, monkeypatch):
    from service import cli

    path = tmp_path / "keys"
    monkeypatch.setenv("FACEGATE_API_KEYS_FILE", str(path))
    added = cli_env(cli.app, "keys", "add", "--collection", "garden")
    assert added.exit_code == 0, added.output
    key = added.output.strip().splitlines()[-1]
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert path.read_text() == f"sha256:{digest} collection=garden\n" and key not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert cli_env(cli.app, "keys", "add").exit_code == 0  # `default`
    listed = cli_env(cli.app, "keys", "list")
    assert listed.exit_code == 0 and digest[:12] in listed.output and "garden" in listed.output and "default" in listed.output
    assert key not in listed.output
    refused = cli_env(cli.app, "keys", "add", "--collection", "no/slash")
    assert refused.exit_code != 0 and len(path.read_text().splitlines()) == 2


def test_gallery_stats_lists_every_collection(tmp_path, cli_env, monkeypatch):
    from service import cli
    from service.gallery.sqlite import SqliteGallery

    monkeypatch.setenv("FACEGATE_DATA_DIR", str(tmp_path))
    for collection, names in (("default", ["a"]), ("home", ["a", "b"])):
        gallery = SqliteGallery.open(tmp_path, None, searchable=False, collection=collection)
        for name in names:
            gallery.create_subject(name, {}, subject_id=name)
        gallery.close()
    result = cli_env(cli.app, "gallery", "stats", "--json")
    assert result.exit_code == 0, result.output
    assert [json.loads(line) for line in result.output.splitlines()] == [
        {"collection": "default", "subjects": 1, "faces": 0},
        {"collection": "home", "subjects": 2, "faces": 0},
    ]
