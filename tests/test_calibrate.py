"""`facegate calibrate`: thresholds recovered from synthetic impostor scores, the omission rule for
FARs the pair count cannot support, and the command writing a manifest the service still accepts."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from service.manifest import Manifest
from service.model_store import load_model
from tests.onnx_models import write_test_embedder
from training.calibrate import MIN_FALSE_ACCEPTS, calibrate_scores, pair_scores, threshold_for_far
from training.cli import register

app = typer.Typer()
register(app)


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


def aligned_folder(root, identities: int, per_identity: int):
    """Identity folders of 112×112 crops: each identity a random base image plus small noise."""
    rng = np.random.default_rng(0)
    for k in range(identities):
        base = cv2.resize(rng.integers(0, 256, (8, 8, 3)).astype(np.uint8), (112, 112), interpolation=cv2.INTER_CUBIC)
        folder = root / f"id{k:03d}"
        folder.mkdir(parents=True)
        for j in range(per_identity):
            noisy = np.clip(base.astype(int) + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
            cv2.imwrite(str(folder / f"{j}.png"), noisy)


def test_calibrate_command_writes_thresholds_the_service_loads(tmp_path):
    manifest_path = write_test_embedder(tmp_path / "models")
    aligned_folder(tmp_path / "heldout", identities=50, per_identity=2)  # 4,900 impostor pairs
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path), "--data", str(tmp_path / "heldout")])
    assert result.exit_code == 0, result.output
    manifest = Manifest.load(manifest_path)
    assert list(manifest.thresholds) == ["1e-2"]  # 49 false accepts allowed; 1e-3 would allow 4
    report = manifest.metrics["calibration"]
    assert report["impostor_pairs"] == 4900 and report["genuine_pairs"] == 50 and report["identities"] == 50
    assert set(report["omitted"]) == {"1e-3", "1e-4", "1e-5"}
    assert report["realized"]["1e-2"]["far"] <= 0.01
    # the model file is untouched, so the service still accepts it with its new thresholds
    loaded = load_model(str(manifest_path), manifest_path.parent, manifest_path.parent, device="cpu")
    assert loaded.manifest.thresholds == manifest.thresholds


def test_dry_run_changes_nothing_and_a_model_without_a_split_needs_data(tmp_path):
    manifest_path = write_test_embedder(tmp_path / "models")
    before = manifest_path.read_bytes()
    aligned_folder(tmp_path / "heldout", identities=50, per_identity=2)
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path), "--data", str(tmp_path / "heldout"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert manifest_path.read_bytes() == before
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path)])
    assert result.exit_code == 2 and "--data" in result.output
    assert json.loads(manifest_path.read_bytes()) == json.loads(before)
