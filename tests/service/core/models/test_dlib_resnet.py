"""The imported dlib ResNet: numpy's reading of dlib's file gives dlib's own descriptors (dlib-bin is
the reference, a test-only dependency), and the conversion is byte-for-byte reproducible, so the
shipped manifest's sha256 pins the file every machine makes."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.fileio import sha256_file
from service.core.models import dlib_resnet
from service.core.models.manifest import Manifest
from tests.conftest import REPO
from tests.requirements import importorskip

MANIFEST = REPO / "models" / "dlib-resnet-v1.json"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return Manifest.load(MANIFEST)


@pytest.fixture(scope="module")
def dat(dlib_model, manifest):
    path = dlib_model.parent / manifest.file.source.weights_name
    assert sha256_file(path) == manifest.file.source.weights_sha256
    return path


def test_conversion_reproduces_the_manifest_file(dat, manifest):
    data = dlib_resnet.onnx_bytes(dat)
    assert len(data) == manifest.file.bytes
    import hashlib

    assert hashlib.sha256(data).hexdigest() == manifest.file.sha256


def test_network_is_dlibs_face_resnet(dat, manifest):
    net = dlib_resnet.read_dat(dat)
    assert net.input_size == 150 and len(net.blocks) == 14 and net.fc_weight.shape == (128, 256)
    assert [float(m) for m in net.mean_rgb] == manifest.input.mean
    assert np.allclose(manifest.input.mean, [122.782, 117.001, 104.298]) and manifest.input.std == [256.0] * 3
    assert sum(b.down is not None for b in net.blocks) == 4  # one downsampling block per stage after the first


def test_a_file_that_is_not_dlibs_is_refused(tmp_path):
    bogus = tmp_path / "bogus.dat"
    bogus.write_bytes(b"\x01\x0bnot a dlib network at all")
    with pytest.raises(ValueError):
        dlib_resnet.read_dat(bogus)


@pytest.mark.data
def test_descriptors_equal_dlibs_on_real_aligned_chips(dat, pipeline_with, test_data):
    """Real faces aligned by our pipeline onto the dlib template; dlib computes the descriptor of
    the same 150×150 chip. ≤ 1e-5 per element is float32 rounding, i.e. the same network."""
    dlib = importorskip("dlib")  # dlib-bin (dev extra): the parity reference
    pipeline = pipeline_with("dlib-resnet-v1")
    paths = sorted((test_data / "lfw").glob("*/*_0001.jpg"))[:24]
    chips = []
    for path in paths:
        image = pipeline.decode(path.read_bytes())
        faces = pipeline.detect(image)
        if faces:
            chips.append(pipeline.align(image, faces[:1])[0])
    assert len(chips) >= 20
    chips = np.stack(chips)
    ours = pipeline.embedder.raw(chips)
    reference = dlib.face_recognition_model_v1(str(dat))
    theirs = np.array([np.array(reference.compute_face_descriptor(np.ascontiguousarray(c))) for c in chips], np.float32)
    assert np.abs(ours - theirs).max() <= 1e-5
    # a batch gives what single faces give
    single = np.concatenate([pipeline.embedder.raw(c[None]) for c in chips[:4]])
    assert np.abs(single - ours[:4]).max() <= 1e-6


def test_import_dlib_converts_a_dat_of_ones_own(dat, manifest, tmp_path):
    """`--out`: a network trained with dlib gets its ONNX file and an uncalibrated manifest that loads."""
    from typer.testing import CliRunner

    from service.cli import app
    from service.core.models.files import load_model

    result = CliRunner().invoke(app, ["models", "import-dlib", str(dat), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = Manifest.load(tmp_path / f"{dat.stem}.json")
    assert written.file.sha256 == manifest.file.sha256 and written.thresholds == {} and written.alignment == "dlib_150"
    # its terms are its owner's to state: nothing of the published model's provenance or licence is claimed
    assert written.license["name"] == "unknown" and written.provenance["source_sha256"] == sha256_file(dat)
    assert load_model(str(tmp_path / f"{dat.stem}.json"), tmp_path, tmp_path, device="cpu").manifest.embedding_dim == 128
    assert (
        CliRunner().invoke(app, ["models", "import-dlib", str(tmp_path / f"{dat.stem}.json"), "--out", str(tmp_path / "x")]).exit_code == 2
    )
