"""The allocator's settings (service/runtime/heap.py), observed through glibc's own report of its
arenas (`malloc_info`), in a fresh interpreter each."""

from __future__ import annotations

import subprocess
import sys

from service.runtime import heap
from tests.conftest import REPO

ARENAS = """
import ctypes, sys, tempfile, threading
from service.runtime import heap, supervisor
if sys.argv[1] == "host":  # the model host's entry, its host module stood in for
    sys.modules["service.runtime.model_host"] = type(sys)("stand-in")
    sys.modules["service.runtime.model_host"].run_host = lambda folder: None
    supervisor.run_host("unused")
libc = ctypes.CDLL("libc.so.6")
together = threading.Barrier(7)
def allocate():
    libc.malloc(64)  # a thread's first malloc takes it an arena
    together.wait()
threads = [threading.Thread(target=allocate) for _ in range(6)]
for thread in threads: thread.start()
together.wait()
with tempfile.NamedTemporaryFile() as report:
    libc.fopen.restype = ctypes.c_void_p
    stream = ctypes.c_void_p(libc.fopen(report.name.encode(), b"w"))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(report.name).read().count("<heap nr="))
for thread in threads: thread.join()
"""


def arenas(mode: str) -> int:
    found = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, check=True, cwd=REPO)
    return int(found.stdout)


def test_the_model_hosts_threads_share_two_arenas():
    """Six threads allocating at once take arenas of their own in a plain process; in the model
    host's (`run_host` calls `heap.fewer_arenas` first) they share two."""
    assert arenas("plain") > 2
    assert arenas("host") <= 2


IDLE = """
import ctypes, sys, time
from service.runtime import heap
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident(): return int(open("/proc/self/statm").read().split()[1]) * 4096
libc.free(libc.malloc(20 << 20))  # mapped on its own, and freed: glibc's thresholds follow it (trim at 40 MiB)
idle = heap.IdleTrim(quiet=0.5)
idle.start()
block = libc.malloc(16 << 20)  # from the heap now
ctypes.memset(block, 1, 16 << 20)
idle.note()
libc.free(block)  # its pages stay in the heap: under the trim threshold
before = resident()
if sys.argv[1] == "busy":  # work noted every 0.05 s for 2 s: never a quiet period
    for _ in range(40):
        idle.note()
        time.sleep(0.05)
else:  # idle: given back within one or two periods (waited for up to 10 s on a loaded machine)
    deadline = time.monotonic() + 10
    while before - resident() < 14 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
print((before - resident()) >> 20)
idle.stop()
"""


def given_back(mode: str) -> int:
    """MiB of a freed 16 MiB block the process gave back while idle (`idle`) or working (`busy`)."""
    found = subprocess.run([sys.executable, "-c", IDLE, mode], capture_output=True, text=True, check=True, cwd=REPO)
    return int(found.stdout)


def test_the_heap_a_burst_freed_is_given_back_once_work_stops_and_not_while_it_goes_on():
    """glibc keeps a freed block under its trim threshold (which follows the largest block freed); the
    idle trim gives it back a quiet period after the last work, never while work is noted."""
    assert given_back("busy") < 2
    assert given_back("idle") >= 14


def test_a_quiet_period_of_0_never_trims():
    """FACEGATE_IDLE_TRIM_SECONDS=0: no trim thread at all."""
    idle = heap.IdleTrim(0)
    idle.start()
    assert idle._thread is None
    idle.stop()
