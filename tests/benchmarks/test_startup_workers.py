"""benchmarks/startup_workers.py runs `facegate serve` on a small gallery and reads the process tree
at rest (issue 44): with --by-process each process is named with its PSS and its own pages. What the
tree holds at rest is asserted, not its figures: a single process keeps one decoder running; the
workers of `--workers 2` keep none (each kept one before round 11), beside the model host."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "startup_workers.py"


def test_at_rest_one_process_keeps_a_decoder_and_the_workers_of_several_none(model_cache):
    env = {**os.environ, "FACEGATE_MODEL_CACHE": str(model_cache), "FACEGATE_IDLE_TRIM_SECONDS": "2"}  # at rest in 5 s
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--faces", "300", "--workers", "1", "2", "--by-process"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    trees, roles = [], []
    for line in done.stdout.splitlines():
        if found := re.match(r"\s+(\S.*?)\s+\d+ PSS\s+[\d.]+ MiB, its own\s+[\d.]+ ", line):
            roles.append(found.group(1))
        elif re.match(r"\s+[12]\s+[\d.]+\s+\d+\s+\d+", line):  # a tree's row closes its processes' lines
            trees.append(sorted(roles))
            roles = []
    one, two = trees
    assert one.count("decoder") == 1 and "facegate serve" in one, one
    assert two.count("worker") == 2 and "model host" in two and "decoder" not in two, two
