"""The micro-batcher: concurrent jobs share one model run and each gets exactly its own rows."""

import threading

import numpy as np
import pytest

from service.metrics import Metrics
from service.runtime.batching import MicroBatcher


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
        for value, future in zip(range(2, 7), others, strict=True):
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


def test_batch_shapes_pad_to_the_next_size_and_split_above_the_largest():
    from service.core.batch_shapes import BatchShapes

    shapes = BatchShapes([8, 1, 4, 2, 4])
    assert shapes.sizes == (1, 2, 4, 8) and [shapes.bucket(n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    seen = []

    def double(x):
        seen.append(len(x))
        return x[:, 0, 0, :1].astype(np.float32) * 2

    for n in (1, 3, 5, 8, 13, 19):
        rows = np.arange(1, n + 1, dtype=np.uint8).reshape(n, 1, 1, 1).repeat(2, 1).repeat(2, 2).repeat(3, 3)
        assert BatchShapes([1, 2, 4, 8]).run(double, rows)[:, 0].tolist() == [2.0 * v for v in range(1, n + 1)]
    assert set(seen) <= {1, 2, 4, 8} and 3 not in seen and 5 not in seen
    assert BatchShapes([2]).run(double, np.zeros((0, 2, 2, 3), np.uint8)).shape == (0, 1) and seen[-1] == 0  # fn decides
    with pytest.raises(ValueError):
        BatchShapes([0, 2])


def test_the_batcher_hands_the_model_only_bucket_sizes():
    """Concurrent jobs of odd sizes reach the model padded to a bucket, and each job gets its rows."""
    from service.core.batch_shapes import BatchShapes

    shapes = BatchShapes([1, 2, 4, 8])
    seen = []

    def embed(x):
        seen.append(len(x))
        return x.reshape(len(x), -1)[:, :1].astype(np.float32)

    batcher = MicroBatcher(lambda x: shapes.run(embed, x), max_batch=shapes.largest, max_wait_ms=5, metrics=Metrics())
    try:
        sizes = [3, 1, 5, 2, 7, 1, 11, 6]
        futures = [batcher.submit(crops(v, n)) for v, n in enumerate(sizes, start=1)]
        for value, (n, future) in enumerate(zip(sizes, futures, strict=True), start=1):
            assert future.result(10)[:, 0].tolist() == [value] * n
        assert set(seen) <= {1, 2, 4, 8}, seen
    finally:
        batcher.close()


def test_a_request_cancelled_while_its_batch_runs_does_not_stop_the_batcher():
    """The lost wake-up behind a request that went unanswered at 0% CPU (issue 23): an awaiting task
    cancelled (its asyncio.wrap_future cancels the Future) made set_result raise InvalidStateError
    in the batcher's thread, which ended it: every later job waited forever."""
    import asyncio

    started, release = threading.Event(), threading.Event()

    def embed(x):
        started.set()
        assert release.wait(10)
        return x.reshape(len(x), -1)[:, :1].astype(np.float32)

    batcher = MicroBatcher(embed, max_batch=8, max_wait_ms=0, metrics=Metrics())

    async def scenario():
        running = asyncio.ensure_future(asyncio.wrap_future(batcher.submit(crops(1, 1))))
        assert await asyncio.to_thread(started.wait, 10)
        running.cancel()  # as when the request's task is cancelled mid-run
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await running
        later = await asyncio.wait_for(asyncio.wrap_future(batcher.submit(crops(2, 1))), 10)
        assert later[:, 0].tolist() == [2]

    try:
        asyncio.run(scenario())
    finally:
        batcher.close()


def test_a_job_cancelled_while_queued_is_dropped_and_the_rest_are_served():
    started, release = threading.Event(), threading.Event()
    calls = []

    def embed(x):
        calls.append(x[:, 0, 0, 0].tolist())
        started.set()
        assert release.wait(10)
        return x.reshape(len(x), -1)[:, :1].astype(np.float32)

    batcher = MicroBatcher(embed, max_batch=8, max_wait_ms=0, metrics=Metrics())
    try:
        first = batcher.submit(crops(1, 1))
        assert started.wait(10)
        cancelled, kept = batcher.submit(crops(2, 1)), batcher.submit(crops(3, 1))
        assert cancelled.cancel()
        release.set()
        assert first.result(10)[:, 0].tolist() == [1]
        assert kept.result(10)[:, 0].tolist() == [3]
        assert calls == [[1], [3]]  # the cancelled job's rows were never run
    finally:
        batcher.close()


def test_a_job_alone_in_its_batch_runs_on_its_own_rows_not_a_copy():
    """The model host runs a lone job on the worker's rows in shared memory, in place."""
    rows = crops(7, 2)
    seen = []
    batcher = MicroBatcher(lambda x: seen.append(x) or x[:, 0, 0, :1], max_batch=8, max_wait_ms=0, metrics=Metrics())
    try:
        assert batcher.submit(rows).result(10).tolist() == [[7], [7]]
        assert len(seen) == 1 and np.shares_memory(seen[0], rows)
    finally:
        batcher.close()
