"""Docs that run (issue 48): every fenced shell block of README.md and docs/*.md runs as written, or
says why it cannot run here (tests/docs_blocks.py reads them; docs/testing.md#docs-that-run).

A block that talks to `localhost:8000` runs against one `facegate serve` for the module (the default
embedder, no API keys, as `make serve` starts it) on a gallery emptied before each block, its
`<!-- before: … -->` lines first. Every block runs under `bash -e -o pipefail` in a folder holding the
placeholders the pages use (`a.jpg`, `b.jpg`, `probe.jpg`, `ada.jpg`, `1.jpg`, `2.jpg`: LFW photos of
one person; `group.jpg`: two people; `photo.jpg`; `README.md`), with `facegate` on PATH. `curl` is
a shell function there that records each answer's status and body (headers with `-D`, the body
through `tee`, so `-o` and pipes work as written), checked against what the block's comments show."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import LFW_PEOPLE, REPO
from tests.docs_blocks import IMAGE_TESTS, Block, blocks, console_steps, mismatches, pages, shows, unknown_tests
from tests.service.api.test_server_process import Server

pytestmark = [pytest.mark.slow, pytest.mark.data]
TIMEOUT = 120
OUTPUT_MARK = "@@docs-test: next command@@"  # printed between a console block's commands, to split their output

ALL = [block for page in pages() for block in blocks(page)]
RUNNABLE = [block for block in ALL if block.not_run is None]

# curl as written, its answer recorded: call N's headers in $DOCS_CALLS/N.headers, its body in N.body
# (or, for `-o FILE`, a copy of FILE)
PRELUDE = r"""
curl() {
    local n out="" previous="" status
    n=$(( $(cat "$DOCS_CALLS/count" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$DOCS_CALLS/count"
    for arg in "$@"; do [ "$previous" = "-o" ] && out=$arg; previous=$arg; done
    command curl -D "$DOCS_CALLS/$n.headers" "$@" | tee "$DOCS_CALLS/$n.body"
    status=${PIPESTATUS[0]}
    if [ -n "$out" ] && [ -f "$out" ]; then cp "$out" "$DOCS_CALLS/$n.body"; fi
    return "$status"
}
"""


class FacegateServe(Server):
    """The server as the docs start it: the `facegate serve` command."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "from service.cli import main; main()", "serve", "--host", "127.0.0.1", "--port", str(self.port)]


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory, lfw_faces, two_faces_jpeg) -> Path:
    """The files the pages' commands name, in the folder they run in."""
    work = tmp_path_factory.mktemp("docs-work")
    same = lfw_faces[LFW_PEOPLE[0]]
    for name, data in {
        "a.jpg": same[0],
        "b.jpg": same[1],
        "probe.jpg": same[1],
        "ada.jpg": same[0],
        "1.jpg": same[0],
        "2.jpg": same[1],
        "photo.jpg": same[0],
        "group.jpg": two_faces_jpeg,
        "README.md": (REPO / "README.md").read_bytes(),
    }.items():
        (work / name).write_bytes(data)
    (work / "docker" / "secrets").mkdir(parents=True)  # a checkout's folder for the key files (docs/deployment.md)
    return work


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory, model_cache):
    root = tmp_path_factory.mktemp("docs-server")
    server = FacegateServe(root / "gallery", "dlib-resnet-v1", model_cache, root / "server.log")
    server.env.pop("FACEGATE_API_KEYS", None)
    server.env.pop("FACEGATE_API_KEYS_FILE", None)
    try:
        yield server.start()
    finally:
        server.stop()


def empty_gallery(url: str) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while subjects := client.get("/subjects", params={"limit": 100}).raise_for_status().json()["subjects"]:
            for subject in subjects:
                client.delete(f"/subjects/{subject['id']}").raise_for_status()


def run_shell(text: str, cwd: Path, calls: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`text` under bash -e -o pipefail with the recording curl; its calls in `calls`."""
    calls.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", PRELUDE + text],
        cwd=cwd,
        env={**env, "DOCS_CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def answers(calls: Path) -> list[tuple[int, str]]:
    """(status, body) of each recorded call, in order (the last status line: past a 100 Continue)."""
    count = int((calls / "count").read_text()) if (calls / "count").exists() else 0
    found = []
    for n in range(1, count + 1):
        statuses = re.findall(r"^HTTP/\S+ (\d{3})", (calls / f"{n}.headers").read_text(errors="replace"), re.M)
        found.append((int(statuses[-1]) if statuses else 0, (calls / f"{n}.body").read_text(errors="replace")))
    return found


def environment() -> dict[str, str]:
    """Ours, with this Python's `facegate` first on PATH and the checkout importable."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO)}


def check_answers(block: Block, recorded: list[tuple[int, str]]) -> list[str]:
    commands = block.commands()
    if len(recorded) != len(commands):
        return [f"{len(commands)} curl commands, {len(recorded)} answers recorded"]
    problems = []
    for command, (status, body) in zip(commands, recorded, strict=True):
        want = command.expected
        try:
            answer = json.loads(body) if body.strip() else None
        except json.JSONDecodeError:
            answer = body
        ok = status == want.status if want.status is not None else 400 <= status < 500 if want.error else 200 <= status < 300
        if want.error:
            ok = ok and isinstance(answer, dict) and isinstance(answer.get("error"), dict) and answer["error"].get("code") == want.error
        shown = f"{want.status or '4xx' if want.error else want.status or '2xx'} {want.error or ''}".strip()
        if not ok:
            problems.append(f"{command.text}\n  answered {status} {body[:300]}, the docs show {shown}")
        elif want.sample and not want.error:
            problems += [f"{command.text}\n  {m}" for m in mismatches(want.sample, answer)]
    return problems


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_block_runs_as_written(block, placeholders, request, tmp_path):
    env = environment()
    text, before = block.text, block.before
    if block.uses_server or "localhost:8000" in before:
        server = request.getfixturevalue("docs_server")
        empty_gallery(server.url)
        text, before = (s.replace("localhost:8000", f"127.0.0.1:{server.port}") for s in (text, before))
    work = tmp_path / "work"
    shutil.copytree(placeholders, work)
    if before:
        setup = run_shell(before, work, tmp_path / "before", env)
        assert setup.returncode == 0, f"{block.where}: its before lines exited {setup.returncode}:\n{setup.stderr[-2000:]}"
        failed = [(s, b) for s, b in answers(tmp_path / "before") if not 200 <= s < 300]
        assert not failed, f"{block.where}: its before lines got {failed}"
    steps = console_steps(text) if block.lang == "console" else [(text, "")]
    run = run_shell(f"\nprintf '%s\\n' '{OUTPUT_MARK}'\n".join(command for command, _ in steps), work, tmp_path / "calls", env)
    assert run.returncode == 0, f"{block.where} exited {run.returncode}:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    printed = run.stdout.split(OUTPUT_MARK + "\n")
    problems = [
        f"{command}\n  printed {out.strip()[:300]!r}, the docs show {shown!r}"
        for (command, shown), out in zip(steps, printed, strict=True)
        if shown and not shows(shown, out)
    ]
    problems += check_answers(block, answers(tmp_path / "calls"))
    assert not problems, f"{block.where}:\n" + "\n".join(problems)


def test_every_block_runs_or_says_why_not():
    assert len(ALL) >= 40 and len(RUNNABLE) >= 8, (len(ALL), len(RUNNABLE))
    problems = []
    for block in ALL:
        reason = block.not_run
        if reason is None:
            continue
        if len(reason) < 15:
            problems.append(f"{block.where}: `not run` needs a reason, not {reason!r}")
        if "docker" in block.text.lower() and not any(f"{test}::" in reason for test in IMAGE_TESTS):
            problems.append(f"{block.where}: a Docker block must name the `make image-test` test that runs it ({', '.join(IMAGE_TESTS)})")
        problems += [f"{block.where}: names {name}, which does not exist" for name in unknown_tests(reason)]
    assert not problems, "\n".join(problems)


def test_the_readme_tour_runs():
    """The README's 60-second tour is among the blocks run, with its sample answers and its error."""
    tour = next(b for b in RUNNABLE if b.path.name == "README.md" and b.uses_server)
    commands = tour.commands()
    assert len(commands) >= 9 and sum(1 for c in commands if c.expected.error == "invalid_image") == 1
    assert any(c.expected.sample and c.expected.sample.get("far") == "1e-3" for c in commands)


def test_the_quick_start_key_file_is_one_the_service_accepts(placeholders, tmp_path):
    """Issue 48, item 1: the deployment quick start's key lines, run as written, give a key file that
    `facegate serve` starts with, and the key they print is a valid key."""
    from service.api.auth import ApiKeys
    from service.core.settings import Settings

    block = next(b for b in RUNNABLE if b.path.name == "deployment.md" and ">> docker/secrets/api_keys" in b.text)
    work = tmp_path / "work"
    shutil.copytree(placeholders, work)
    run = run_shell(block.text, work, tmp_path / "calls", environment())
    assert run.returncode == 0, run.stderr
    key = re.search(r"^API key: (\S+)$", run.stdout, re.M).group(1)
    keys = ApiKeys.from_settings(Settings(api_keys_file=work / "docker" / "secrets" / "api_keys"))
    assert keys.enabled and keys.check(key) and not keys.check(key + "x")
