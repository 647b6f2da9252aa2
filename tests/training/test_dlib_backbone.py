"""`backbone: dlib_resnet_v1`: the imported default embedder as a torch module, built from the same
`read_dat` description as its ONNX file: the same descriptors, its stages, a short fine-tune that
lowers the loss, and the prefix cache (scripts/cached_finetune.py) that trains its last stages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from service.core.settings import get_settings
from tests.training.tiny import tiny_config, write_aligned_folders
from training.backbones import build_backbone, stages
from training.data.preprocess import for_backbone

torch.set_num_threads(2)

DLIB = {"backbone": "dlib_resnet_v1", "embedding_dim": 128, "channels_last": False}


@pytest.fixture(scope="module")
def model(dlib_weights):
    return build_backbone("dlib_resnet_v1", 128, weights=str(dlib_weights)).eval()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_aligned_folders(tmp_path_factory.mktemp("aligned150"), size=150)


def _config(folder, out, weights, **overrides):
    cfg = tiny_config(folder, out, **DLIB, **overrides)
    return cfg.model_copy(update={"backbone_params": {"weights": str(weights)}})  # not merged with the tiny net's


@pytest.mark.data
def test_same_descriptors_as_the_imported_onnx_on_real_faces(model, dlib_model, pipeline_with, test_data):
    """LFW faces aligned by the service onto the dlib template: the module and the imported ONNX
    (run by the service) agree to 1e-5 per element, i.e. the same network and weights."""
    pipeline = pipeline_with("dlib-resnet-v1")
    chips = []
    for path in sorted((test_data / "lfw").glob("*/*_0001.jpg"))[:16]:
        image = pipeline.decode(path.read_bytes())
        faces = pipeline.detect(image)
        if faces:
            chips.append(pipeline.align(image, faces[:1])[0])
    chips = np.stack(chips)
    assert len(chips) >= 12 and for_backbone("dlib_resnet_v1", get_settings().models_dir).alignment == pipeline.embedder.manifest.alignment
    onnx = pipeline.embedder.raw(chips)
    with torch.no_grad():
        ours = model(torch.from_numpy(for_backbone("dlib_resnet_v1", get_settings().models_dir).to_input(chips))).numpy()
    assert np.abs(ours - onnx).max() <= 1e-5
    assert np.abs(onnx).max() > 0.05  # real descriptors, not zeros


def test_stages_prefix_and_refusals(model, dlib_weights):
    assert [len(s[0]) for s in stages(model)] == [4, 3, 4, 3, 3, 1]  # stem (conv, affine, relu, pool), then dlib's levels
    x = torch.from_numpy(
        for_backbone("dlib_resnet_v1", get_settings().models_dir).to_input(
            np.random.default_rng(0).integers(0, 256, (2, 150, 150, 3), np.uint8)
        )
    )
    with torch.no_grad():
        whole = model(x)
        for k in range(len(model.stages)):
            assert torch.allclose(model(model.prefix(x, k), start=k), whole, atol=1e-6)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())  # folded: no statistics
    with pytest.raises(ValueError, match="128"):
        build_backbone("dlib_resnet_v1", 512, weights=str(dlib_weights))


def _full_loss(trainer) -> float:
    """The head's loss over the whole tiny set, in eval mode (a step's batch loss is too noisy here)."""
    source, prep = trainer.dataset.source, trainer.preprocessing
    x = torch.from_numpy(prep.to_input(np.stack([source.load(i)[0] for i in range(len(source))])))
    trainer.backbone_module.eval()
    with torch.no_grad():
        return float(trainer.criterion_module(trainer.backbone_module(x), torch.from_numpy(source.labels)))


def test_short_finetune_lowers_the_loss_and_keeps_frozen_stages(data, dlib_weights, tmp_path):
    from training.trainer import Trainer

    cfg = _config(data, tmp_path, dlib_weights, steps=8, optim={"lr": 0.01}, finetune={"freeze_stages": 4, "backbone_lr_scale": 0.1})
    trainer = Trainer(cfg, get_settings())
    before = {k: v.clone() for k, v in trainer.backbone_module.state_dict().items()}
    loss_before = _full_loss(trainer)
    trainer.run(progress=False)
    after = trainer.backbone_module.state_dict()
    assert _full_loss(trainer) < 0.9 * loss_before  # deterministic (seeded, CPU): 4.75 → 3.61 here
    changed = {k.split(".")[1] for k in before if not torch.equal(before[k], after[k]) and k.startswith("stages.")}
    assert changed == {"4", "5"}  # only the unfrozen stages (and fc) moved


def test_prefix_cache_run_is_the_model_and_resumes(data, dlib_weights, tmp_path):
    from scripts.cached_finetune import CachedRun, build_cache
    from training.checkpoint import load_backbone
    from training.data.datasets import open_source
    from training.pair_evaluation import TorchEmbedder

    cfg = _config(
        data,
        tmp_path / "run",
        dlib_weights,
        steps=6,
        optim={"lr": 0.01},
        finetune={"freeze_stages": 4, "backbone_lr_scale": 0.1},
        data={"val_fraction": 0.5, "val_pairs": 8},
        checkpoint_every=3,
        val_every=3,
    )
    build_cache(cfg, get_settings(), tmp_path / "cache", chunk=5, progress=False)
    straight = CachedRun(cfg, get_settings(), tmp_path / "cache").run(tmp_path / "a", progress=False)
    first = CachedRun(cfg, get_settings(), tmp_path / "cache").run(tmp_path / "b", stop_at=3, progress=False)
    assert first["step"] == 3
    resumed = CachedRun(cfg, get_settings(), tmp_path / "cache")
    result = resumed.run(tmp_path / "b", progress=False)
    assert result["step"] == straight["step"] == 6
    a, b = (load_backbone(tmp_path / d / "last.pt", get_settings())[0].state_dict() for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)  # resumed bit for bit
    # the checkpoint is a whole backbone: embedding the crops gives what the run computes on its cache
    backbone, config, _ = load_backbone(tmp_path / "a" / "last.pt", get_settings())
    source = open_source(data, 150)
    crops = np.stack([source.load(i)[0] for i in range(len(source))])
    direct = TorchEmbedder(backbone, preprocessing=for_backbone("dlib_resnet_v1", get_settings().models_dir)).raw(crops)
    resumed.backbone.load_state_dict(backbone.state_dict())
    resumed.backbone.eval()
    with torch.no_grad():
        cached = resumed._forward(np.arange(len(source)), np.zeros(len(source), np.int64)).numpy()
    np.testing.assert_allclose(cached, direct, atol=1e-5)
    three = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"freeze_stages": 3})})
    with pytest.raises(ValueError, match="another prefix"):
        CachedRun(three, get_settings(), tmp_path / "cache")
    # a cache of more stages derived from one of fewer: the same activations as from the images
    build_cache(three, get_settings(), tmp_path / "cache3", progress=False)
    build_cache(cfg, get_settings(), tmp_path / "cache4", progress=False, from_cache=tmp_path / "cache3")
    np.testing.assert_allclose(np.load(tmp_path / "cache4" / "features.npy"), np.load(tmp_path / "cache" / "features.npy"), atol=1e-5)


def test_export_of_a_finetuned_dlib_names_the_base_model_and_both_licences(data, dlib_weights, tmp_path):
    from training.onnx_export import export
    from training.trainer import Trainer

    cfg = _config(data, tmp_path / "run", dlib_weights, steps=1, finetune={"freeze_stages": 5})
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"license": {"name": "TINY", "terms": "research use only"}})})
    Trainer(cfg, get_settings()).run(progress=False)
    manifest = export(tmp_path / "run" / "last.pt", tmp_path / "m" / "tuned.onnx", get_settings())
    assert manifest.alignment == "dlib_150" and manifest.input.height == 150 and manifest.embedding_dim == 128
    assert manifest.input.mean == for_backbone("dlib_resnet_v1", get_settings().models_dir).spec.mean and manifest.input.std == [256.0] * 3
    base = manifest.provenance["base_model"]
    assert base["name"] == "dlib-resnet-v1" and base["license"]["name"] == "CC0-1.0"
    assert "TINY" in manifest.license["name"] and "CC0-1.0" in manifest.license["name"]
    assert "research use only" in manifest.license["terms"]
    assert manifest.provenance["export"]["parity_min_cosine"] >= 0.9999
