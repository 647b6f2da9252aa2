"""The micro-batcher: concurrent jobs share one model run and each gets exactly its own rows."""

import threading

import numpy as np
import pytest

from service.batching import MicroBatcher
from service.metrics import Metrics


def crops(value: int, n: int) -> np.ndarray:
    return np.full((n, 2, 2, 3), value, np.uint8)


def test_queued_jobs_run_as_one_batch_with_their_own_rows():
    started, release = threading.Event(), threading.Event()
    calls = []

    def embed(x):
        calls.append(len(x))
        if len(calls) == 1:
            started.set()
            assert release.wait(10)  # hold the first run until the others are queued
        return x.reshape(len(x), -1)[:, :1].astype(np.float32)

    batcher = MicroBatcher(embed, max_batch=64, max_wait_ms=0, metrics=Metrics())
    try:
        first = batcher.submit(crops(1, 1))
        assert started.wait(10)
        others = [batcher.submit(crops(v, v)) for v in range(2, 7)]
        release.set()
        assert first.result(10)[:, 0].tolist() == [1]
        for value, future in zip(range(2, 7), others):
            assert future.result(10)[:, 0].tolist() == [value] * value
        assert calls == [1, 2 + 3 + 4 + 5 + 6]
    finally:
        batcher.close()


def test_max_batch_splits_runs():
    gate = threading.Event()
    calls = []

    def embed(x):
        calls.append(len(x))
        gate.wait(10)
        return np.zeros((len(x), 1), np.float32)

    batcher = MicroBatcher(embed, max_batch=4, max_wait_ms=0, metrics=Metrics())
    try:
        futures = [batcher.submit(crops(0, 2)) for _ in range(5)]
        gate.set()
        for f in futures:
            assert f.result(10).shape == (2, 1)
        assert max(calls) <= 4 and sum(calls) == 10
    finally:
        batcher.close()


def test_a_failing_run_fails_its_jobs_and_the_batcher_goes_on():
    def embed(x):
        if x[0, 0, 0, 0] == 9:
            raise ValueError("boom")
        return np.ones((len(x), 1), np.float32)

    metrics = Metrics()
    batcher = MicroBatcher(embed, max_batch=8, max_wait_ms=0, metrics=metrics)
    try:
        with pytest.raises(ValueError, match="boom"):
            batcher.submit(crops(9, 1)).result(10)
        assert batcher.submit(crops(1, 3)).result(10).shape == (3, 1)
        assert metrics.registry.get_sample_value("facegate_faces_embedded_total") == 3
    finally:
        batcher.close()
