"""SIGHUP re-reads the key file (issue 23, defect 8: it used to kill the server): the new key is
accepted and the old refused, and a broken file on the next SIGHUP keeps the keys in use."""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.chaos.server import facegate_serve
from tests.polling import wait_until

pytestmark = pytest.mark.slow


def _status(url: str, key: str) -> int:
    return httpx.get(f"{url}/subjects", headers={"X-API-Key": key}, timeout=5).status_code


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
        wait_until(lambda: _status(url, "new-key") == 200, "the new key accepted after SIGHUP")
        assert _status(url, "old-key") == 401 and process.poll() is None
        keys.write_text("# emptied by mistake\n")
        process.send_signal(signal.SIGHUP)
        # the second SIGHUP handled (its refusal logged) before the keys in use are checked
        wait_until(lambda: "API keys not reloaded" in (tmp_path / "server.log").read_text(), "the broken file's reload refused")
        assert process.poll() is None and _status(url, "new-key") == 200 and _status(url, "old-key") == 401
