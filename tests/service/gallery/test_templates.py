"""A subject's template at search time (service/gallery/templates.py) on the SQLite store, decided by
service.core.decision as /identify decides: on a table whose cosine rows are calibrated for the mean,
each proposed subject is scored against its faces' mean as the store holds them now; on one whose
rows hold best faces (every manifest before issue 46's mean rows) nothing changes. Synthetic
embeddings, no models."""

from __future__ import annotations

import numpy as np
import pytest

from service.core.decision import decide_search
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


def identify(gallery: SqliteGallery, template: str) -> tuple[list, bool, float]:
    """What /identify does: the decision for the gallery, the search for its template, the match."""
    decision = decide_search(manifest(template), None, None, None, gallery.shape(), 0.01)
    assert decision.template == template and decision.score == "cosine"
    found = templates.search(gallery, PROBE, max(2, decision.candidates_needed), decision.template)  # top_k 2
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
