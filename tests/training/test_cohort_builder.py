"""AS-norm cohorts (training/cohort_builder.py, service/core/models/cohort.py) on synthetic people whose photos
are pulled, each by its own amount, toward one common direction: "hubs" that score high against
everyone, the strangers a raw cosine threshold lets through first. The right answer is known: the
normalized decision keeps the FPIR it promises and finds more of the enrolled people at that rate."""

from __future__ import annotations

import json
from statistics import NormalDist

import numpy as np
import pytest

from service.core.decision import decide_search, per_comparison_far
from service.core.errors import ModelError
from service.core.models.cohort import Cohort, cohort_stats
from service.core.models.manifest import FarCurve, Manifest, threshold_at
from tests.conftest import REPO
from training.cohort_builder import build, split, write
from training.thresholds import far_curve

DIM, TOP = 32, 50


def people(rng, identities: int, photos: int) -> tuple[np.ndarray, np.ndarray]:
    centers = np.repeat(rng.normal(size=(identities, DIM)), photos, axis=0)
    pull = rng.uniform(0, 1.5, size=(identities * photos, 1)) * np.ones(DIM)  # the hub direction, each photo its own amount
    x = centers + 0.7 * rng.normal(size=centers.shape) + pull
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32), np.repeat(np.arange(identities), photos)


@pytest.fixture(scope="module")
def built():
    rng = np.random.default_rng(0)
    return build(*people(rng, 900, 4), top=TOP), rng


def test_split_keeps_cohort_and_calibration_people_apart():
    labels = np.repeat(np.arange(30), 3)
    parts = split(labels, 1 / 3, seed=1)
    assert len(np.unique(labels[parts.cohort])) == 10
    assert not set(labels[parts.cohort]) & set(labels[parts.calibration])
    assert sorted([*parts.cohort, *parts.calibration]) == list(range(90))
    with pytest.raises(ValueError, match="none to calibrate"):
        split(np.zeros(5), 0.99, seed=1)


def test_normalized_fpir_holds_and_finds_more_people(built):
    (cohort, curve, figures), rng = built
    assert figures["cohort_identities"] == 300 and figures["calibration_identities"] == 600
    photos, labels = people(rng, 300, 2)
    gallery, probes = photos[0::2], photos[1::2]
    strangers, _ = people(rng, 4000, 1)

    def scored(p):
        cosines = p @ gallery.T
        best = cosines.argmax(axis=1)
        cosine = cosines[np.arange(len(p)), best]
        (mp, sp), (mg, sg) = cohort_stats(p, cohort, TOP), cohort_stats(gallery, cohort, TOP)
        return best, cosine, 0.5 * ((cosine - mp) / sp + (cosine - mg[best]) / sg[best])

    known_best, known_cosine, known_norm = scored(probes)
    _, stranger_cosine, stranger_norm = scored(strangers)
    correct = known_best == np.arange(300)
    for fpir in (0.1, 0.01):
        threshold = threshold_at(FarCurve(**curve).curve, per_comparison_far(fpir, len(gallery)))
        assert (stranger_norm >= threshold).mean() == pytest.approx(fpir, rel=0.4), fpir
        # at the same share of strangers accepted, more enrolled people found than by the raw cosine
        raw_cut, norm_cut = (np.quantile(s, 1 - fpir, method="higher") for s in (stranger_cosine, stranger_norm))
        assert (correct & (known_norm > norm_cut)).mean() > (correct & (known_cosine > raw_cut)).mean() + 0.1, fpir


def test_written_cohort_loads_for_its_embedder_only(built, tmp_path):
    (cohort, _, figures), _ = built
    embedder = Manifest.load(REPO / "models" / "dlib-resnet-v1.json").model_copy(update={"embedding_dim": DIM})
    standard_normal = far_curve(np.random.default_rng(1).normal(size=200_000))  # a curve whose thresholds are known
    written = write(tmp_path / "c", embedder, cohort, standard_normal, TOP, figures, {}, {"name": "synthetic"})
    loaded = Cohort.load(tmp_path / "c.json", embedder)
    assert loaded.faces.shape == (written.file.faces, DIM) and loaded.manifest.top == TOP
    # the service's decision: an FPIR on the cohort's curve, AS-norm scores; explicit choices stay cosine.
    # At FPIR 10% over 30 faces the best of 30 standard-normal impostor scores passes with probability
    # 1 − Φ(t)³⁰, so t = Φ⁻¹(0.9^(1/30)) (the sampled curve is within 0.04 of it there)
    decision = decide_search(embedder, 0.1, None, None, 30, 0.01, loaded)
    assert decision.score == "as-norm" and decision.threshold == pytest.approx(NormalDist().inv_cdf(0.9 ** (1 / 30)), abs=0.04)
    assert decide_search(embedder, None, None, 0.7, 300, 0.01, loaded).score == "cosine"
    probe = cohort[0]
    same, other = loaded.normalize(probe, cohort[:2], [1.0, float(probe @ cohort[1])])
    assert same > other

    other = embedder.model_copy(update={"name": "another-embedder"})
    with pytest.raises(ModelError, match="calibrate-cohort"):
        Cohort.load(tmp_path / "c.json", other)
    data = tmp_path / "c.npy"
    data.write_bytes(data.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ModelError, match="sha256"):
        Cohort.load(tmp_path / "c.json", embedder)
    bad = json.loads((tmp_path / "c.json").read_text()) | {"top": 1}
    (tmp_path / "c.json").write_text(json.dumps(bad))
    with pytest.raises(ModelError, match="invalid cohort manifest"):
        Cohort.load(tmp_path / "c.json", embedder)


def test_open_set_evaluation_scores_as_the_service_decides(built, tmp_path):
    """eval-open-set's scores with a cohort are `Decision.best_match`'s: the best face's AS-norm score."""
    from service.core.decision import Candidate
    from training.identification import best_subjects

    (cohort, curve, figures), rng = built
    embedder = Manifest.load(REPO / "models" / "dlib-resnet-v1.json").model_copy(update={"embedding_dim": DIM})
    write(tmp_path / "c", embedder, cohort, curve, TOP, figures, {}, {"name": "synthetic"})
    loaded = Cohort.load(tmp_path / "c.json", embedder)
    photos, _ = people(rng, 20, 2)
    gallery, probes = photos[0::2], photos[1::2]
    labels, scores = best_subjects(gallery, np.arange(20) * 10, probes, loaded)
    for probe, label, score in zip(probes, labels, scores, strict=True):
        face = gallery[label // 10]
        assert score == pytest.approx(loaded.normalize(probe, face[None], [float(probe @ face)])[0], abs=1e-5)
        decision = decide_search(embedder, 0.1, None, None, 20, 0.01, loaded)
        assert (decision.best_match(probe, [Candidate("s", "s", float(probe @ face), 0, face)]) is not None) == (
            score >= decision.threshold
        )
