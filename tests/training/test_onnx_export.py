"""Offline export: a single-file ONNX with fixed names and a dynamic batch, a parity check that
fails loudly, a manifest the service loads unchanged."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from service.core.fileio import sha256_file
from service.core.models.files import load_model
from service.core.models.manifest import Manifest
from service.core.settings import get_settings
from tests.training.tiny import tiny_config, write_aligned_folders
from training.backbones import build_backbone
from training.data.preprocess import to_input
from training.onnx_export import ExportError, check_parity, export, parity_crops
from training.trainer import Trainer

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    data = write_aligned_folders(root / "data")
    Trainer(tiny_config(data, root / "run", steps=2), get_settings()).run(progress=False)
    return root / "run" / "last.pt"


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny-face.onnx"
    manifest = export(checkpoint, out, get_settings(), license={"name": "test", "terms": "research, non-commercial"})
    return out, manifest


def test_single_file_fixed_names_dynamic_batch(exported):
    out, _ = exported
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny-face.json", "tiny-face.onnx"]
    model = onnx.load(str(out))
    assert model.opset_import[0].version >= 17
    (inp,), (outp,) = model.graph.input, model.graph.output
    assert inp.name == "input" and outp.name == "embedding"
    assert inp.type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim[1:]] == [112, 112, 3]  # uint8 NHWC by default
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8


def test_manifest(exported, checkpoint):
    out, manifest = exported
    saved = Manifest.load(out.with_suffix(".json"))
    assert saved == manifest
    assert saved.name == "tiny-face" and saved.task == "embedder" and saved.alignment == "arcface_112"
    assert saved.file.sha256 == sha256_file(out) and saved.embedding_dim == 32
    assert saved.input.mean == [127.5] * 3 and saved.input.std == [127.5] * 3 and saved.input.color == "RGB"
    assert (saved.input.dtype, saved.input.layout, saved.input.shape) == ("uint8", "NHWC", ["batch", 112, 112, 3])
    assert saved.thresholds == {} and saved.license["terms"] == "research, non-commercial"
    p = saved.provenance
    assert p["head"]["name"] == "arcface" and p["step"] == 2 and p["checkpoint_sha256"] == sha256_file(checkpoint)
    assert p["export"]["parity_min_cosine"] >= 0.9999 and "git_commit" in p


def test_service_loads_it_and_embeds_like_torch(exported, checkpoint):
    from service.core.models.embedder import FaceEmbedder
    from training.checkpoint import load_backbone

    out, _ = exported
    loaded = load_model(str(out.with_suffix(".json")), out.parent, out.parent, device="cpu")
    embedder = FaceEmbedder(loaded.manifest, loaded.session)
    crops, _ = parity_crops(load_backbone(checkpoint, get_settings())[1], 5)
    got = embedder.embed(crops)
    backbone = load_backbone(checkpoint, get_settings())[0]
    with torch.no_grad():
        want = torch.nn.functional.normalize(backbone(torch.from_numpy(to_input(crops))), dim=1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_parity_failure_is_loud(exported, checkpoint):
    from training.checkpoint import load_backbone

    out, _ = exported
    backbone, config, _ = load_backbone(checkpoint, get_settings())
    crops, _ = parity_crops(config, 4)
    other = build_backbone("mobilefacenet", 32, blocks=(1, 1, 1, 1), width=0.25).eval()  # not the exported weights
    with pytest.raises(ExportError, match="parity"):
        check_parity(other, out, crops, fp16=False, input_format="uint8_nhwc")
    assert check_parity(backbone, out, crops, fp16=False, input_format="uint8_nhwc") >= 0.9999


def test_refuses_low_opset_and_leaves_nothing(checkpoint, tmp_path):
    with pytest.raises(ExportError, match="opset"):
        export(checkpoint, tmp_path / "m.onnx", get_settings(), opset=13)
    assert list(tmp_path.iterdir()) == []


def _service_embedder(manifest_path):
    from service.core.models.embedder import FaceEmbedder

    loaded = load_model(str(manifest_path), manifest_path.parent, manifest_path.parent, device="cpu")
    return FaceEmbedder(loaded.manifest, loaded.session)


def test_older_float32_nchw_form_embeds_like_the_in_graph_form(exported, checkpoint, tmp_path):
    """`--input-format float32_nchw`: the service normalizes in numpy; the embeddings are the
    default export's (in-graph preprocessing) to 1e-5."""
    from training.checkpoint import load_backbone

    out, _ = exported
    manifest = export(checkpoint, tmp_path / "nchw.onnx", get_settings(), input_format="float32_nchw")
    assert (manifest.input.dtype, manifest.input.shape) == ("float32", ["batch", 3, 112, 112])
    assert onnx.load(str(tmp_path / "nchw.onnx")).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    crops, _ = parity_crops(load_backbone(checkpoint, get_settings())[1], 16)
    numpy_path = _service_embedder(tmp_path / "nchw.json").embed(crops)
    in_graph = _service_embedder(out.with_suffix(".json")).embed(crops)
    assert np.abs(numpy_path - in_graph).max() <= 1e-5
    with pytest.raises(ExportError, match="input format"):
        export(checkpoint, tmp_path / "bad.onnx", get_settings(), input_format="float16_nhwc")


def test_fp16_export_keeps_uint8_input_float32_output_and_serves(exported, checkpoint, tmp_path):
    from training.checkpoint import load_backbone

    out, _ = exported
    manifest = export(checkpoint, tmp_path / "half.onnx", get_settings(), fp16=True)
    export_info = manifest.provenance["export"]
    assert export_info["fp16"] and export_info["dtype"] == "float16" and export_info["parity_min_cosine"] >= 0.999
    model = onnx.load(str(tmp_path / "half.onnx"))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)  # the weights are half
    crops, _ = parity_crops(load_backbone(checkpoint, get_settings())[1], 16)
    half = _service_embedder(tmp_path / "half.json").embed(crops)
    full = _service_embedder(out.with_suffix(".json")).embed(crops)
    assert half.dtype == np.float32 and np.sum(half * full, axis=1).min() >= 0.999
    assert np.abs(half - full).max() > 0  # really another arithmetic


def test_flip_tta_export_embeds_crop_plus_mirror(checkpoint, tmp_path):
    import onnxruntime as ort

    from training.checkpoint import load_backbone

    manifest = export(
        checkpoint, tmp_path / "tta.onnx", get_settings(), flip_tta=True, input_format="float32_nchw"
    )  # fed float inputs below
    assert manifest.provenance["export"]["flip_tta"] and manifest.provenance["export"]["parity_min_cosine"] >= 0.9999
    backbone = load_backbone(checkpoint, get_settings())[0]
    x = np.random.default_rng(0).uniform(-1, 1, (3, 3, 112, 112)).astype(np.float32)
    x[:, :, :, :56] = 1.0  # left half bright: the mirror is a different input
    with torch.no_grad():
        want = (backbone(torch.from_numpy(x)) + backbone(torch.from_numpy(x).flip(3))).numpy()
        plain = backbone(torch.from_numpy(x)).numpy()
    got = ort.InferenceSession(str(tmp_path / "tta.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    error = np.abs(got - want).max()
    assert error < 1e-4 * np.abs(want).max()
    assert np.abs(got - 2 * plain).max() > 100 * error
