"""The ready workers of one `facegate serve --workers N` (runtime/ready_workers.py): a worker counts
from its `mark_ready` until it closes or dies, however it dies; what a dead one left is removed by
whoever counts next."""

from __future__ import annotations

import os
import subprocess
import sys

from service.runtime.ready_workers import ReadyWorkers
from tests.conftest import REPO

MARK_AND_WAIT = """
import sys
from service.runtime.ready_workers import ReadyWorkers
ReadyWorkers(sys.argv[1], 2).mark_ready()
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_worker_counts_while_it_is_ready_and_alive(tmp_path):
    here = ReadyWorkers(tmp_path, 2)
    assert here.count() == 0 and "0 of 2 workers ready" in (here.problem() or "")
    other = subprocess.Popen([sys.executable, "-c", MARK_AND_WAIT, str(tmp_path)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline() == b"ready\n"
        here.mark_ready()
        assert here.count() == 2 and here.problem() is None
        other.kill()  # kill -9: its lock goes with it, its file stays
        other.wait(10)
        assert here.count() == 1 and here.problem() is not None
        assert [p.name for p in tmp_path.iterdir()] == [f"ready-{os.getpid()}"]  # the dead one's removed by the count
        here.close()
        assert here.count() == 0 and list(tmp_path.iterdir()) == []
    finally:
        other.kill()
