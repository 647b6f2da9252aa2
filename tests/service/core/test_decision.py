"""The decision threshold: an explicit cosine, or the manifest's threshold for a FAR."""

import pytest

from service.core.decision import Decision, decide
from service.core.errors import InvalidParameters, UnknownFar
from tests.onnx_models import write_test_embedder


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    from service.core.models.manifest import Manifest

    return Manifest.load(write_test_embedder(tmp_path_factory.mktemp("embedder")))


def test_far_picks_the_manifest_threshold(manifest):
    assert decide(manifest, None, None, "1e-3") == Decision(manifest.threshold("1e-3"), "1e-3")
    assert decide(manifest, 0.01, None, "1e-3") == Decision(manifest.threshold("1e-2"), "1e-2")
    assert decide(manifest, None, 0.5, "1e-3") == Decision(0.5, None)
    assert Decision(0.5, None).matches(0.5) and not Decision(0.5, None).matches(0.49)


def test_bad_choices_are_typed_errors(manifest):
    with pytest.raises(InvalidParameters):
        decide(manifest, "1e-3", 0.5, "1e-3")
    with pytest.raises(InvalidParameters):
        decide(manifest, "abc", None, "1e-3")
    with pytest.raises(UnknownFar, match="available FARs: 1e-3, 1e-2"):
        decide(manifest, "1e-5", None, "1e-3")
