"""The decision threshold: an explicit cosine, or the manifest's threshold for a FAR."""

import pytest

from service.core.decision import Decision, decide, decide_subject
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


def test_a_default_far_the_model_lacks_falls_back_with_a_warning(manifest):
    """Issue 48, item 6: a model calibrated on few people has no threshold for FACEGATE_DEFAULT_FAR; a
    request naming no FAR is decided at the nearest calibrated FAR not looser than the default, else
    the strictest there is, and says so. A FAR the request names is never replaced."""
    few = manifest.model_copy(update={"thresholds": {"1e-2": 0.8}})
    decision = decide(few, None, None, "1e-3")
    assert (decision.threshold, decision.far) == (0.8, "1e-2")
    assert "default FAR 1e-3" in decision.warning and "decided at FAR 1e-2" in decision.warning
    gapped = manifest.model_copy(update={"thresholds": {"1e-2": 0.8, "1e-4": 0.9, "1e-5": 0.95}})
    assert decide(gapped, None, None, "1e-3").far == "1e-4"
    assert decide(manifest, None, None, "1e-3").warning is None
    with pytest.raises(UnknownFar):
        decide(few, "1e-3", None, "1e-3")
    with pytest.raises(UnknownFar):
        decide(manifest.model_copy(update={"thresholds": {}}), None, None, "1e-3")
    subject = decide_subject(gapped, None, None, "1e-3", faces=3)
    assert subject.far == "1e-4" and "decided at FAR 1e-4" in subject.warning and subject.threshold > 0.9
