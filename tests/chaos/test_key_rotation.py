"""SIGHUP re-reads the key file (issue 23, defect 8: it used to kill the server): the new key is
accepted and the old refused, and a broken file on the next SIGHUP keeps the keys in use."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.chaos.server import facegate_serve

pytestmark = pytest.mark.slow


def _status(url: str, key: str) -> int:
    return httpx.get(f"{url}/subjects", headers={"X-API-Key": key}, timeout=5).status_code


def _until(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_sighup_reloads_the_key_file(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("old-key\n")
    env = {
        "FACEGATE_API_KEYS_FILE": str(keys),
        "FACEGATE_DATA_DIR": str(tmp_path / "gallery"),
        "FACEGATE_MODEL_CACHE": str(tmp_path / "cache"),
        "FACEGATE_EMBEDDER": "none",
    }
    with facegate_serve(env, tmp_path / "server.log") as (url, _, process):
        assert _status(url, "old-key") == 200
        keys.write_text("new-key\n")
        process.send_signal(signal.SIGHUP)
        assert _until(lambda: _status(url, "new-key") == 200)
        assert _status(url, "old-key") == 401 and process.poll() is None
        keys.write_text("# emptied by mistake\n")
        process.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert process.poll() is None and _status(url, "new-key") == 200
        assert "API keys not reloaded" in (tmp_path / "server.log").read_text()
