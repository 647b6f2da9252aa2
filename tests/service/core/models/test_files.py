"""`facegate models pull` against a local HTTP server: only a file that matches its manifest
ever takes its name in the cache."""

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from service.core.errors import ModelError
from service.core.models.files import pull
from service.core.models.manifest import Manifest

PAYLOAD = bytes(range(256)) * 400


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/good.onnx":
            self._send(PAYLOAD)
        elif self.path == "/forged.onnx":
            self._send(PAYLOAD[:-1] + b"\x00")
        elif self.path == "/truncated.onnx":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
            self.close_connection = True
        elif self.path == "/larger.onnx":
            self._send(PAYLOAD + b"extra")
        else:
            self.send_error(404)

    def _send(self, body: bytes):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _manifest(url: str) -> Manifest:
    return Manifest(
        name="thing",
        version="1",
        task="detector",
        file={"name": "thing.onnx", "sha256": hashlib.sha256(PAYLOAD).hexdigest(), "bytes": len(PAYLOAD), "url": url},
        input={"name": "input", "shape": [1, 3, 8, 8], "color": "BGR"},
        outputs=[{"name": "out", "shape": [1, 1]}],
        license={"name": "MIT"},
    )


def test_good_file_lands_in_the_cache(server, tmp_path):
    target = pull(_manifest(f"{server}/good.onnx"), tmp_path / "cache")
    assert target.read_bytes() == PAYLOAD
    assert sorted(p.name for p in target.parent.iterdir()) == ["thing.onnx"]


@pytest.mark.parametrize(
    "path, reason",
    [("forged.onnx", "sha256"), ("missing.onnx", "404"), ("truncated.onnx", "IncompleteRead|got [0-9]+ bytes"), ("larger.onnx", "larger")],
)
def test_bad_downloads_leave_nothing_behind(server, tmp_path, path, reason):
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match=reason):
        pull(_manifest(f"{server}/{path}"), cache)
    assert list(cache.iterdir()) == []


def test_unreachable_host_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="cannot download"):
        pull(_manifest("http://127.0.0.1:9/none.onnx"), tmp_path, timeout=2)


def test_corrupt_cached_file_is_replaced(server, tmp_path):
    (tmp_path / "thing.onnx").write_bytes(b"corrupt")
    assert pull(_manifest(f"{server}/good.onnx"), tmp_path).read_bytes() == PAYLOAD


def test_cli_pull_uses_the_manifest_folder_and_cache(server, tmp_path, monkeypatch):
    from service import cli
    from service.core.settings import get_settings

    models = tmp_path / "models"
    models.mkdir()
    _manifest(f"{server}/good.onnx").save(models / "thing.json")
    monkeypatch.setenv("FACEGATE_MODELS_DIR", str(models))
    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(tmp_path / "cache"))
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli.app, ["models", "pull"])
        assert result.exit_code == 0, result.output
        assert (tmp_path / "cache" / "thing.onnx").read_bytes() == PAYLOAD
        result = CliRunner().invoke(cli.app, ["models", "pull", "thing", "--from", f"{server}/forged.onnx"])
        assert result.exit_code == 0  # already present and intact: nothing to download
        (tmp_path / "cache" / "thing.onnx").unlink()
        result = CliRunner().invoke(cli.app, ["models", "pull", "thing", "--from", f"{server}/forged.onnx"])
        assert result.exit_code == 2 and "sha256" in result.output
    finally:
        get_settings.cache_clear()


def test_cli_pull_serving_fetches_only_the_named_embedder_and_the_detector(server, tmp_path, monkeypatch):
    """`make serve` runs `models pull --serving`: the embedder FACEGATE_EMBEDDER names and the detector,
    never the other manifests' downloads (dlib's weights when another embedder is served)."""
    from service import cli
    from service.core.settings import get_settings

    models = tmp_path / "models"
    models.mkdir()
    for name in ("detector", "served", "other"):
        manifest = _manifest(f"{server}/good.onnx")
        manifest.name, manifest.file.name = name, f"{name}.onnx"
        manifest.save(models / f"{name}.json")
    monkeypatch.setenv("FACEGATE_MODELS_DIR", str(models))
    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FACEGATE_DETECTOR", "detector")
    monkeypatch.setenv("FACEGATE_EMBEDDER", "served")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli.app, ["models", "pull", "--serving"])
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["detector.onnx", "served.onnx"]
        result = CliRunner().invoke(cli.app, ["models", "pull", "--serving", "other"])
        assert result.exit_code == 2 and "give no NAME" in result.output
    finally:
        get_settings.cache_clear()
