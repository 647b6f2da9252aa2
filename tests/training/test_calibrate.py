"""Calibration (training/calibrate.py): thresholds recovered from synthetic impostor scores and the
omission rule for FARs the pair count cannot support."""

from __future__ import annotations

import numpy as np
import pytest

from training.calibrate import MIN_FALSE_ACCEPTS, calibrate_scores, pair_scores, threshold_for_far


def test_exact_thresholds_on_a_known_score_set():
    # 100,000 distinct impostor scores 0, 1e-5, …, 0.99999, shuffled: FAR f accepts exactly the top f·N
    rng = np.random.default_rng(0)
    impostor = rng.permutation(np.arange(100_000) / 100_000)
    genuine = np.array([0.95, 0.9950, 0.9990, 0.99995])
    result = calibrate_scores(genuine, impostor)
    assert result.thresholds == {"1e-2": 0.989991, "1e-3": 0.998991, "1e-4": 0.999891}
    for key, accepted in (("1e-2", 1000), ("1e-3", 100), ("1e-4", 10)):
        assert (impostor >= result.thresholds[key]).sum() == accepted
        assert result.realized[key]["far"] == pytest.approx(accepted / 100_000)
    assert [result.realized[k]["tar"] for k in ("1e-2", "1e-3", "1e-4")] == [0.75, 0.5, 0.25]
    # 1e-5 would rest on a single impostor pair
    assert "1e-5" not in result.thresholds and "1,000,000" in result.omitted["1e-5"]


def test_recovers_the_quantiles_of_a_known_distribution():
    # impostor cosines ~ N(0.1, 0.08): the FAR-f threshold is the (1-f) quantile 0.1 + 0.08·z
    rng = np.random.default_rng(1)
    impostor = rng.normal(0.1, 0.08, size=2_000_000)
    result = calibrate_scores(np.array([]), impostor)
    for key, z in (("1e-2", 2.3263), ("1e-3", 3.0902), ("1e-4", 3.7190), ("1e-5", 4.2649)):
        assert result.thresholds[key] == pytest.approx(0.1 + 0.08 * z, abs=0.006 if key == "1e-5" else 0.003), key
        assert result.realized[key]["far"] <= float(key) and result.realized[key]["tar"] is None
    assert result.omitted == {}


def test_ties_never_push_the_realized_far_over_the_target():
    impostor = np.concatenate([np.full(50, 0.7), np.linspace(0, 0.5, 950)])  # 50 tied at the top
    t = threshold_for_far(impostor, 1e-2)  # allows 10 of 1000: all 50 ties must be rejected
    assert t > 0.7 and (impostor >= t).sum() == 0
    assert threshold_for_far(np.linspace(0, 1, MIN_FALSE_ACCEPTS * 100 - 1), 1e-2) is None


def test_pair_scores_split_genuine_and_impostor():
    e = np.eye(4, dtype=np.float32)[[0, 0, 1, 2]]
    genuine, impostor = pair_scores(e, np.array([7, 7, 8, 9]))
    assert genuine.tolist() == [1.0] and sorted(impostor.tolist()) == [0.0] * 5
