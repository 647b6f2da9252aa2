"""Decoding in worker processes (issue 34): the same pixels and the same typed errors as decoding in
place, and what no header can tell bounded the same way for every format — a decode past its CPU
deadline or memory limit is a 4xx and its worker is replaced, a cancelled caller stops its worker at
once, and a worker that dies takes only its image with it (a 503, or 413 where its memory ran out)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import cv2
import numpy as np
import pytest
from PIL import Image

from service.core.decode import decode_image, probe
from service.core.errors import DecoderFailed, ImageTooComplex, ImageTooLarge, ImageTooSmall, InvalidImage
from service.core.settings import Settings
from service.runtime.decode_workers import DecodeCancelled, DecodeWorkers
from tests.conftest import REPO
from tests.jpeg_bombs import many_scans, separate_scans
from tests.polling import wait_until
from tests.requirements import need

LIMITS = (10_000_000, 40_000_000, 16, 4000)
SLOW = many_scans(9000, 9000, 99)  # under the scan cap; about a second of CPU on a 2-core VM (6000² took 0.4 s there)
SLOW_LIMITS = (LIMITS[0], 100_000_000, *LIMITS[2:])  # room for its 81 MP


def _photo(width: int = 320, height: int = 240) -> np.ndarray:
    rng = np.random.default_rng(7)
    return cv2.GaussianBlur(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), (5, 5), 0)


def _encoded() -> dict[str, bytes]:
    image = _photo()
    found = {ext: cv2.imencode(ext, image)[1].tobytes() for ext in (".jpg", ".png", ".webp", ".bmp", ".tiff")}
    out = io.BytesIO()
    Image.fromarray(image[..., ::-1]).save(out, "JPEG", progressive=True)
    found["progressive"] = out.getvalue()
    out = io.BytesIO()
    Image.fromarray(image[..., ::-1]).save(out, "GIF")
    found[".gif"] = out.getvalue()
    return found


@pytest.fixture(scope="module")
def workers():
    pool = DecodeWorkers(2, 1024, 30.0, *LIMITS[:2])
    yield pool
    pool.close()


@contextmanager
def one_worker(memory_mb: int = 1024, timeout: float = 60.0):
    """A pool of one worker, started, closed at the end of the block."""
    pool = DecodeWorkers(1, memory_mb, timeout, *SLOW_LIMITS[:2])
    try:
        pool.start()
        yield pool
    finally:
        pool.close()


def _worker_pids(pool: DecodeWorkers) -> set[int]:
    return {w.process.pid for w in pool._workers}


@pytest.mark.parametrize("name, data", list(_encoded().items()))
def test_the_same_pixels_and_probe_as_in_place(workers, name, data):
    assert workers.probe(data, *LIMITS) == probe(data, *LIMITS)
    assert np.array_equal(workers.decode(data, *LIMITS), decode_image(data, *LIMITS))


@pytest.mark.parametrize(
    "data, error",
    [
        (b"", InvalidImage),
        (b"not an image at all" * 50, InvalidImage),
        (cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))[1].tobytes(), ImageTooSmall),
        (separate_scans(16000, 11000), ImageTooLarge),
        (many_scans(4000, 4000, 1000), ImageTooComplex),
        (b"\xff" * (LIMITS[0] + 1), ImageTooLarge),
    ],
)
def test_typed_errors_come_back_and_the_worker_stays(workers, data, error):
    workers.start()  # at least one worker in the pool, whichever tests ran before
    before = _worker_pids(workers)
    with pytest.raises(error):
        workers.decode(data, *LIMITS)
    assert before and before <= _worker_pids(workers)  # an answered error kills no worker: every one still in the pool
    assert all(w.process.is_alive() for w in workers._workers)
    assert workers.decode(_encoded()[".png"], *LIMITS).shape == (240, 320, 3)


def test_a_decode_past_its_cpu_deadline_is_stopped_and_its_worker_replaced():
    with one_worker(timeout=0.3) as pool:
        (first,) = _worker_pids(pool)
        with pytest.raises(ImageTooComplex, match="FACEGATE_DECODE_TIMEOUT"):
            pool.decode(SLOW, *SLOW_LIMITS)
        assert first not in _worker_pids(pool)
        assert pool.decode(_encoded()[".jpg"], *LIMITS).shape == (240, 320, 3)  # a fresh worker took the slot


def _rotated_jpeg(side: int) -> bytes:
    """A JPEG with EXIF orientation 6: OpenCV decodes it, then rotates it into a second buffer, a
    cost its header does not show."""
    image = Image.fromarray(np.tile(np.arange(side, dtype=np.uint8)[:, None, None], (1, side, 3)))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes(), quality=50)
    return out.getvalue()


def test_a_decode_whose_known_cost_exceeds_the_memory_limit_is_refused_before_decoding():
    """6000×6000 in separate scans: 216 MB of coefficients and 108 MB of pixels, past a 128 MB limit."""
    with one_worker(memory_mb=128) as pool, pytest.raises(ImageTooLarge, match="needs at least 324 MB; FACEGATE_DECODE_MEMORY_MB is 128"):
        pool.decode(separate_scans(6000, 6000), *LIMITS)


def test_a_decode_past_the_memory_limit_fails_in_its_worker_only():
    """3650×3650 (40 MB of pixels, under a 64 MB limit) rotated by EXIF: the rotation's second 40 MB
    is refused by the worker's RLIMIT_DATA; a larger limit decodes it."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "the memory limit is RLIMIT_DATA, enforced on Linux")
    data = _rotated_jpeg(3650)
    with one_worker(memory_mb=64) as pool:
        with pytest.raises(ImageTooLarge, match="more than FACEGATE_DECODE_MEMORY_MB"):
            pool.decode(data, *LIMITS)
        assert pool.decode(_encoded()[".png"], *LIMITS).shape == (240, 320, 3)
    with one_worker(memory_mb=256) as roomy:
        assert roomy.decode(data, *LIMITS).shape == (3650, 3650, 3)


def test_a_cancelled_caller_stops_its_worker_at_once():
    with one_worker() as pool:
        (worker,) = pool._workers
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(DecodeCancelled):
            pool.decode(SLOW, *SLOW_LIMITS, cancel=cancel)
        assert time.monotonic() - started < 0.2 + 2.0  # much less than the decode alone would take under load
        assert not worker.process.is_alive()
        assert pool.decode(_encoded()[".jpg"], *LIMITS).shape == (240, 320, 3)


def _kill_once_grown(worker, grown: int) -> None:
    """SIGKILL a worker once its pool has seen its heap grow `grown` bytes, as a decoder crash or the OOM killer would."""
    wait_until(lambda: worker.peak - worker.idle > grown, "the decoder's heap grew", timeout=60, step=0.01)
    os.kill(worker.process.pid, signal.SIGKILL)


def test_a_worker_that_dies_takes_only_its_image_and_answers_a_server_fault():
    """Issue 45 (N6): a decoder killed mid-decode was a 400 invalid_image, the client blamed; its heap
    (405 MB for SLOW) well within its 1024 MB limit, it is a 503 decoder_failed with Retry-After."""
    with one_worker() as pool:
        (worker,) = pool._workers
        threading.Thread(target=_kill_once_grown, args=(worker, 100_000_000)).start()
        with pytest.raises(DecoderFailed, match="decoder process died") as died:
            pool.decode(SLOW, *SLOW_LIMITS)
        assert died.value.status == 503 and died.value.retry_after > 0
        assert pool.decode(_encoded()[".jpg"], *LIMITS).shape == (240, 320, 3)


def test_a_worker_that_dies_with_its_heap_past_half_its_limit_answers_image_too_large():
    """The same death with the heap past half of a 512 MB limit: the image's size is the likely cause, 413."""
    if not sys.platform.startswith("linux"):
        need("LINUX_ROOT", "the heap is read from /proc (Linux)")
    with one_worker(memory_mb=512) as pool:
        (worker,) = pool._workers
        threading.Thread(target=_kill_once_grown, args=(worker, 300_000_000)).start()
        with pytest.raises(ImageTooLarge, match="ran out"):
            pool.decode(SLOW, *SLOW_LIMITS)


def test_workers_start_on_demand_up_to_the_pool_size(workers):
    results = []
    threads = [threading.Thread(target=lambda: results.append(workers.decode(_encoded()[".png"], *LIMITS).shape)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(240, 320, 3)] * 6 and 1 <= len(workers._workers) <= 2


def test_the_decoders_import_only_what_decoding_needs():
    """Each worker's decoder forkserver preloads this module: pydantic and the settings (about 13 MB
    of heap in each decoder process, docs/benchmarks.md "A worker's memory") stay out of it."""
    code = "import sys, service.runtime.decode_workers; print(sorted(m for m in ('pydantic', 'service.core.settings') if m in sys.modules))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert found.stdout.strip() == "[]", found.stdout


def test_a_worker_at_rest_gives_back_the_heap_its_last_images_freed():
    """A photo's pixels freed stay in glibc's heap below twice the largest freed (a big photo, then a
    smaller one, kept the smaller's megabytes), until the pool at rest asks the kept worker to trim."""
    pool = DecodeWorkers(1, 1024, 30.0, *LIMITS[:2])
    try:
        for width, height in ((3000, 2000), (2800, 1900)):  # the first raises glibc's thresholds, the second stays in its heap
            assert pool.decode(cv2.imencode(".jpg", _photo(width, height))[1].tobytes(), *LIMITS[:3], 0).shape == (height, width, 3)
        (worker,) = pool._workers

        def resident() -> int:
            """Its private memory, MiB (RssAnon: not the shared buffer, which `give_back` empties too)."""
            with open(f"/proc/{worker.process.pid}/status") as status:
                return next(int(line.split()[1]) for line in status if line.startswith("RssAnon:")) >> 10

        held = resident()
        pool.give_back()
        assert held - resident() >= 12, (held, resident())
        assert pool._workers == {worker} and worker.process.is_alive()
    finally:
        pool.close()


def _buffers_resident_mib() -> float:
    """This process's resident pages of the decoders' shared buffers (memfds), in MiB."""
    resident, mapping = 0, ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                mapping = " ".join(fields[5:])
            elif fields[0] == "Rss:" and "facegate-decode" in mapping:
                resident += int(fields[1])
    return resident / 1024


def test_a_worker_of_several_keeps_no_decoder_at_rest_and_decodes_as_before(tmp_path):
    """Under `facegate serve --workers N` each worker's pool stops every decoder at rest (N workers
    would keep N); the next image starts one again and decodes the same. One process keeps one."""
    several = Settings(ready_workers_dir=tmp_path, workers=3, worker_threads=2)
    assert DecodeWorkers.for_settings(Settings(worker_threads=2)).keep_one
    pool = DecodeWorkers.for_settings(several)
    try:
        assert not pool.keep_one
        data = cv2.imencode(".png", _photo())[1].tobytes()
        decoded = pool.decode(data, *LIMITS[:3], 0)
        (worker,) = pool._workers
        pool.give_back()
        assert pool._workers == set() and not worker.process.is_alive()
        assert np.array_equal(pool.decode(data, *LIMITS[:3], 0), decoded)
        assert len(pool._workers) == 1 and pool._workers != {worker}
    finally:
        pool.close()


def test_at_rest_one_worker_is_kept_its_buffer_emptied_and_decodes_as_before():
    """A worker keeps its buffer's pages for the next image (up to KEEP_RESIDENT); `give_back` (run
    when the process is idle) stops every idle worker but the last used and empties its buffer; the
    next decode is the same, and a burst starts the others again."""
    pool = DecodeWorkers(2, 1024, 30.0, *LIMITS[:2])
    try:
        first, second = pool._checkout(None), pool._checkout(None)  # both slots' workers started
        pool._checkin(first)
        pool._checkin(second)
        data = cv2.imencode(".png", _photo(2000, 1500))[1].tobytes()
        decoded = pool.decode(data, *LIMITS[:3], 0)  # by the last used, `second`
        assert _buffers_resident_mib() >= 8  # 9 MB of pixels, kept
        pool.give_back()
        assert _buffers_resident_mib() < 1
        assert pool._workers == {second} and not first.process.is_alive()
        assert np.array_equal(pool.decode(data, *LIMITS[:3], 0), decoded)
        assert pool._workers == {second}  # the same worker again, its slot back in place
        results = []
        threads = [threading.Thread(target=lambda: results.append(pool.decode(data, *LIMITS[:3], 0).shape)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [decoded.shape] * 4 and 1 <= len(pool._workers) <= 2
    finally:
        pool.close()
