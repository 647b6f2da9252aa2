"""The model host and a worker's side of it (`facegate serve --workers N`), in one process: the
host serves from a thread, the worker's engine sends its model runs there. A hosted engine finds
the faces and embeddings the in-process one finds, through shared memory, through the socket when
there is none or a run does not fit, and every block it used is free again afterwards."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import numpy as np
import pytest

from service.core.errors import ModelUnavailable
from service.core.pipeline import FacePipeline
from service.engine import Engine
from service.metrics import Metrics
from service.runtime import model_host, shm_arena
from service.runtime.hosted_models import HostedModels
from service.runtime.model_host import SOCKET, ModelHost
from service.runtime.shm_arena import BLOCK, Arena
from tests.polling import wait_until


@pytest.fixture
def host(settings, tmp_path):
    """A model host serving from a thread; yields its socket."""
    running = ModelHost(settings, tmp_path)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    yield tmp_path / SOCKET
    running.close()
    thread.join(10)


def hosted_engine(settings, socket, arena_bytes: int) -> tuple[Engine, HostedModels]:
    hosted = HostedModels(settings, socket, arena_bytes)
    engine = Engine(settings, FacePipeline(settings, hosted.model_set(settings)), Metrics(hosted_models=True), hosted)
    done: list = []
    engine.warm_up(done.append)
    assert done == [None]
    return engine, hosted


def faces_of(engine: Engine, images: list[bytes]) -> list:
    async def run():
        return await asyncio.gather(*(engine.faces(image, policy="all") for image in images))

    return asyncio.run(run())


@pytest.mark.data
@pytest.mark.parametrize("arena_bytes", [64 * 1024 * 1024, 0], ids=["shared-memory", "socket"])
def test_hosted_runs_find_what_local_runs_find(settings, host, pipeline, lfw_faces, two_faces_jpeg, arena_bytes):
    images = [photo for photos in lfw_faces.values() for photo in photos] + [two_faces_jpeg]
    local = Engine(settings, pipeline, Metrics())
    hosted_engine_, hosted = hosted_engine(settings, host, arena_bytes)
    try:
        expected, got = faces_of(local, images), faces_of(hosted_engine_, images)
        assert (hosted.arena is None) == (arena_bytes == 0)
        for mine, theirs in zip(expected, got, strict=True):
            assert len(mine) == len(theirs) >= 1
            for a, b in zip(mine, theirs, strict=True):
                assert np.allclose(a.face.box, b.face.box, atol=1e-3) and np.allclose(a.face.landmarks, b.face.landmarks, atol=1e-3)
                assert np.array_equal(a.crop, b.crop) and np.allclose(a.embedding, b.embedding, atol=1e-5)
        if hosted.arena is not None:  # every block back
            assert hosted.arena.allocate(hosted.arena.size) == 0
    finally:
        local.close()
        hosted_engine_.close()


def test_a_run_larger_than_the_arena_goes_through_the_socket(settings, host, pipeline):
    engine, hosted = hosted_engine(settings, host, 4 * 1024 * 1024)
    try:
        crops = np.random.default_rng(0).integers(0, 256, (300, *pipeline.require_embedder().size, 3), np.uint8)
        assert crops.nbytes > hosted.arena.size
        got = hosted.embed(crops).result(60)
        assert np.allclose(got, pipeline.require_embedder().embed(crops), atol=1e-5)  # this process's own session of the model
        assert hosted.arena.allocate(hosted.arena.size) == 0
    finally:
        engine.close()


def test_the_host_reports_its_model_runs_to_a_worker(settings, host):
    """The model-run metrics of a worker's /metrics are the host's (the models run there)."""
    engine, hosted = hosted_engine(settings, host, 0)
    try:
        crops = np.zeros((3, *engine.pipeline.require_embedder().size, 3), np.uint8)
        hosted.embed(crops).result(60)
        families = {f.name: f for f in hosted.ask("metrics").result(10)}
        embedded = [s.value for s in families["facegate_faces_embedded"].samples if s.name == "facegate_faces_embedded_total"]
        assert embedded and embedded[0] >= 3
    finally:
        engine.close()


def test_each_model_run_is_work_for_the_hosts_idle_trim_which_runs_while_it_serves(settings, tmp_path):
    running = ModelHost(settings, tmp_path)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    engine, hosted = hosted_engine(settings, tmp_path / SOCKET, 0)
    try:
        wait_until(lambda: running.idle._thread is not None and running.idle._thread.is_alive(), "the idle trim started")
        before = running.idle.work
        hosted.embed(np.zeros((2, *engine.pipeline.require_embedder().size, 3), np.uint8)).result(60)
        assert running.idle.work == before + 1
    finally:
        engine.close()
        running.close()
        thread.join(10)
    assert not running.idle._thread.is_alive()


def test_arena_blocks_are_allocated_contiguously_and_released(tmp_path):
    arena = Arena(tmp_path / "arena", 8 * BLOCK, create=True)
    a = arena.allocate(BLOCK + 1)  # two blocks
    b = arena.allocate(3 * BLOCK)
    assert (a, b) == (0, 2 * BLOCK)
    assert arena.allocate(4 * BLOCK) is None  # three blocks left
    arena.release(a, BLOCK + 1)
    assert arena.allocate(BLOCK) == 0
    rows = np.arange(1000, dtype=np.float32).reshape(10, 100)
    offset = arena.put(rows)
    assert np.array_equal(arena.view(offset, rows.shape, rows.dtype.str), rows)
    arena.close(unlink=True)
    assert not (tmp_path / "arena").exists()


def test_an_arena_shrinks_to_what_the_file_system_can_reserve(tmp_path, monkeypatch):
    """A /dev/shm too small (a container's 64 MB) gives a smaller arena, reserved in full, never a SIGBUS later."""
    real = shm_arena.os.posix_fallocate

    def small_disk(fd, offset, length):
        if length > 8 * 1024 * 1024:
            raise OSError(28, "No space left on device")
        real(fd, offset, length)

    monkeypatch.setattr(shm_arena.os, "posix_fallocate", small_disk)
    arena = Arena.reserve(tmp_path / "arena", 64 * 1024 * 1024)
    assert arena is not None and arena.size == 8 * 1024 * 1024
    arena.close(unlink=True)
    assert Arena.reserve(tmp_path / "none", 64 * 1024 * 1024, smallest=16 * 1024 * 1024) is None
    assert list(tmp_path.iterdir()) == []  # nothing left behind by the sizes that failed


def linked(settings, socket, arena_bytes: int = 0) -> HostedModels:
    """A worker's side that pings its host often, once the host answers warmed up."""
    hosted = HostedModels(settings, socket, arena_bytes, ping_every=0.05, ping_timeout=0.5)
    wait_until(lambda: hosted.problem() is None, "the host answers warmed up", timeout=60)
    return hosted


def test_a_worker_refuses_runs_at_once_while_its_host_is_down_and_goes_on_with_the_next(settings, tmp_path, pipeline):
    crops = np.zeros((2, *pipeline.require_embedder().size, 3), np.uint8)
    first = ModelHost(settings, tmp_path)
    threading.Thread(target=first.serve_forever, daemon=True).start()
    hosted = linked(settings, tmp_path / SOCKET, 4 * 1024 * 1024)
    try:
        first.close()  # every worker dropped, as the host's death drops them
        wait_until(lambda: "is down" in (hosted.problem() or ""), "the worker sees the host down")
        refused = hosted.embed(crops)
        assert refused.done()  # at once: nothing waits on a host known down
        with pytest.raises(ModelUnavailable, match="is down") as error:
            refused.result()
        assert error.value.retry_after == 1
        assert hosted.arena is not None and hosted.arena.allocate(hosted.arena.size) == 0  # nothing was copied in
        hosted.arena.release(0, hosted.arena.size)
        second = ModelHost(settings, tmp_path)  # what the supervisor starts next
        threading.Thread(target=second.serve_forever, daemon=True).start()
        try:
            wait_until(lambda: hosted.problem() is None, "the worker reconnected to the new host", timeout=60)
            assert np.allclose(hosted.embed(crops).result(60), pipeline.require_embedder().embed(crops), atol=1e-5)
        finally:
            second.close()
    finally:
        hosted.close()


def test_a_hung_host_is_seen_by_the_workers_pings_and_its_runs_refused_at_once(settings, host, pipeline, monkeypatch):
    hosted = linked(settings, host)
    try:
        monkeypatch.setattr(model_host._Worker, "_send", lambda self, message: None)  # the host answers nothing any more
        wait_until(lambda: "hung" in (hosted.problem() or ""), "the worker sees the host hung")
        refused = hosted.embed(np.zeros((1, *pipeline.require_embedder().size, 3), np.uint8))
        assert refused.done()
        with pytest.raises(ModelUnavailable, match="has not answered a ping"):
            refused.result()
        share = hosted.take("key a", 1, 10)  # a client's share is refused at once too, never left waiting on it
        assert share.done()
        with pytest.raises(ModelUnavailable, match="has not answered a ping"):
            share.result()
    finally:
        hosted.close()


def test_a_clients_share_is_counted_across_the_workers_and_a_worker_gone_gives_its_share_back(settings, host):
    """Issue 45 (N1 with --workers 4: +2.4 GB): each worker counted a client's pixels in flight on
    its own, so a client had the cap once per worker. The model host counts them for every worker;
    one that goes away gives back what it held."""
    first, second = linked(settings, host), linked(settings, host)
    try:
        cap = 64_000_000
        assert first.take("key a", 40_000_000, cap).result(10) is True
        assert second.take("key a", 40_000_000, cap).result(10) is False  # the same client through another worker
        assert second.take("address 10.0.0.1", 40_000_000, cap).result(10) is True  # another client
        # as a worker that dies: its end of the socket shut (close() alone waits for its own reader thread)
        socket.socket(fileno=os.dup(first._connection.fileno())).shutdown(socket.SHUT_RDWR)
        wait_until(lambda: second.take("key a", 40_000_000, cap).result(10), "the gone worker's share given back", timeout=10)
        second.give("key a", 40_000_000)
        second.give("key a", 40_000_000)  # more than it holds: nothing of another's is given back
        assert second.take("key a", 60_000_000, cap).result(10) is True
    finally:
        first.close()
        second.close()


def test_a_hosted_engine_counts_its_clients_in_the_host(settings, host):
    engine, hosted = hosted_engine(settings, host, 0)
    try:
        assert engine.lanes.shared is hosted
    finally:
        engine.close()
