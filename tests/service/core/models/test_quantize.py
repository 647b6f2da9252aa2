"""dlib-resnet-v1-int8, made on the user's machine from dlib's weights and the committed ranges: the
same bytes as the manifest pins, served by name, close to the float model on real faces, and
refused when its ranges or its onnxruntime differ from what made the pinned file.

Only the pinned bytes need the onnxruntime that made them (the `int8_cache` fixture: a skip, a
failure under FACEGATE_REQUIRE_PINNED_ONNXRUNTIME=1, which .ci/run sets); the cpu extra caps
onnxruntime at that version, so a fresh install gets it, and a release past it moves nothing until
the manifest is re-pinned together with the cap. The ranges and the refusals run on any version."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from service.core.errors import ModelError
from service.core.models import quantize
from service.core.models.files import pull
from service.core.models.manifest import Manifest
from tests.conftest import REPO, YUNET
from tests.requirements import need

MANIFEST = REPO / "models" / "dlib-resnet-v1-int8.json"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return Manifest.load(MANIFEST)


@pytest.fixture(scope="module")
def int8_cache(tmp_path_factory, dlib_model, dlib_weights, manifest):
    """A model cache with the float model, dlib's weights and the int8 file pulled from them."""
    pinned = manifest.file.source.quantization.onnxruntime
    if ort.__version__ != pinned:
        need("PINNED_ONNXRUNTIME", f"the int8 file's pinned bytes are onnxruntime {pinned}'s; this is {ort.__version__}")
    cache = tmp_path_factory.mktemp("int8-cache")
    for path in (REPO / "models" / YUNET, dlib_model, dlib_weights):
        (cache / path.name).symlink_to(path)
    pull(manifest, cache, manifest_dir=MANIFEST.parent)
    return cache


def test_the_cpu_extra_installs_the_pinned_onnxruntime(manifest):
    """A fresh install (CI's, the CPU image's) gets the version the int8 file's bytes are pinned to:
    the cpu extra caps onnxruntime there, and the two move together."""
    import tomllib

    (requirement,) = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    assert requirement.endswith(f",<={manifest.file.source.quantization.onnxruntime}"), requirement


def test_two_builds_give_the_pinned_bytes(int8_cache, manifest):
    rebuilt = quantize.int8_bytes(int8_cache / manifest.file.source.weights_name, manifest.file.source.quantization, MANIFEST.parent)
    assert len(rebuilt) == manifest.file.bytes and hashlib.sha256(rebuilt).hexdigest() == manifest.file.sha256
    assert rebuilt == (int8_cache / manifest.file.name).read_bytes()


@pytest.mark.data
def test_served_by_name_and_close_to_the_float_model(int8_cache, test_data, monkeypatch):
    from service.core.pipeline import FacePipeline
    from service.core.settings import Settings

    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(int8_cache))
    monkeypatch.setenv("FACEGATE_DEVICE", "cpu")
    monkeypatch.setenv("FACEGATE_EMBEDDER", "dlib-resnet-v1-int8")
    int8 = FacePipeline.from_settings(Settings())
    float32 = FacePipeline.from_settings(Settings(embedder="dlib-resnet-v1"))
    assert int8.embedder_model.manifest.name == "dlib-resnet-v1-int8"
    chips = []
    for path in sorted((test_data / "lfw").glob("*/*_0001.jpg"))[:16]:
        image = int8.decode(path.read_bytes())
        if faces := int8.detect(image):
            chips.append(int8.align(image, faces[:1])[0])
    assert len(chips) >= 12
    cosine = (int8.embedder.embed(np.stack(chips)) * float32.embedder.embed(np.stack(chips))).sum(axis=1)
    assert cosine.min() >= 0.99, cosine


def test_ranges_depend_on_the_sample_alone(dlib_weights, manifest, tmp_path):
    """What `facegate calibrate-int8` writes: the same crops give the same bytes, other crops others."""
    crops = np.random.default_rng(0).normal(0, 0.3, (3, 3, 150, 150)).astype(np.float32)
    for name, sample in (("a", crops), ("b", crops), ("c", crops[:2])):
        quantize.calibrate_ranges(dlib_weights, sample, manifest.input.name, "MinMax", tmp_path / name)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() != (tmp_path / "c").read_bytes()


def _copy(manifest_dir, manifest: Manifest, **quantization) -> Manifest:
    """The manifest and its ranges in another folder, with changed quantization fields."""
    shutil.copy(MANIFEST.parent / manifest.file.source.quantization.ranges, manifest_dir)
    options = manifest.file.source.quantization.model_copy(update=quantization)
    return manifest.model_copy(
        update={"file": manifest.file.model_copy(update={"source": manifest.file.source.model_copy(update={"quantization": options})})}
    )


def test_tampered_ranges_are_refused_and_leave_nothing(dlib_weights, manifest, tmp_path):
    changed = _copy(tmp_path, manifest, onnxruntime=ort.__version__)  # past the version check on any onnxruntime
    ranges = tmp_path / changed.file.source.quantization.ranges
    payload = json.loads(ranges.read_text())
    name = sorted(payload["data"])[0]
    payload["data"][name]["highest"]["data"] = [x * 2 for x in payload["data"][name]["highest"]["data"]]
    ranges.write_text(json.dumps(payload, sort_keys=True, indent=1) + "\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / dlib_weights.name).symlink_to(dlib_weights)
    with pytest.raises(ModelError, match="ranges: sha256 .* does not match the manifest"):
        pull(changed, cache, manifest_dir=tmp_path)
    assert not (cache / manifest.file.name).exists()


def test_another_onnxruntime_is_named_in_one_line(manifest, tmp_path):
    with pytest.raises(ModelError) as error:
        pull(_copy(tmp_path, manifest, onnxruntime="1.0.0"), tmp_path / "cache", manifest_dir=tmp_path)
    assert str(error.value) == (
        f"dlib-resnet-v1-int8: onnxruntime {ort.__version__} quantizes to other bytes than onnxruntime 1.0.0, "
        "which made the pinned file: pull it with onnxruntime==1.0.0"
    )


def test_the_int8_importer_and_its_quantization_go_together(manifest):
    source = manifest.file.source.model_dump()
    with pytest.raises(ValueError, match="takes `quantization`"):
        type(manifest.file.source).model_validate({**source, "quantization": None})
    with pytest.raises(ValueError, match="takes `quantization`"):
        type(manifest.file.source).model_validate({**source, "importer": "dlib_resnet"})


def _pull_all(models_dir, cache, monkeypatch):
    from typer.testing import CliRunner

    from service import cli
    from service.core.settings import get_settings

    monkeypatch.setenv("FACEGATE_MODELS_DIR", str(models_dir))
    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(cache))
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(cli.app, ["models", "pull"])
    finally:
        get_settings.cache_clear()


def test_pull_with_no_name_makes_the_int8_file_too(int8_cache, manifest, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("dlib-resnet-v1.onnx", manifest.file.source.weights_name):  # no download: the float model is there
        (cache / name).symlink_to(int8_cache / name)
    result = _pull_all(REPO / "models", cache, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "ok dlib-resnet-v1-int8" in result.output and "ok dlib-resnet-v1 " in result.output
    assert (cache / manifest.file.name).read_bytes() == (int8_cache / manifest.file.name).read_bytes()


def test_pull_with_no_name_skips_an_int8_file_another_onnxruntime_made(manifest, tmp_path, monkeypatch):
    _copy(tmp_path, manifest, onnxruntime="1.0.0").save(tmp_path / MANIFEST.name)
    result = _pull_all(tmp_path, tmp_path / "cache", monkeypatch)
    assert result.exit_code == 0, result.output
    assert "skipped dlib-resnet-v1-int8: onnxruntime" in " ".join(result.output.split())
    monkeypatch.setenv("FACEGATE_EMBEDDER", "dlib-resnet-v1-int8")  # the one served: a failure
    assert _pull_all(tmp_path, tmp_path / "cache", monkeypatch).exit_code != 0
