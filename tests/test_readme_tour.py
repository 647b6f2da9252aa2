"""README's 60-second tour runs as written (issue 17, item 7): every `curl` line of its ```sh block, in
order, from a folder holding `a.jpg`, `b.jpg` (two LFW photos of one person), `group.jpg` (two faces)
and `README.md`, against `facegate serve` on a free 127.0.0.1 port with the default embedder
(dlib-resnet-v1) on a fresh gallery. Each curl must exit 0; an example whose sample answer is an
error must get a 4xx with that code, every other one a 2xx, and a sample answer's fields, threshold
and FAR must be the real answer's. Needs FACEGATE_TEST_DATA and FACEGATE_MODEL_CACHE."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import LFW_PEOPLE, REPO
from tests.service.api.test_server_process import Server

pytestmark = [pytest.mark.slow, pytest.mark.data]
TIMEOUT = 60


class FacegateServe(Server):
    """The server as the README starts it: the `facegate serve` command."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "from service.cli import main; main()", "serve", "--host", "127.0.0.1", "--port", str(self.port)]


def tour() -> list[tuple[str, str | None]]:
    """(curl line, its sample answer: the `# {…}` line right after it, or None) from the README's ```sh block."""
    block = re.search(r"^```sh\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M).group(1)
    lines = [line.strip() for line in block.splitlines()]
    steps = []
    for i, line in enumerate(lines):
        if line.startswith("curl "):
            after = lines[i + 1] if i + 1 < len(lines) else ""
            steps.append((line, after[2:] if after.startswith("# {") else None))
    return steps


def parse_sample(sample: str) -> dict:
    """A sample answer with its elisions (`[…]`, `{…}`) made empty."""
    return json.loads(sample.replace("[…]", "[]").replace("{…}", "{}"))


def test_the_tour_has_its_examples():
    steps = tour()
    assert len(steps) >= 9 and all("localhost:8000" in line for line, _ in steps)
    assert sum(1 for _, sample in steps if sample and '"error"' in sample) == 1


def test_readme_tour_runs_as_written(tmp_path, model_cache, lfw_faces, two_faces_jpeg):
    person = LFW_PEOPLE[0]
    work = tmp_path / "tour"
    work.mkdir()
    (work / "a.jpg").write_bytes(lfw_faces[person][0])
    (work / "b.jpg").write_bytes(lfw_faces[person][1])
    (work / "group.jpg").write_bytes(two_faces_jpeg)
    (work / "README.md").write_bytes((REPO / "README.md").read_bytes())
    server = FacegateServe(tmp_path / "gallery", "dlib-resnet-v1", model_cache, tmp_path / "server.log")
    server.env.pop("FACEGATE_API_KEYS", None)
    server.env.pop("FACEGATE_API_KEYS_FILE", None)
    try:
        server.start()
        for line, sample in tour():
            command = line.replace("localhost:8000", f"127.0.0.1:{server.port}").replace("curl ", "curl -o \"$BODY\" -w '%{http_code}' ", 1)
            body = tmp_path / "body"
            run = subprocess.run(
                ["bash", "-c", command], cwd=work, env={**os.environ, "BODY": str(body)}, capture_output=True, text=True, timeout=TIMEOUT
            )
            assert run.returncode == 0, f"{line}\n{run.stderr}"
            status, answer = int(run.stdout), body.read_text()
            expected = parse_sample(sample) if sample else None
            if expected and "error" in expected:
                assert 400 <= status < 500, f"{line}: {status} {answer}"
                assert json.loads(answer)["error"]["code"] == expected["error"]["code"], f"{line}: {answer}"
                continue
            assert 200 <= status < 300, f"{line}: {status} {answer}"
            if expected:
                real = json.loads(answer)
                assert set(real) == set(expected), f"{line}: {answer}"
                for field in ("match", "threshold", "far", "subject_id"):
                    assert real[field] == expected[field], f"{line}: {field} is {real[field]!r}, the README says {expected[field]!r}"
    finally:
        server.stop()
