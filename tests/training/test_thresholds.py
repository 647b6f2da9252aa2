"""Calibration (training/thresholds.py): thresholds recovered from synthetic impostor scores and the
omission rule for FARs the pair count cannot support."""

from __future__ import annotations

import numpy as np
import pytest

from training.thresholds import MIN_FALSE_ACCEPTS, calibrate_scores, pair_scores, threshold_for_far


def test_exact_thresholds_on_a_known_score_set():
    # 100,000 distinct impostor scores 0, 1e-5, …, 0.99999, shuffled: FAR f accepts exactly the top f·N
    rng = np.random.default_rng(0)
    impostor = rng.permutation(np.arange(100_000) / 100_000)
    genuine = np.array([0.95, 0.9950, 0.9990, 0.99995])
    result = calibrate_scores(genuine, impostor)
    assert result.thresholds == {"1e-2": 0.989991, "1e-3": 0.998991, "1e-4": 0.999891}
    for key, accepted in (("1e-2", 1000), ("1e-3", 100), ("1e-4", 10)):
        assert (impostor >= result.thresholds[key]).sum() == accepted
        assert result.realized[key]["far"] == pytest.approx(accepted / 100_000)
    assert [result.realized[k]["tar"] for k in ("1e-2", "1e-3", "1e-4")] == [0.75, 0.5, 0.25]
    # 1e-5 would rest on a single impostor pair
    assert "1e-5" not in result.thresholds and "1,000,000" in result.omitted["1e-5"]


def test_recovers_the_quantiles_of_a_known_distribution():
    # impostor cosines ~ N(0.1, 0.08): the FAR-f threshold is the (1-f) quantile 0.1 + 0.08·z
    rng = np.random.default_rng(1)
    impostor = rng.normal(0.1, 0.08, size=2_000_000)
    result = calibrate_scores(np.array([]), impostor)
    for key, z in (("1e-2", 2.3263), ("1e-3", 3.0902), ("1e-4", 3.7190), ("1e-5", 4.2649)):
        assert result.thresholds[key] == pytest.approx(0.1 + 0.08 * z, abs=0.006 if key == "1e-5" else 0.003), key
        assert result.realized[key]["far"] <= float(key) and result.realized[key]["tar"] is None
    assert result.omitted == {}


def test_ties_never_push_the_realized_far_over_the_target():
    impostor = np.concatenate([np.full(50, 0.7), np.linspace(0, 0.5, 950)])  # 50 tied at the top
    t = threshold_for_far(impostor, 1e-2)  # allows 10 of 1000: all 50 ties must be rejected
    assert t > 0.7 and (impostor >= t).sum() == 0
    assert threshold_for_far(np.linspace(0, 1, MIN_FALSE_ACCEPTS * 100 - 1), 1e-2) is None


def test_a_threshold_rejects_its_boundary_score_in_float32():
    """Scores are float32: 0.9 rounds onto the float32 score just below it, which it must reject."""
    boundary = np.float32(0.8999999761581421)
    impostor = np.concatenate([np.full(11, boundary, np.float32), np.linspace(0, 0.5, 989, dtype=np.float32)])
    t = threshold_for_far(impostor, 1e-2)  # allows 10 of 1000: the 11 at the boundary are rejected
    assert t == 0.900001 and (impostor >= t).sum() == 0


def test_pair_scores_split_genuine_and_impostor():
    e = np.eye(4, dtype=np.float32)[[0, 0, 1, 2]]
    genuine, impostor = pair_scores(e, np.array([7, 7, 8, 9]))
    assert genuine.tolist() == [1.0] and sorted(impostor.tolist()) == [0.0] * 5


def _exponential_manifest(curve: dict):
    from service.core.models.manifest import FarCurve, Manifest
    from tests.conftest import REPO

    manifest = Manifest.load(REPO / "models" / "dlib-resnet-v1.json")
    return manifest.model_copy(update={"far_curve": FarCurve(**curve), "open_set": None})  # the cosine decision


def test_far_curve_and_its_tail_on_an_exponential_tail():
    """Impostor scores ~ Exp(rate 10): FAR(t) = exp(-10 t), so the FAR-f threshold is ln(1/f)/10 —
    linear in log10 f, the tail the curve extrapolates: its points, its fitted tail below them
    (here below 1e-5, the last FAR with 10 false accepts of 1e6) and the inverse, far_at, recover it."""
    from training.thresholds import far_curve

    rng = np.random.default_rng(2)
    curve = far_curve(rng.exponential(0.1, size=1_000_000))
    fars = [f for f, _ in curve["points"]]
    assert fars[0] == 0.1 and fars[-1] == pytest.approx(1e-5) and len(fars) == 17  # 4 a decade, 1e-1 … 1e-5
    manifest = _exponential_manifest(curve)
    exact = lambda far: np.log(1 / far) / 10  # noqa: E731
    for far in (1e-1, 1e-2, 3e-3, 1e-4):
        assert manifest.threshold_at(far) == pytest.approx(exact(far), abs=0.01), far
        assert manifest.far_at(exact(far)) == pytest.approx(far, rel=0.25), far
    for far in (1e-6, 1e-8):  # beyond the pairs: the fitted tail
        assert manifest.beyond_calibration(far)
        assert manifest.threshold_at(far) == pytest.approx(exact(far), rel=0.08), far
    assert not manifest.beyond_calibration(1e-5)
    assert curve["tail_slope"] == pytest.approx(np.log(10) / 10, rel=0.15)
    # many cosines at once (`fars_at`, which a search's best faces are read with): the points' first FAR
    # at or below their first threshold, log-linear between them, the fitted tail above the last
    fars = manifest.fars_at(np.array([-1.0, exact(0.1), exact(3e-3), exact(1e-4), exact(1e-7)]))
    assert fars[0] == 0.1 and list(fars[1:]) == pytest.approx([0.1, 3e-3, 1e-4, 1e-7], rel=0.3)
    assert manifest.far_at(exact(3e-3)) == fars[2]  # one cosine, as many


def test_fpir_holds_whatever_the_gallery_size():
    """The promise /identify makes, checked by simulation: strangers probing galleries of 1, 10 and
    300 impostor faces match (best score ≥ threshold) at the FPIR asked for."""
    from service.core.decision import decide_search
    from training.thresholds import far_curve

    rng = np.random.default_rng(3)
    manifest = _exponential_manifest(far_curve(rng.exponential(0.1, size=2_000_000)))
    probes = 20_000
    for faces in (1, 10, 300):
        for fpir in (0.1, 0.01):
            decision = decide_search(manifest, fpir, None, None, faces, default_fpir=0.01)
            best = rng.exponential(0.1, size=(probes, faces)).max(axis=1)
            realized = float((best >= decision.threshold).mean())
            assert realized == pytest.approx(fpir, rel=0.25), (faces, fpir, realized)
            assert decision.gallery_faces == faces and decision.fpir == fpir
    # the threshold rises with the gallery: a per-comparison FAR would not
    assert decide_search(manifest, 0.01, None, None, 10_000, 0.01).threshold > decide_search(manifest, 0.01, None, None, 10, 0.01).threshold


def test_one_person_under_two_names_is_left_out_of_the_impostor_pairs():
    """Identity 7 is identity 3 again (another dataset's folder): its cross pairs with 3 are genuine,
    so calibration must not count them as impostors; the other 298 people are all told apart."""
    from training.thresholds import pair_scores, same_person_pairs

    rng = np.random.default_rng(1)
    centers = rng.normal(size=(300, 64))
    centers[7] = centers[3]
    labels = np.repeat(np.arange(300), 5)
    x = centers[labels] + 0.6 * rng.normal(size=(1500, 64))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    _, impostor = pair_scores(x, labels)
    pairs, report = same_person_pairs(x, labels, impostor)
    assert pairs == [(3, 7)] and report == {"identity_pairs": 1, "impostor_pairs": 25}
    genuine, cleaned = pair_scores(x, labels, one_person=pairs)
    assert len(cleaned) == len(impostor) - 25 and len(genuine) == 300 * 10
    assert cleaned.max() < np.sort(impostor)[-25]  # what was left out was the top of the "impostor" tail


def test_a_second_name_with_its_other_photos_is_found_by_the_genuine_share():
    """Identity 7 is identity 3 seen in other conditions: three of its five photos are 3's, two are
    unlike anyone's, so under half of their cross pairs match (calibrate's rule keeps them apart),
    yet they match as often as one person's photos match each other: `of_genuine` finds them, and
    nobody else (look-alikes that merely score high together stay strangers)."""
    from training.thresholds import pair_scores, same_person_pairs

    rng = np.random.default_rng(3)
    centers = rng.normal(size=(300, 64))
    labels = np.repeat(np.arange(300), 5)
    x = centers[labels] + 0.9 * rng.normal(size=(1500, 64))
    x[35:38] = centers[3] + 0.9 * rng.normal(size=(3, 64))  # three of 7's photos are 3's face
    x[38:40] = 1.9 * rng.normal(size=(2, 64))  # and two are nobody's
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    genuine, impostor = pair_scores(x, labels)
    above = np.sort(impostor)[-int(1e-4 * len(impostor)) - 1]
    assert 0.8 < (genuine > above).mean() < 0.9  # one person's photos match there 85 % of the time
    assert same_person_pairs(x, labels, impostor)[0] == []
    pairs, report = same_person_pairs(x, labels, impostor, of_genuine=0.5)
    assert pairs == [(3, 7)] and report == {"identity_pairs": 1, "impostor_pairs": 25}
