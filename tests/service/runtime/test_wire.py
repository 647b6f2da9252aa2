"""The worker ↔ model host messages: runs and answers as binary records, several answers in one
message, everything else pickled."""

from __future__ import annotations

from concurrent.futures import Future
from multiprocessing import Pipe

import numpy as np

from service.runtime import wire
from service.runtime.model_host import _Worker
from service.runtime.shm_arena import BLOCK, Arena


def test_runs_and_answers_travel_as_records_and_come_back_as_their_tuples():
    run = wire.record("embed", 7, 3 * BLOCK, (2, 150, 150, 3), "|u1")
    done = wire.record("done", 8, 0, (3, 15), "<f4")
    assert run is not None and done is not None and wire.is_record(run) and len(run) == wire.RECORD.size
    assert wire.messages(wire.joined([run, done])) == [
        ("run", 7, "embed", 3 * BLOCK, (2, 150, 150, 3), "|u1", None),
        ("done", 8, 0, (3, 15), "<f4", None),
    ]


def test_what_a_record_cannot_hold_is_pickled():
    assert wire.record("detect", 1, 0, (1, 2, 3, 4, 5), "|u1") is None
    message = ("run", 1, "detect", None, (2, 2), "<f4", np.ones((2, 2), np.float32))
    data = wire.pickled(message)
    assert not wire.is_record(data)
    [back] = wire.messages(data)
    assert back[:6] == message[:6] and np.array_equal(back[6], message[6])


def test_the_answers_waiting_go_out_in_one_message_an_error_on_its_own(tmp_path):
    here, there = Pipe()
    worker = _Worker(host=None, connection=there)  # type: ignore[arg-type]
    worker.arena = Arena(tmp_path / "arena", 4 * BLOCK, create=True)
    for number in range(3):
        future: Future = Future()
        future.set_result(np.full((2, 15), number, np.float32))
        worker.answers.put((number, number * BLOCK, BLOCK, future))
    failed: Future = Future()
    failed.set_exception(ValueError("bad batch"))
    worker.answers.put((3, None, 0, failed))
    worker.answers.put(None)
    worker._write()
    received = [wire.messages(here.recv_bytes()) for _ in range(2)]
    assert not here.poll()
    assert received[0] == [("error", 3, "ValueError: bad batch")]
    assert received[1] == [("done", n, n * BLOCK, (2, 15), "<f4", None) for n in range(3)]
    for n in range(3):  # each answer written back over its input
        assert np.array_equal(worker.arena.view(n * BLOCK, (2, 15), "<f4"), np.full((2, 15), n, np.float32))
    worker.arena.close()
