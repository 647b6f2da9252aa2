"""`preload.children_context`: a process forked by a forkserver starts its own children (a worker's
decoders) from that forkserver, not from one of its own (17 MiB a worker), and from one of its own
again once that forkserver is gone."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import forkserver

import cv2
import numpy as np
import pytest

from tests.requirements import need

PNG = cv2.imencode(".png", np.zeros((48, 64, 3), np.uint8))[1].tobytes()
LIMITS = (10_000_000, 10_000_000, 16)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _decode_and_report(results, kill_parent: bool) -> None:
    """In a process forked by a forkserver: a pool made, that forkserver killed or not, three images
    decoded at once; reports the shapes, who forked the decoders and whether this process started a
    forkserver of its own."""
    from service.runtime.decode_workers import DecodeWorkers

    forked_by = os.getppid()
    pool = DecodeWorkers(3, 1024, 30.0, *LIMITS[:2])  # it takes the forkserver that forked this process
    looked_up = forkserver._forkserver.ensure_running  # as a thread that looked it up before another switched it back
    if kill_parent:
        os.kill(forked_by, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.getppid() == forked_by and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        started = threading.Barrier(3)

        def decode() -> tuple[int, ...]:
            started.wait()  # their decoders start at once: the switch to a forkserver of its own is made once
            return pool.decode(PNG, *LIMITS).shape

        with ThreadPoolExecutor(3) as threads:
            shapes = set(threads.map(lambda _: decode(), range(3)))
        looked_up()  # raised AttributeError when the second switch back was attempted: a 500 in a request
        parents = {_parent(worker.process.pid) for worker in pool._workers}
        results.put((shapes, forked_by, parents, forkserver._forkserver._forkserver_pid))
    finally:
        pool.close()


@pytest.fixture
def forkserver_context():
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process tree from /proc")
    return multiprocessing.get_context("forkserver")


# Python 3.14's forkserver authenticates its clients with a key a forked process does not hold: there a
# process starts a forkserver of its own (children_context), as multiprocessing always did.
SHARES = not hasattr(forkserver._forkserver, "_forkserver_authkey")


def _run(context, kill_parent: bool):
    results = context.Queue()
    child = context.Process(target=_decode_and_report, args=(results, kill_parent))
    child.start()
    try:
        return results.get(timeout=60)
    finally:
        child.join(30)


def test_a_forked_process_starts_its_decoders_from_the_forkserver_that_forked_it(forkserver_context):
    shapes, forked_by, parents, own_forkserver = _run(forkserver_context, kill_parent=False)
    assert shapes == {(48, 64, 3)}
    if SHARES:
        assert parents == {forked_by}, "the decoders do not come from the forkserver that forked their pool's process"
        assert own_forkserver is None, "the process started a forkserver of its own"
    else:
        assert own_forkserver is not None and parents == {own_forkserver}


def test_once_that_forkserver_is_gone_it_starts_one_of_its_own(forkserver_context):
    """Several decoders starting at once after it is gone (a 500 until the switch was made once)."""
    shapes, forked_by, parents, own_forkserver = _run(forkserver_context, kill_parent=True)
    assert shapes == {(48, 64, 3)}
    assert own_forkserver is not None and parents == {own_forkserver} and own_forkserver != forked_by
