import json

import pytest

from service.core.errors import ModelError
from service.core.models.files import load_model
from service.core.models.manifest import Manifest, far_key
from tests.onnx_models import write_test_embedder


@pytest.mark.parametrize(
    "far, key", [(0.001, "1e-3"), ("1e-3", "1e-3"), ("0.0001", "1e-4"), (1e-5, "1e-5"), (0.01, "1e-2"), (0.05, "5e-2"), (0.1, "1e-1")]
)
def test_far_keys_are_canonical(far, key):
    assert far_key(far) == key


@pytest.mark.parametrize("far", [0, 1, -0.1, 2])
def test_far_outside_zero_one_is_rejected(far):
    with pytest.raises(ValueError):
        far_key(far)


def test_manifest_round_trip_and_threshold_lookup(tmp_path):
    path = write_test_embedder(tmp_path)
    manifest = Manifest.load(path)
    assert manifest.threshold(0.001) == manifest.threshold("1e-3") == 0.9
    with pytest.raises(KeyError):
        manifest.threshold(1e-4)
    manifest.save(tmp_path / "copy.json")
    assert Manifest.load(tmp_path / "copy.json") == manifest


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("license"), "license"),
        (lambda m: m.update(embedding_dim=None), "embedding_dim"),
        (lambda m: m.update(alignment="unknown"), "alignment"),
        (lambda m: m["input"].update(std=None), "mean and std"),
        (lambda m: m["file"].update(sha256="xyz"), "sha256"),
        (lambda m: m.update(surprise=1), "surprise"),
    ],
)
def test_invalid_manifests_are_refused_with_the_reason(tmp_path, change, message):
    path = write_test_embedder(tmp_path)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ModelError, match=message):
        Manifest.load(path)


def test_load_model_checks_file_and_io(tmp_path):
    path = write_test_embedder(tmp_path)
    loaded = load_model(str(path), tmp_path, tmp_path / "cache", device="cpu")
    assert loaded.manifest.embedding_dim == 64

    onnx_file = tmp_path / "test-embedder.onnx"
    original = onnx_file.read_bytes()
    onnx_file.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # same size, one bit off
    with pytest.raises(ModelError, match="sha256"):
        load_model(str(path), tmp_path, tmp_path / "cache", device="cpu")
    onnx_file.write_bytes(original + b"\0")
    with pytest.raises(ModelError, match="bytes"):
        load_model(str(path), tmp_path, tmp_path / "cache", device="cpu")
    onnx_file.write_bytes(original)

    data = json.loads(path.read_text())
    data["outputs"][0]["name"] = "features"
    path.write_text(json.dumps(data))
    with pytest.raises(ModelError, match="no output 'features'"):
        load_model(str(path), tmp_path, tmp_path / "cache", device="cpu")
    data["outputs"][0]["name"] = "embedding"
    data["input"]["shape"] = ["batch", 3, 96, 96]
    path.write_text(json.dumps(data))
    with pytest.raises(ModelError, match="input shape"):
        load_model(str(path), tmp_path, tmp_path / "cache", device="cpu")


def test_missing_model_file_names_the_fix(tmp_path):
    path = write_test_embedder(tmp_path)
    (tmp_path / "test-embedder.onnx").unlink()
    with pytest.raises(ModelError, match="missing"):
        load_model(str(path), tmp_path, tmp_path / "cache", device="cpu")


def test_shipped_detector_manifest_is_valid(model_cache):
    from service.core.settings import REPO_MODELS

    loaded = load_model("face_detection_yunet_2023mar", REPO_MODELS, model_cache, device="cpu")
    assert loaded.manifest.task == "detector"
    assert loaded.manifest.file.sha256 == "8f2383e4dd3cfbb4553ea8718107fc0423210dc964f9f4280604804ed2552fa4"
