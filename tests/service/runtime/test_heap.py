"""The allocator's settings (service/runtime/heap.py), observed through glibc's own report of its
arenas (`malloc_info`), in a fresh interpreter each."""

from __future__ import annotations

import subprocess
import sys

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
