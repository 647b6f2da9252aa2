"""benchmarks/open_set_guard.py's approximate searches, swapped into the guard's build in place of
the exact one (`--search`), are what they claim: scanning every list or cluster they find the
exact guard's lists, so the thresholds `--search compare` prints differ by what they skip only;
and the service's exact search is back in place after each build."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from benchmarks import open_set_guard
from service.core import open_set


@pytest.mark.parametrize("search", ["ivf", "clustered"])
def test_an_approximate_search_scanning_everything_builds_the_exact_guard(search):
    args = argparse.Namespace(probed=1.0, exact=True)
    vectors, subjects = open_set_guard.gallery(2000, 32, "realistic", 300)
    exact, _ = open_set_guard.built(2000, args, "exact", vectors, subjects)
    approximate, _ = open_set_guard.built(2000, args, search, vectors, subjects)
    assert open_set._nearest is open_set_guard.NEAREST
    assert np.allclose(approximate._top[:2000], exact._top[:2000], atol=1e-5)
    assert np.array_equal(approximate._top_subject[:2000], exact._top_subject[:2000])
    narrow, _ = open_set_guard.built(2000, argparse.Namespace(probed=0.05, exact=True), search, vectors, subjects)
    assert not np.allclose(narrow._top[:2000], exact._top[:2000], atol=1e-5)  # scanning less misses some
