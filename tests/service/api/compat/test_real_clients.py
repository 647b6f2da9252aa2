"""The published clients, unchanged, driving a running `facegate serve` with only the URL and key
changed: `compreface-sdk` (also as Viseron's `compreface` component calls it), `deepstack-python`
and `deepstack-sdk` from PyPI, and `@exadel/compreface-js-sdk` from npm under Node. The Python ones need dependencies facegate's
environment must not take (deepstack-sdk brings opencv-python, which overwrites the headless build),
so each runs in the clients' own Python: FACEGATE_CLIENTS_PYTHON, else .venv-clients/bin/python as
`make clients` makes it; the JavaScript SDK is read from FACEGATE_CLIENTS_JS, else .clients-js. A
client that is missing skips with the reason. The drivers in clients/ assert the fields those
clients' users read."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.chaos.server import facegate_serve
from tests.conftest import REPO
from tests.requirements import need

pytestmark = [pytest.mark.data, pytest.mark.slow]

KEY = "client-key"
DRIVERS = Path(__file__).parent / "clients"


def _clients_python() -> str:
    return os.environ.get("FACEGATE_CLIENTS_PYTHON") or str(REPO / ".venv-clients" / "bin" / "python")


@pytest.fixture(scope="module")
def server(model_cache, test_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("clients-server")
    env = {"FACEGATE_MODEL_CACHE": str(model_cache), "FACEGATE_DATA_DIR": str(root / "gallery"), "FACEGATE_API_KEYS": KEY}
    with facegate_serve(env, root / "server.log", ready="/readyz", start_timeout=180) as (url, port, _):
        yield url, port


@pytest.fixture
def empty_gallery(server):
    url, _ = server
    assert httpx.delete(f"{url}/api/v1/recognition/subjects", headers={"X-API-Key": KEY}, timeout=30).status_code == 200
    return server


def _importable(package: str, module: str) -> str:
    """The clients' Python, where `module` imports; else skip with the reason (before any server starts)."""
    python = _clients_python()
    found = Path(python).exists() and subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    if not found:
        need("CLIENTS", f"{package} is not importable by {python}: run `make clients` or set FACEGATE_CLIENTS_PYTHON (docs/compat.md)")
    return python


@pytest.mark.parametrize(
    ("package", "module", "driver"),
    [
        ("compreface-sdk", "compreface", "drive_compreface_sdk.py"),
        ("compreface-sdk", "compreface", "drive_viseron.py"),
        ("deepstack-python", "deepstack.core", "drive_deepstack_python.py"),
        ("deepstack-sdk", "deepstack_sdk", "drive_deepstack_sdk.py"),
    ],
)
def test_client(package, module, driver, request, test_data):
    python = _importable(package, module)
    url, port = request.getfixturevalue("empty_gallery")
    target = {"compreface-sdk": ["http://127.0.0.1", str(port)], "deepstack-python": ["127.0.0.1", str(port)], "deepstack-sdk": [url]}[
        package
    ]
    examples = str(test_data / "tests" / "face_recognition" / "examples")
    run = subprocess.run([python, str(DRIVERS / driver), *target, KEY, examples], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def test_compreface_js_sdk(request, test_data):
    node = shutil.which("node")
    folder = Path(os.environ.get("FACEGATE_CLIENTS_JS") or REPO / ".clients-js")
    if node is None:
        need("CLIENTS", "node is not on PATH: the JavaScript SDK's test needs Node (docs/compat.md)")
    if not (folder / "node_modules" / "@exadel" / "compreface-js-sdk").is_dir():
        need("CLIENTS", f"@exadel/compreface-js-sdk is not installed under {folder}: run `make clients` or set FACEGATE_CLIENTS_JS")
    _, port = request.getfixturevalue("empty_gallery")
    examples = str(test_data / "tests" / "face_recognition" / "examples")
    driver = str(DRIVERS / "drive_compreface_js_sdk.mjs")
    env = {**os.environ, "FACEGATE_CLIENTS_JS": str(folder.resolve())}
    run = subprocess.run([node, driver, "http://127.0.0.1", str(port), KEY, examples], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
