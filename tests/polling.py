"""Waiting for a state, never for a time: on a loaded 2-core machine any fixed sleep is sometimes too
short (the test flakes) and otherwise too long (the suite crawls)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], what: str, timeout: float = 30.0, step: float = 0.05) -> T:
    """`predicate()`'s first true value, polled every `step` seconds; an AssertionError naming `what`
    once `timeout` seconds pass without one (the bound is generous: only a failure waits it out)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(step)
    return value
