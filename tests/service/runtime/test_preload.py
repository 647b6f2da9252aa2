"""`preload.children_context`: a process forked by a forkserver starts its own children (a worker's
decoders) from that forkserver, not from one of its own (17 MiB a worker), and from one of its own
again once that forkserver is gone."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import cv2
import numpy as np
import pytest

from tests.requirements import need

PNG = cv2.imencode(".png", np.zeros((48, 64, 3), np.uint8))[1].tobytes()
LIMITS = (10_000_000, 10_000_000, 16)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _decode_and_report(results, kill_parent_first: bool) -> None:
    """In a process forked by a forkserver: decode one image through a pool and report who forked
    its decoder, and whether this process started a forkserver of its own."""
    from multiprocessing import forkserver

    from service.runtime.decode_workers import DecodeWorkers

    forked_by = os.getppid()
    if kill_parent_first:
        os.kill(forked_by, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.getppid() == forked_by and time.monotonic() < deadline:
            time.sleep(0.01)
    pool = DecodeWorkers(1, 1024, 30.0, *LIMITS[:2])
    try:
        shape = pool.decode(PNG, *LIMITS).shape
        (worker,) = pool._workers
        results.put((shape, forked_by, _parent(worker.process.pid), forkserver._forkserver._forkserver_pid))
    finally:
        pool.close()


@pytest.fixture
def forkserver_context():
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "reads the process tree from /proc")
    if sys.version_info >= (3, 14):
        pytest.skip("Python 3.14's forkserver authenticates its clients: a process starts its own (children_context)")
    return multiprocessing.get_context("forkserver")


def _run(context, kill_parent_first: bool):
    results = context.Queue()
    child = context.Process(target=_decode_and_report, args=(results, kill_parent_first))
    child.start()
    try:
        return results.get(timeout=120)
    finally:
        child.join(30)


def test_a_forked_process_starts_its_decoders_from_its_own_forkserver(forkserver_context):
    shape, forked_by, decoder_parent, own_forkserver = _run(forkserver_context, kill_parent_first=False)
    assert shape == (48, 64, 3)
    assert decoder_parent == forked_by, "the decoder does not come from the forkserver that forked its pool's process"
    assert own_forkserver is None, "the process started a forkserver of its own"


def test_once_that_forkserver_is_gone_it_starts_one_of_its_own(forkserver_context):
    shape, forked_by, decoder_parent, own_forkserver = _run(forkserver_context, kill_parent_first=True)
    assert shape == (48, 64, 3)
    assert own_forkserver is not None and decoder_parent == own_forkserver and decoder_parent != forked_by
