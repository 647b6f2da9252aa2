"""/identify and /verify against a subject on a model whose cosine rows are calibrated for the mean of
a subject's faces (issue 46): every candidate is scored against its subject's mean as enrolled now
and says so, the decision is made on that number, and a model whose rows hold best faces answers as
before. The test embedder on aligned crops (its cosines prove the mechanics, not recognition)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import aligned_crop_png

ANN, BOB = (1, 2), (3,)  # the crops each subject enrolls; a probe is Ann's first crop


UNREACHED = {"1e-2": 1.01, "1e-3": 1.02}  # a pair curve no cosine reaches: no best face says more than its mean


def with_rows(embedder_manifest, folder, template: str, pair: dict[str, float] | None = UNREACHED):
    """The test embedder with an open-set table whose cosine rows (T 0.6 at fpir 1e-2) hold `template`,
    and the pair thresholds `pair` (None: the test embedder's own, 0.8 at 1e-2 and 0.9 at 1e-3)."""
    import shutil

    folder.mkdir()
    shutil.copy(embedder_manifest.with_suffix(".onnx"), folder)
    manifest = json.loads(embedder_manifest.read_text())
    if pair is not None:
        manifest["thresholds"] = pair
    margin = {"faces_per_subject": 1, "subjects": [1, 100], "thresholds": [[0.3, 0.6, 0.7], [0.3, 0.6, 0.7]], "samples": [1, 1]}
    manifest["open_set"] = {
        "fpirs": [0.1, 0.01, 0.001],
        "tables": [margin],
        "cosine_below": 10,
        "cosine_tables": [{**margin, "subjects": [1, 11]}],
        "cosine_template": template,
    }
    path = folder / embedder_manifest.name
    path.write_text(json.dumps(manifest))
    return path


def embedding(api, seed: int) -> np.ndarray:
    answer = api.post("/embed", files={"image": aligned_crop_png(seed)}, data={"aligned": "true"}).json()
    return np.array(answer["faces"][0]["embedding"], np.float32)


def enroll(api, subject: str, seeds) -> list[int]:
    assert api.post("/subjects", json={"id": subject, "name": subject}).status_code == 201
    ids = []
    for seed in seeds:
        response = api.post(f"/subjects/{subject}/faces", files={"image": aligned_crop_png(seed)}, data={"aligned": "true"})
        assert response.status_code == 201, response.text
        ids.append(response.json()["face_id"])
    return ids


def identify(api) -> dict:
    return api.post("/identify", files={"image": aligned_crop_png(ANN[0])}, data={"aligned": "true", "top_k": "2"}).json()


def mean_cosine(probe: np.ndarray, faces: list[np.ndarray]) -> float:
    mean = np.mean(faces, axis=0)
    return float(probe @ mean / np.linalg.norm(mean))


@pytest.mark.parametrize("template", ["mean", "best_face"])
def test_identify_and_verify_on_the_template_of_the_rows(api_settings, make_client, embedder_manifest, tmp_path, template):
    api = make_client(api_settings.model_copy(update={"embedder": str(with_rows(embedder_manifest, tmp_path / "m", template))}))
    faces = {seed: embedding(api, seed) for seed in (*ANN, *BOB, 4)}
    probe = faces[ANN[0]]
    ann_ids = enroll(api, "ann", ANN)
    enroll(api, "bob", BOB)
    expected = {
        "ann": mean_cosine(probe, [faces[s] for s in ANN]) if template == "mean" else 1.0,
        "bob": float(probe @ faces[BOB[0]]),
    }
    answer = identify(api)
    assert answer["score"] == "cosine" and answer["threshold"] == 0.6
    assert [c["template"] for c in answer["candidates"]] == [template] * 2
    assert {c["subject_id"]: c["similarity"] for c in answer["candidates"]} == pytest.approx(expected, abs=1e-5)
    assert [c["subject_id"] for c in answer["candidates"]] == sorted(expected, key=lambda s: -expected[s])
    assert answer["best_score"] == answer["candidates"][0]["similarity"]
    assert (answer["match"] is not None) == (answer["best_score"] >= answer["threshold"])

    verified = api.post("/verify", files={"image1": aligned_crop_png(ANN[0])}, data={"aligned": "true", "subject_id": "ann", "far": "1e-2"})
    verified = verified.json()
    assert (verified["template"], verified["subject_faces"]) == (template, 2)
    assert verified["similarity"] == pytest.approx(expected["ann"], abs=1e-5)
    if template == "mean":  # the rows' threshold for one subject of two faces at 1e-2, not the pair's per-comparison one
        assert verified["threshold"] == 0.6
    assert verified["match"] == (verified["similarity"] >= verified["threshold"])

    if template == "mean":  # the mean is the store's now: a face enrolled or deleted changes it at once
        (added,) = enroll_more(api, "ann", 4)
        ann = next(c for c in identify(api)["candidates"] if c["subject_id"] == "ann")
        assert ann["similarity"] == pytest.approx(mean_cosine(probe, [faces[s] for s in (*ANN, 4)]), abs=1e-5)
        assert api.delete(f"/faces/{added}").status_code in (200, 204)
        assert api.delete(f"/faces/{ann_ids[1]}").status_code in (200, 204)
        ann = next(c for c in identify(api)["candidates"] if c["subject_id"] == "ann")
        assert ann["similarity"] == pytest.approx(1.0, abs=1e-5)  # one face left: its mean is itself


def enroll_more(api, subject: str, seed: int) -> list[int]:
    response = api.post(f"/subjects/{subject}/faces", files={"image": aligned_crop_png(seed)}, data={"aligned": "true"})
    assert response.status_code == 201, response.text
    return [response.json()["face_id"]]


def test_a_probe_that_is_one_enrolled_photo_is_decided_on_that_face(api_settings, make_client, embedder_manifest, tmp_path):
    """On the mean's rows with the embedder's own pair curve: the probe is Ann's first enrolled photo
    (cosine 1.0, a stranger's rate by the pair curve far below the promise), so her best face says
    more than her mean: she is the match on it, `template` best_face, its raw cosine as `similarity`
    and the mean's cosine of the same stranger rate as her `score`, above the mean's own; /verify
    against her answers with that face and the pair's per-comparison threshold for her two faces."""
    api = make_client(api_settings.model_copy(update={"embedder": str(with_rows(embedder_manifest, tmp_path / "m", "mean", None))}))
    faces = {seed: embedding(api, seed) for seed in ANN}
    enroll(api, "ann", ANN)
    answer = identify(api)
    (ann,) = [c for c in answer["candidates"] if c["subject_id"] == "ann"]
    assert answer["score"] == "cosine" and answer["match"]["subject_id"] == "ann"
    assert ann["template"] == "best_face" and ann["similarity"] == pytest.approx(1.0, abs=1e-5)
    assert ann["score"] == answer["best_score"] >= answer["threshold"] == 0.6
    assert ann["score"] > mean_cosine(faces[ANN[0]], list(faces.values())) + 1e-3

    verified = api.post("/verify", files={"image1": aligned_crop_png(ANN[0])}, data={"aligned": "true", "subject_id": "ann", "far": "1e-2"})
    verified = verified.json()
    assert (verified["template"], verified["subject_faces"], verified["match"]) == ("best_face", 2, True)
    assert verified["similarity"] == pytest.approx(1.0, abs=1e-5)
    assert 0.8 < verified["threshold"] < 0.9  # the pair's, at the per-comparison FAR of two tries at 1e-2 (about 5e-3)
