"""Verification metrics from pair scores (training/verification.py)."""

from __future__ import annotations

import numpy as np
import pytest

from training.verification import at_thresholds, best_threshold, kfold_accuracy, verification_metrics


def test_perfectly_separated_scores():
    scores = np.array([0.9, 0.8, 0.7, 0.1, 0.2, 0.0] * 10)
    issame = np.array([1, 1, 1, 0, 0, 0] * 10, bool)
    m = verification_metrics(scores, issame, np.repeat(np.arange(10), 6))
    assert m["accuracy"] == 1.0 and m["accuracy_std"] == 0.0 and m["auc"] == 1.0 and m["eer"] == 0.0
    assert m["tar_at_far"] == {"1e-2": 1.0, "1e-3": 1.0, "1e-4": 1.0, "1e-5": 1.0}
    assert 0.2 < m["threshold"] < 0.7


def test_threshold_comes_from_the_other_folds():
    # fold 0 alone would pick a threshold between 0.5 and 0.6; the other folds say 0.35
    scores = np.array([0.6, 0.5, 0.4, 0.3, 0.4, 0.3])
    issame = np.array([1, 0, 1, 0, 1, 0], bool)
    folds = np.array([0, 0, 1, 1, 2, 2])
    mean, _, thresholds = kfold_accuracy(scores, issame, folds)
    assert thresholds[0] == pytest.approx(0.35)
    assert mean == pytest.approx((0.5 + 1 + 1) / 3)
    assert best_threshold(scores, issame) == pytest.approx(0.35)


def test_eer_and_tar_on_overlapping_scores():
    rng = np.random.default_rng(0)
    same, diff = rng.normal(0.6, 0.1, 5000), rng.normal(0.2, 0.1, 5000)
    scores, issame = np.concatenate([same, diff]), np.r_[np.ones(5000, bool), np.zeros(5000, bool)]
    m = verification_metrics(scores, issame, np.arange(10000) % 10)
    # two unit-variance-scaled normals 4σ apart: EER = Φ(−2) ≈ 0.0228
    assert m["eer"] == pytest.approx(0.0228, abs=0.004)
    # 5,000 impostor pairs resolve no FAR below 2e-4: at 1e-4 and 1e-5 no false accept is allowed
    assert m["tar_at_far"]["1e-2"] > m["tar_at_far"]["1e-3"] > m["tar_at_far"]["1e-4"] == m["tar_at_far"]["1e-5"]


def test_realized_far_and_tar_at_calibrated_thresholds():
    scores = np.array([0.9, 0.7, 0.5, 0.3] + [0.6, 0.4, 0.2, 0.1, 0.0])
    issame = np.array([1, 1, 1, 1] + [0, 0, 0, 0, 0], bool)
    got = at_thresholds(scores, issame, {"1e-3": 0.65, "1e-2": 0.45})
    assert list(got) == ["1e-2", "1e-3"]
    assert got["1e-2"] == {"threshold": 0.45, "far": 0.2, "false_accepts": 1, "impostor_pairs": 5, "tar": 0.75}
    assert got["1e-3"]["far"] == 0.0 and got["1e-3"]["tar"] == 0.5
