"""`facegate bench cpu-budget` and the probe it installs in the server's processes: the regions
nest and count as they should, and the command prints a row for every stage and crossing of a
real `facegate serve --workers 2` with its model host (figures printed, never asserted)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest
import typer

from benchmarks import cpu_probe
from benchmarks.commands import register

app = typer.Typer()
register(app)


def rows_of(function_table: dict) -> dict[tuple[str, ...], list[int]]:
    return {path: list(row) for path, row in function_table.items()}


@pytest.fixture
def table():
    """This thread's probe table, emptied before and after the test."""
    found = cpu_probe._thread_table()
    found.clear()
    yield found
    found.clear()


def test_a_region_counts_its_calls_its_callees_and_its_bytes_under_its_callers_path(table):
    inner = cpu_probe.region("inner", lambda data: bytes(data), nbytes=lambda args, result: len(result))
    outer = cpu_probe.region("outer", lambda: [inner(b"abc"), inner(b"de")])
    outer()
    outer()
    rows = rows_of(table)
    assert set(rows) == {("outer",), ("outer", "inner")}
    assert rows["outer",][1:] == [2, 4, 0]  # 2 calls, 4 callee calls, no bytes of its own
    assert rows["outer", "inner"][1:] == [4, 0, 10]
    assert all(row[0] >= 0 for row in rows.values())


def test_a_failing_call_is_counted_and_its_caller_keeps_its_stack(table):
    def fail():
        raise ValueError("bad input")

    failing = cpu_probe.region("failing", fail, nbytes=lambda args, result: 1)
    with pytest.raises(ValueError):
        failing()
    cpu_probe.region("after", lambda: None)()
    assert set(rows_of(table)) == {("failing",), ("after",)}  # not ("failing", "after"): the stack was unwound
    assert table["failing",][1:] == [1, 0, 0]


def test_an_async_region_times_each_step_on_the_thread_that_runs_it(table):
    """Each resumption of the coroutine is a call; a sync region inside it nests under it; what it
    returns and raises gets through."""
    step = cpu_probe.region("step", lambda: None)

    async def work(n: int) -> int:
        for _ in range(n):
            step()
            await asyncio.sleep(0)
        return n

    async def broken() -> None:
        await asyncio.sleep(0)
        raise KeyError("x")

    timed, timed_broken = cpu_probe.async_region("work", work), cpu_probe.async_region("broken", broken)

    async def main():
        results = await asyncio.gather(timed(2), timed(3))
        with pytest.raises(KeyError):
            await timed_broken()
        return results

    assert asyncio.run(main()) == [2, 3]
    rows = rows_of(table)
    assert rows["work",][1] == 3 + 4  # steps: one per suspension of each call, and the last
    assert rows["work", "step"][1] == 5
    assert rows["broken",][1] == 2


def test_a_snapshot_has_every_thread_and_the_regions_by_thread(table):
    cpu_probe.region("here", lambda: None)()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (cpu_probe.region("there", lambda: None)(), done.wait(5)), name="probe-test_3")
    worker.start()
    try:
        snap = cpu_probe.snapshot()
    finally:
        done.set()
        worker.join()
    roles = {role for role, _ in snap["threads"].values()}
    assert {"MainThread", "probe-test"} <= roles
    regions = {(thread, tuple(path)) for thread, path, *_ in snap["regions"]}
    assert ("MainThread", ("here",)) in regions
    assert snap["process_ns"] > 0 and snap["pid"] > 0


def test_bench_cpu_budget_prints_every_stage_and_crossing(cli_env, test_data, monkeypatch):
    """A spawned `facegate serve --workers 2` with its model host, a few requests a route: a row for
    each stage in the worker, the decoder processes and the model host, and the copies. The
    server warms up only the shapes LFW's photos need (it starts sooner)."""
    for name, value in (("DETECT_SIZES", "[320]"), ("DETECT_BATCH_SIZES", "[1,2]"), ("BATCH_SIZES", "[1,2]")):
        monkeypatch.setenv(f"FACEGATE_{name}", value)
    images = [test_data / "lfw" / name / f"{name}_{n:04d}.jpg" for name, n in (("Aaron_Peirsol", 1), ("George_W_Bush", 7))]
    result = cli_env(app, "bench", "cpu-budget", *images, "--requests", "4", "--concurrency", "2", "--no-control")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "machine:" in out and "--workers 2 + model host" in out
    assert "/verify:" in out and "/identify:" in out and out.count("(200:4)") == 2, out
    budget = out[out.index("CPU per image") : out.index("process crossings")]
    for process in ("worker ×2", "decoder ×", "model host ×1"):
        assert process in budget, process
    for stage in (
        "HTTP data received",
        "multipart parse",
        "router (Starlette",
        "response validated, serialized",
        "decision",
        "gallery search",
        "probe round trip",
        "decode round trip",
        "pixels copied out",
        "letterbox",
        "detect post: NMS, faces",
        "align",
        "detect sent to the model host",
        "embed sent to the model host",
        "shared-memory copy",
        "decode (OpenCV)",
        "probe (header)",
        "detector batch",
        "detect post: candidates",
        "embedder batch",
        "embed pre: preprocess",
        "onnxruntime run",
        "answer sent",
        "answer from the model host",
        "(in no region)",
    ):
        assert stage in budget, stage
    crossings = out[out.index("process crossings") : out.index("bytes copied")]
    for crossing in ("worker → decoder process → worker", "worker → model host → worker", "event loop → thread pool → event loop"):
        assert crossing in crossings, crossing
    copies = out[out.index("bytes copied") : out.index("outside the models, largest first")]
    for copy in ("letterbox", "align", "shared-memory copy", "pixels copied out", "decode job", "detector batch", "embedder batch"):
        assert copy in copies, copy
    assert "onnxruntime run" not in out[out.index("outside the models, largest first") :]


def test_every_patch_of_the_probe_finds_what_it_wraps():
    """A patch naming a function the service no longer has (a method renamed or removed) fails the
    import of its module in every process of the benchmark's server: applied here to each module, in
    a process of its own (the patches replace the service's functions)."""
    apply_all = (
        "import importlib\n"
        "from benchmarks import cpu_probe\n"
        "for patches in (cpu_probe.ROLE_PATCHES, cpu_probe.PATCHES):\n"
        "    for name, patch in patches.items():\n"
        "        patch(importlib.import_module(name))\n"
    )
    done = subprocess.run([sys.executable, "-c", apply_all], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
