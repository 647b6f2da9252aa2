"""A subject's template at search time (service/gallery/templates.py) on the SQLite store, decided by
service.core.decision as /identify decides: on a table whose cosine rows are calibrated for the mean,
each proposed subject is scored against its faces' mean as the store holds them now; on one whose
rows hold best faces (every manifest before issue 46's mean rows) nothing changes. Synthetic
embeddings, no models."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.decision import decide_search, decide_subject, on_subject, per_comparison_far
from service.core.models.manifest import EmbedderKey, Manifest, OpenSetRows, OpenSetTable
from service.gallery import templates
from service.gallery.interface import NewFace
from service.gallery.sqlite import SqliteGallery
from tests.service.core.test_open_set import manifest_with

KEY = EmbedderKey("model-a", "a" * 64, 8)
PROBE = np.eye(8, dtype=np.float32)[0]


def toward(cosine: float, axis: int, sign: float = 1.0) -> np.ndarray:
    """A unit vector at `cosine` from PROBE, leaning along `axis` (sign: to one side or the other)."""
    v = np.zeros(8, np.float32)
    v[0], v[axis] = cosine, sign * np.sqrt(1 - cosine**2)
    return v


def manifest(template: str) -> Manifest:
    """An embedder whose galleries below 10 subjects are decided on cosine rows of `template`, T = 0.95 at fpir 1e-2."""
    margin = OpenSetRows(faces_per_subject=1, subjects=[10, 100], thresholds=[[0.9, 0.95], [0.91, 0.96]], samples=[1, 1])
    cosine = OpenSetRows(faces_per_subject=1, subjects=[1, 11], thresholds=[[0.9, 0.95], [0.9, 0.95]], samples=[1, 1])
    table = OpenSetTable(fpirs=[0.1, 0.01], tables=[margin], cosine_below=10, cosine_tables=[cosine], cosine_template=template)
    return manifest_with(table)


@pytest.fixture
def gallery(tmp_path):
    """Ann's two faces lean away from the probe on either side (0.90 each, their mean 1.0); Bob's one face is at 0.94."""
    g = SqliteGallery.open(tmp_path, KEY)
    g.create_subject("Ann", {}, "ann")
    g.create_subject("Bob", {}, "bob")
    g.add_faces("ann", [NewFace(toward(0.90, 1)), NewFace(toward(0.90, 1, -1.0))])
    g.add_faces("bob", [NewFace(toward(0.94, 2))])
    yield g
    g.close()


def with_pair_curve(template: str) -> Manifest:
    """`manifest(template)` with a pair's calibrated FARs too: 0.90 at 1e-2, 0.93 at 1e-3, 0.96 at 1e-4."""
    return manifest(template).model_copy(update={"thresholds": {"1e-2": 0.90, "1e-3": 0.93, "1e-4": 0.96}})


def identify(gallery: SqliteGallery, template: str | Manifest) -> tuple[list, bool, float]:
    """What /identify does: the decision for the gallery, the search for its template, the match."""
    model = manifest(template) if isinstance(template, str) else template
    decision = decide_search(model, None, None, None, gallery.shape(), 0.01)
    assert decision.template == model.open_set.cosine_template and decision.score == "cosine"
    found = templates.search(gallery, PROBE, max(2, decision.candidates_needed), decision)  # top_k 2
    scores = decision.scores(PROBE, found)
    return found, bool(scores[0] >= decision.threshold), decision.threshold


def test_a_subject_whose_mean_is_closer_than_its_best_face_is_decided_on_the_mean(gallery):
    found, match, threshold = identify(gallery, "mean")
    assert [(c.subject_id, c.template) for c in found] == [("ann", "mean"), ("bob", "mean")]
    assert found[0].similarity == pytest.approx(1.0, abs=1e-6) and found[1].similarity == pytest.approx(0.94, abs=1e-6)
    assert match and threshold == pytest.approx(0.95)


def test_a_table_of_best_faces_keeps_the_best_face_rule(gallery):
    found, match, _ = identify(gallery, "best_face")
    assert [(c.subject_id, c.template) for c in found] == [("bob", "best_face"), ("ann", "best_face")]
    assert found[0].similarity == pytest.approx(0.94, abs=1e-6) and not match  # 0.94 < 0.95: unknown
    with pytest.raises(ValueError, match="cosine_template"):
        OpenSetTable(fpirs=[0.1, 0.01], tables=manifest("mean").open_set.tables, cosine_template="mean")  # no cosine rows


def test_enrolling_and_deleting_change_the_mean(gallery):
    (more,) = gallery.add_faces("ann", [NewFace(toward(0.5, 3))])  # a poor photo drags Ann's mean away
    found, match, _ = identify(gallery, "mean")
    ann = next(c for c in found if c.subject_id == "ann")
    expected = (2 * 0.90 + 0.5) / np.linalg.norm(toward(0.90, 1) + toward(0.90, 1, -1.0) + toward(0.5, 3))
    assert ann.similarity == pytest.approx(expected, abs=1e-6) and found[0].subject_id == "bob" and not match
    gallery.delete_face(more.id)
    found, match, _ = identify(gallery, "mean")
    assert found[0].subject_id == "ann" and found[0].similarity == pytest.approx(1.0, abs=1e-6) and match
    gallery.delete_subject("ann")
    found, _, _ = identify(gallery, "mean")
    assert [c.subject_id for c in found] == ["bob"]


def test_a_subject_whose_best_face_says_more_than_its_mean_is_decided_on_that_face(gallery):
    """Carol's one photo matches the probe closely (0.99), her other is poor (0.2): her mean (0.77)
    is far below the rows' 0.95, but by the rule before the margin score her best face matches (its
    FAR over the 5 faces about 5e-5, against 1e-2): she is found, scored on the mean's scale."""
    gallery.create_subject("Carol", {}, "carol")
    gallery.add_faces("carol", [NewFace(toward(0.99, 3)), NewFace(toward(0.2, 4))])
    found, match, threshold = identify(gallery, "mean")  # no pair curve: the mean alone
    carol = next(c for c in found if c.subject_id == "carol")
    assert carol.template == "mean" and carol.similarity == pytest.approx(1.19 / np.sqrt(2.396), abs=1e-5)
    assert found[0].subject_id == "ann" and found[0].template == "mean"
    model = with_pair_curve("mean")
    decision = decide_search(model, None, None, None, gallery.shape(), 0.01)
    found = templates.search(gallery, PROBE, decision.candidates_needed, decision)
    scores = decision.scores(PROBE, found)
    assert [(c.subject_id, c.template) for c in found][0] == ("carol", "best_face")
    assert found[0].similarity == pytest.approx(0.99, abs=1e-6) and found[0].mean == pytest.approx(carol.similarity, abs=1e-6)
    assert scores[0] > 0.95 >= decision.threshold and list(scores) == sorted(scores, reverse=True)
    # Bob's one face (0.94: FAR ~3e-4 over 5 faces, 1.5e-3) is found by the same rule, Ann's mean (1.0) needs none
    assert {c.subject_id: c.template for c in found} == {"carol": "best_face", "ann": "mean", "bob": "best_face"}


def test_a_best_face_the_rule_before_would_not_match_changes_nothing(gallery):
    """A stranger's best face at 0.85 (below the pair's 1e-2 point): no score beside the mean's."""
    gallery.create_subject("Dan", {}, "dan")
    gallery.add_faces("dan", [NewFace(toward(0.85, 3)), NewFace(toward(0.2, 4))])
    gallery.delete_subject("ann")
    gallery.delete_subject("bob")
    found, match, _ = identify(gallery, with_pair_curve("mean"))
    assert [(c.subject_id, c.template) for c in found] == [("dan", "mean")] and not match


def test_verify_against_a_subject_holds_the_template_that_decides_to_its_own_threshold():
    """/verify against a subject (`on_subject`): the mean where it says more, held to the rows'
    threshold; else the best face, held to the pair's threshold at the per-comparison FAR of k faces."""
    model = with_pair_curve("mean")
    decision = decide_subject(model, None, None, "1e-2", 2)
    assert decision.template == "mean" and decision.threshold == pytest.approx(0.95)
    close_and_poor = np.stack([toward(0.99, 3), toward(0.2, 4)])
    held, template, similarity = on_subject(decision, close_and_poor, PROBE)
    assert template == "best_face" and similarity == pytest.approx(0.99, abs=1e-6)
    assert held.threshold == pytest.approx(model.threshold_at(per_comparison_far(0.01, 2)), abs=1e-6) and held.matches(similarity)
    either_side = np.stack([toward(0.90, 1), toward(0.90, 1, -1.0)])
    held, template, similarity = on_subject(decision, either_side, PROBE)
    assert template == "mean" and held is decision and similarity == pytest.approx(1.0, abs=1e-6) and held.matches(similarity)
    poor = np.stack([toward(0.85, 3), toward(0.2, 4)])  # its best face below the pair's curve: the mean, no match
    held, template, similarity = on_subject(decision, poor, PROBE)
    assert template == "mean" and held is decision and not held.matches(similarity)
