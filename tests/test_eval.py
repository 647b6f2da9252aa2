"""Verification metrics, the set loaders, and the same figures from a checkpoint and its export."""

from __future__ import annotations

import json
import pickle

import cv2
import numpy as np
import pytest
import torch

from tests.test_training_fixtures import tiny_config, write_aligned_folders
from training.train import Trainer
from training.evaluate import embed, evaluate, load_bin, load_embedder, read_lfw_pairs
from training.verification import at_thresholds, best_threshold, kfold_accuracy, verification_metrics

torch.set_num_threads(2)


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


def test_lfw_pairs_file(tmp_path):
    text = "2\t1\nA\t1\t2\nA\t1\tB\t1\nC\t3\t4\nC\t1\tD\t2\n"
    (tmp_path / "pairs.txt").write_text(text)
    pairs, issame, folds = read_lfw_pairs(tmp_path / "pairs.txt")
    assert pairs[1] == ("A", 1, "B", 1) and list(issame) == [True, False, True, False] and list(folds) == [0, 0, 1, 1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step checkpoint, its ONNX export, and a .bin verification set of aligned crops."""
    from training.export import export

    root = tmp_path_factory.mktemp("eval")
    data = write_aligned_folders(root / "data", identities=5, per_identity=4, seed=1)
    Trainer(tiny_config(data, root / "run", steps=2)).run(progress=False)
    export(root / "run" / "last.pt", root / "models" / "m.onnx")
    images = sorted(data.rglob("*.jpg"))
    rng = np.random.default_rng(0)
    bins, issame = [], []
    for k in range(40):
        a = images[rng.integers(len(images))]
        same = k % 2 == 0
        candidates = [p for p in images if (p.parent == a.parent) == same and p != a]
        b = candidates[rng.integers(len(candidates))]
        bins += [a.read_bytes(), b.read_bytes()]
        issame.append(same)
    with open(root / "set.bin", "wb") as fh:
        pickle.dump((bins, issame), fh)
    return root


def test_bin_loader(run):
    vset = load_bin(run / "set.bin")
    assert vset.crops.shape == (80, 112, 112, 3) and len(vset.pairs) == 40 and len(set(vset.folds)) == 10
    first = cv2.cvtColor(cv2.imread(str(sorted((run / "data").rglob("*.jpg"))[0])), cv2.COLOR_BGR2RGB)
    assert first.shape == vset.crops[0].shape


def test_checkpoint_and_export_give_the_same_figures(run, tmp_path):
    """The same embeddings to float noise, hence the same figures. On a set this small the scores
    sit within ~1e-5 of each other, where float noise can swap two pairs' order; so the scores are
    compared tightly and the figures to two pairs (identical on full LFW, 6,000 pairs)."""
    vset = load_bin(run / "set.bin")
    ckpt, kind_c = load_embedder(run / "run" / "last.pt")
    onnx, kind_o = load_embedder(run / "models" / "m.onnx")
    assert (kind_c, kind_o) == ("checkpoint", "onnx")
    for flip in (False, True):
        a, b = embed(ckpt, vset.crops, flip), embed(onnx, vset.crops, flip)
        np.testing.assert_allclose(a, b, atol=2e-5)
    a = evaluate(ckpt, vset, roc_png=tmp_path / "roc.png")
    b = evaluate(onnx, vset)
    two_pairs = 2 / len(vset.pairs) + 1e-9
    for key in ("no_flip", "flip"):
        assert a[key]["accuracy"] == pytest.approx(b[key]["accuracy"], abs=two_pairs)
        assert a[key]["auc"] == pytest.approx(b[key]["auc"], abs=two_pairs)
    assert a["flip"] != a["no_flip"]  # flip-TTA changes the embeddings
    assert (tmp_path / "roc.png").read_bytes()[:4] == b"\x89PNG"
    json.dumps(a)  # JSON-ready for scripts
