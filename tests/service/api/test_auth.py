"""Optional API keys: hashes only, every route but /healthz and /readyz guarded."""

import hashlib

import pytest
from pydantic import SecretStr

from service.api.auth import ApiKeys


def test_keys_and_hashes_are_accepted_and_nothing_else():
    keys = ApiKeys(["plain-key", "sha256:" + hashlib.sha256(b"hashed-key").hexdigest()])
    assert keys.enabled
    assert keys.check("plain-key") and keys.check("hashed-key")
    assert not keys.check("") and not keys.check(None) and not keys.check("plain-ke") and not keys.check("sha256:" + "0" * 64)
    assert not ApiKeys([]).enabled


def test_bad_hash_entry_is_refused():
    with pytest.raises(ValueError):
        ApiKeys(["sha256:abcd"])


def test_keys_file_and_env(tmp_path, settings):
    path = tmp_path / "keys"
    path.write_text("# ops team\nsha256:{}\n\n".format(hashlib.sha256(b"from-file").hexdigest()))
    keys = ApiKeys.from_settings(settings.model_copy(update={"api_keys": SecretStr("a, b"), "api_keys_file": path}))
    assert all(keys.check(k) for k in ("a", "b", "from-file"))
    assert not keys.check("sha256:" + hashlib.sha256(b"from-file").hexdigest())


def test_routes_need_a_key_when_configured(api_settings, make_client):
    client = make_client(api_settings.model_copy(update={"api_keys": SecretStr("s3cret")}))
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    for method, path in [("get", "/subjects"), ("get", "/metrics"), ("get", "/docs"), ("post", "/verify"), ("get", "/nowhere")]:
        response = getattr(client, method)(path)
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "unauthorized"
    assert client.get("/subjects", headers={"X-API-Key": "wrong"}).status_code == 401
    assert client.get("/subjects", headers={"X-API-Key": "s3cret"}).status_code == 200
    schema = client.get("/openapi.json", headers={"X-API-Key": "s3cret"}).json()
    assert schema["components"]["securitySchemes"]["ApiKey"]["name"] == "X-API-Key"
    assert "security" in schema["paths"]["/verify"]["post"] and "security" not in schema["paths"]["/healthz"]["get"]


def _settings_with_file(settings, path, **extra):
    return settings.model_copy(update={"api_keys": SecretStr(""), "api_keys_file": path, **extra})


def test_a_key_file_without_keys_is_refused_unless_anonymous_is_allowed(tmp_path, settings):
    from service.api.auth import KeyConfigError

    path = tmp_path / "keys"
    path.write_text("# rotated out\n\n   # nothing left\n")
    with pytest.raises(KeyConfigError, match="holds no key"):
        ApiKeys.from_settings(_settings_with_file(settings, path))
    assert not ApiKeys.from_settings(_settings_with_file(settings, path, allow_anonymous=True)).enabled


def test_malformed_and_missing_key_files_say_where_without_echoing_a_key(tmp_path, settings):
    from service.api.auth import KeyConfigError

    path = tmp_path / "keys"
    path.write_text("good-key\nsha256:not-hex-secretish\n")
    with pytest.raises(KeyConfigError, match="line 2") as caught:
        ApiKeys.from_settings(_settings_with_file(settings, path))
    assert "secretish" not in str(caught.value)
    with pytest.raises(KeyConfigError, match="cannot be read"):
        ApiKeys.from_settings(_settings_with_file(settings, tmp_path / "missing"))


def test_reload_swaps_keys_and_keeps_the_old_ones_when_the_file_is_broken(tmp_path, settings):
    path = tmp_path / "keys"
    path.write_text("old-key\n")
    keys = ApiKeys.from_settings(_settings_with_file(settings, path))
    path.write_text("new-key\n")
    keys.reload()
    assert keys.check("new-key") and not keys.check("old-key")
    for broken in ("sha256:zz\n", "# emptied\n"):
        path.write_text(broken)
        keys.reload()
        assert keys.check("new-key")
    path.unlink()
    keys.reload()
    assert keys.check("new-key")


def test_a_duplicated_key_header_is_refused(api_settings, make_client):
    client = make_client(api_settings.model_copy(update={"api_keys": SecretStr("s3cret")}))
    assert client.get("/subjects", headers=[("X-API-Key", "wrong"), ("X-API-Key", "s3cret")]).status_code == 401
    assert client.get("/subjects", headers=[("X-API-Key", "s3cret"), ("X-API-Key", "s3cret")]).status_code == 401
    assert client.get("/subjects", headers={"X-API-Key": "s3cret"}).status_code == 200


def test_unauthenticated_requests_with_invented_methods_add_no_metric_series(api_settings, make_client):
    client = make_client(api_settings.model_copy(update={"api_keys": SecretStr("s3cret")}))
    for n in range(20):
        client.request(f"INVENTED{n}", f"/nowhere/{n}")
    text = client.get("/metrics", headers={"X-API-Key": "s3cret"}).text
    assert "INVENTED" not in text and "/nowhere" not in text
    assert 'method="other"' in text


# The key file's one rule (issue 34, defect 6): '#' starts a comment only at the start of a line.


def test_a_hash_sign_inside_a_key_is_part_of_it(tmp_path, settings):
    """`ab#cd` was read as the key `ab`: a shorter key than the one handed out, silently."""
    path = tmp_path / "keys"
    path.write_text("# ops team\n  # indented comment\nab#cd-rest-of-the-key\n#not-a-key\n")
    keys = ApiKeys.from_settings(_settings_with_file(settings, path))
    assert keys.check("ab#cd-rest-of-the-key")
    assert not keys.check("ab") and not keys.check("#not-a-key") and not keys.check("not-a-key")


def test_a_byte_order_mark_is_accepted(tmp_path, settings):
    """Windows editors start UTF-8 files with a BOM: it made the first key unusable."""
    path = tmp_path / "keys"
    path.write_bytes("\ufefffirst-key\nsecond-key\n".encode())
    keys = ApiKeys.from_settings(_settings_with_file(settings, path))
    assert keys.check("first-key") and keys.check("second-key")
    path.write_bytes("\ufeff# a comment first\nthe-key\n".encode())
    assert ApiKeys.from_settings(_settings_with_file(settings, path)).check("the-key")


@pytest.mark.parametrize(
    "line",
    ["sha256:" + "ab" * 32 + "  # the ops team", "key with spaces", "tab\there", "clé-non-ascii", "ctrl\x07char"],
)
def test_a_key_the_rule_cannot_carry_is_refused_with_its_line(tmp_path, settings, line):
    """An inline comment (the old rule) or any character an X-API-Key header would not carry as
    written: refused at start, with the line, never cut or kept silently."""
    from service.api.auth import KeyConfigError

    path = tmp_path / "keys"
    path.write_text(f"good-key\n# comment\n{line}\n", encoding="utf-8")
    with pytest.raises(KeyConfigError, match="line 3: a key is printable ASCII without spaces") as caught:
        ApiKeys.from_settings(_settings_with_file(settings, path))
    assert line not in str(caught.value)  # a key is never echoed


def test_environment_keys_follow_the_same_characters(settings):
    from service.api.auth import KeyConfigError

    with pytest.raises(KeyConfigError, match="FACEGATE_API_KEYS entry 2"):
        ApiKeys.from_settings(settings.model_copy(update={"api_keys": SecretStr("good, has space")}))
