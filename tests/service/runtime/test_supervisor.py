"""The model host's supervisor, with stand-in hosts (`fake_hosts`) in spawned processes: a hung
host is killed and restarted, restarts back off (doubling to a cap, from the start again once a
host stayed up), nothing starts once shutdown began, and a crashed worker's arena is removed."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys

import pytest

from service.runtime import model_host
from service.runtime.shm_arena import arena_path
from service.runtime.supervisor import Supervisor, Timing
from tests.conftest import REPO
from tests.polling import wait_until
from tests.service.runtime import fake_hosts

FAST = Timing(ping_every=0.05, ping_timeout=0.5, start_timeout=30.0, backoff_first=0.1, backoff_cap=0.4, stable_after=1.0)


@pytest.fixture
def supervise(tmp_path, caplog):
    """Start a Supervisor of `target` in tmp_path; closed at teardown."""
    caplog.set_level(logging.INFO, "facegate.supervisor")
    supervisors: list[Supervisor] = []

    def start(target, timing: Timing = FAST) -> Supervisor:
        supervisor = Supervisor(tmp_path, target, timing)
        supervisors.append(supervisor)
        supervisor.start()
        return supervisor

    yield start
    for supervisor in supervisors:
        supervisor.close()


def restart_delays(caplog) -> list[float]:
    return [r.args[2] for r in caplog.records if r.name == "facegate.supervisor" and "restarting it in" in r.msg]


def test_the_stand_ins_listen_where_the_model_host_does():
    assert fake_hosts.SOCKET == model_host.SOCKET


def test_a_hung_host_is_killed_and_restarted(supervise, caplog):
    supervisor = supervise(fake_hosts.hanging)
    first = supervisor.process
    wait_until(lambda: len(supervisor.starts) >= 2, "a second host started", timeout=60)
    assert first is not None and first.exitcode == -signal.SIGKILL  # it never exits by itself
    assert "left a ping unanswered for 0.5 s (hung)" in caplog.text


def test_an_answering_host_is_left_alone_and_stopped_at_close(supervise):
    supervisor = supervise(fake_hosts.answering)
    wait_until(lambda: supervisor.answered, "the host answered a ping")
    process = supervisor.process
    supervisor.close()
    assert supervisor.starts[1:] == [] and process is not None and not process.is_alive()


def test_restarts_back_off_to_a_cap_and_from_the_start_again_once_a_host_stayed_up(supervise, caplog):
    """Starts 1-2 exit at once (0.1, then 0.2 s), the 3rd answers pings for 1.2 s (past stable_after)
    then exits: 0.1 s again, then 0.2 and 0.2 (the cap, not 0.4)."""
    timing = Timing(ping_every=0.05, ping_timeout=0.5, start_timeout=30.0, backoff_first=0.1, backoff_cap=0.2, stable_after=0.5)
    supervisor = supervise(functools.partial(fake_hosts.up_on_start, start=3, seconds=1.2), timing)
    wait_until(lambda: len(restart_delays(caplog)) >= 5, "five restarts", timeout=90)
    assert restart_delays(caplog)[:5] == [0.1, 0.2, 0.1, 0.2, 0.2]
    gaps = [b - a for a, b in zip(supervisor.starts, supervisor.starts[1:], strict=False)]
    assert all(gap >= delay for gap, delay in zip(gaps, [0.1, 0.2], strict=False))  # each start waited its backoff


def test_nothing_starts_once_shutdown_began(supervise, caplog):
    supervisor = supervise(fake_hosts.dying, Timing(ping_every=0.05, backoff_first=60.0, backoff_cap=60.0))
    wait_until(lambda: restart_delays(caplog) == [60.0], "the first restart is waiting its backoff")
    supervisor.close()  # during the backoff: the watcher ends, the restart never comes
    assert len(supervisor.starts) == 1 and not supervisor._watcher.is_alive()
    assert supervisor._start_host() is None and len(supervisor.starts) == 1


def test_a_crashed_workers_arena_is_removed_and_a_live_ones_kept(supervise, tmp_path):
    """A worker killed outright (uvicorn restarts it under a new pid) leaves its arena; the supervisor removes it."""
    code = (
        "import os, sys, time; from pathlib import Path; from service.runtime.shm_arena import Arena, arena_path\n"
        "arena = Arena.reserve(arena_path(Path(sys.argv[1]), os.getpid()), 4 << 20)\n"
        "print(arena.path, flush=True); time.sleep(600)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    crashed = arena_path(tmp_path, worker.pid)
    assert worker.stdout.readline().strip() == str(crashed) and crashed.exists()
    alive = arena_path(tmp_path, os.getpid())
    alive.write_bytes(b"")
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    supervise(fake_hosts.answering)
    wait_until(lambda: not crashed.exists(), "the crashed worker's arena removed")
    assert alive.exists()


def test_the_supervisor_imports_no_model_code():
    """`facegate serve`'s own process only supervises: the model host's module (onnxruntime, the
    models, the pipeline) is imported in the host it spawns, not there (docs/benchmarks.md)."""
    names = ("onnxruntime", "service.runtime.model_host")
    code = f"import sys, service.runtime.supervisor; print(sorted(m for m in {names!r} if m in sys.modules))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert found.stdout.strip() == "[]", found.stdout


def test_facegate_serves_own_process_imports_no_faiss():
    """What `facegate serve` imports in its own process (the CLI without training's and the
    benchmarks' commands, the key file's rules, the supervisor, the workers' forkserver) brings no
    FAISS, OpenCV or onnxruntime: the collections' name rules live apart from their gallery states
    (service/gallery/collection_names.py), and the entry point's commands are not registered for it."""
    imports = "uvicorn, service.api.auth, service.runtime.preload, service.runtime.ready_workers, service.runtime.supervisor"
    names = ("faiss", "cv2", "onnxruntime", "service.gallery.collections", "training.commands", "benchmarks.commands")
    code = (
        "import sys, contextlib; sys.argv = ['facegate', 'serve', '--help']; from service import cli\n"
        f"with contextlib.suppress(SystemExit): cli.main()\nimport {imports}\n"
        f"print(sorted(m for m in {names!r} if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert found.stdout.splitlines()[-1] == "[]", found.stdout  # the last line: after serve's --help
