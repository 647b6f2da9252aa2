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
    path.write_text("# ops team\nsha256:%s\n\n" % hashlib.sha256(b"from-file").hexdigest())
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
