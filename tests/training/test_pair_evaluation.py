"""Evaluation (training/pair_evaluation.py): the set loaders, and the same figures from a checkpoint and its export."""

from __future__ import annotations

import json
import pickle

import cv2
import numpy as np
import pytest
import torch

from service.core.settings import get_settings
from tests.training.tiny import tiny_config, write_aligned_folders
from training.pair_evaluation import embed, evaluate, load_bin, load_embedder, read_lfw_pairs
from training.trainer import Trainer

torch.set_num_threads(2)


def test_lfw_pairs_file(tmp_path):
    text = "2\t1\nA\t1\t2\nA\t1\tB\t1\nC\t3\t4\nC\t1\tD\t2\n"
    (tmp_path / "pairs.txt").write_text(text)
    pairs, issame, folds = read_lfw_pairs(tmp_path / "pairs.txt")
    assert pairs[1] == ("A", 1, "B", 1) and list(issame) == [True, False, True, False] and list(folds) == [0, 0, 1, 1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-step checkpoint, its ONNX export, and a .bin verification set of aligned crops."""
    from training.onnx_export import export

    root = tmp_path_factory.mktemp("eval")
    data = write_aligned_folders(root / "data", identities=5, per_identity=4, seed=1)
    Trainer(tiny_config(data, root / "run", steps=2), get_settings()).run(progress=False)
    export(root / "run" / "last.pt", root / "models" / "m.onnx", get_settings())
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
    ckpt, kind_c = load_embedder(run / "run" / "last.pt", get_settings())
    onnx, kind_o = load_embedder(run / "models" / "m.onnx", get_settings())
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


def test_results_name_the_device_and_a_checkpoint_follows_the_asked_device(run, monkeypatch):
    """`facegate eval` moves a checkpoint's backbone to the device (CUDA when present under auto) and
    says in the results where it ran. On a CPU host the move is shown with torch's `meta` device."""
    import training.pair_evaluation as ev

    vset = load_bin(run / "set.bin")
    ckpt, _ = load_embedder(run / "run" / "last.pt", get_settings(), device="cpu")
    onnx, _ = load_embedder(run / "models" / "m.onnx", get_settings())
    assert evaluate(ckpt, vset)["device"] == "cpu" and evaluate(onnx, vset, progress=True)["device"] == "cpu"
    assert load_embedder(run / "run" / "last.pt", get_settings(), device="meta")[0].device == "meta"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ev.torch_device("auto") == "cuda" and ev.torch_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ev.torch_device("auto") == "cpu"


def test_an_export_is_run_on_the_services_provider_choice(run, monkeypatch):
    """No forced CPU provider: FACEGATE_DEVICE=cuda on a host without a GPU is the service's own
    start-up error, so on a GPU host the same call gets the CUDA provider."""
    from service.core.errors import ModelError
    from service.core.models.providers import select_providers
    from service.core.settings import get_settings

    monkeypatch.setenv("FACEGATE_DEVICE", "cuda")
    get_settings.cache_clear()
    try:
        if select_providers("cuda")[0] == "CUDAExecutionProvider":  # pragma: no cover - a GPU host
            assert load_embedder(run / "models" / "m.onnx", get_settings())[0].device == "cuda"
        else:
            pytest.fail("select_providers should have raised")
    except ModelError as exc:
        assert "no usable GPU" in str(exc)
        with pytest.raises(ModelError, match="no usable GPU"):
            load_embedder(run / "models" / "m.onnx", get_settings())
    finally:
        get_settings.cache_clear()
