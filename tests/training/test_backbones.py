"""Backbones: shapes, the registry, and parameter/FLOP counts against arcface_torch's figures."""

from __future__ import annotations

import pytest
import torch

from service.core.settings import get_settings
from training.backbones import build_backbone, model_info

torch.set_num_threads(2)


@pytest.mark.parametrize("name", ["iresnet18", "mobilefacenet"])
def test_embedding_shape_and_dim(name):
    model = build_backbone(name, embedding_dim=32)
    out = model(torch.randn(2, 3, 112, 112))  # train mode: BatchNorm needs a batch > 1
    assert out.shape == (2, 32)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 112, 112)).shape == (1, 32)


def test_iresnet_blocks_follow_insightface():
    from training.backbones.iresnet import IBasicBlock

    model = build_backbone("iresnet50")
    stages = [model.layer1, model.layer2, model.layer3, model.layer4]
    assert [len(s) for s in stages] == [3, 4, 14, 3]
    block = model.layer2[0]
    assert isinstance(block, IBasicBlock) and block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)
    assert model.fc.in_features == 512 * 7 * 7 and not model.features.weight.requires_grad


@pytest.mark.parametrize(
    "name, params_m, gflops",
    # arcface_torch: r50 43.6M / 6.3 GFLOPs, r100 65.2M / 12.1 GFLOPs, mbf 0.45 GFLOPs
    [("iresnet50", 43.6, 6.3), ("iresnet100", 65.2, 12.1), ("mobilefacenet", 2.06, 0.45)],
)
def test_counts_match_arcface_torch(name, params_m, gflops):
    info = model_info(name, get_settings())
    assert info.params / 1e6 == pytest.approx(params_m, rel=0.01)
    assert info.gmacs == pytest.approx(gflops, rel=0.04)


def test_mobilefacenet_downsampled_input_costs_a_quarter():
    model = build_backbone("mobilefacenet", 128, downsample=2).eval()
    gdc = model.features[0][0]
    assert gdc.kernel_size == (4, 4)  # 112 → 56 → 28, 14, 7, 4: the GDC covers the whole 4×4 map
    with torch.no_grad():
        assert model(torch.randn(2, 3, 112, 112)).shape == (2, 128)  # the input stays 112×112
    full, small = model_info("mobilefacenet", get_settings()), model_info("mobilefacenet", get_settings(), downsample=2)
    assert small.gmacs / full.gmacs == pytest.approx(0.25, abs=0.02)
    assert small.params < full.params  # the GDC kernel shrinks from 7×7 to 4×4


def test_unknown_backbone():
    with pytest.raises(ValueError, match="mobilefacenet"):
        build_backbone("resnet9000")
