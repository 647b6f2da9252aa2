"""The default embedder on real photos the project never trained or calibrated on (the CompreFace
and face_recognition sample images): enrolled people are identified and verified at the default
threshold, and people never enrolled are not matched."""

from __future__ import annotations

import itertools

import pytest

# face_recognition's knn example: people enrolled from `train/`, probed with other photos
ENROLL = {
    "alex_lacamoire": ["knn_examples/train/alex_lacamoire/img1.jpg"],
    "biden": ["knn_examples/train/biden/biden.jpg", "knn_examples/train/biden/biden2.jpg"],
    "kit_harington": ["knn_examples/train/kit_harington/john1.jpeg", "knn_examples/train/kit_harington/john2.jpeg"],
    "obama": ["knn_examples/train/obama/obama.jpg", "knn_examples/train/obama/obama2.jpg"],
    "rose_leslie": ["knn_examples/train/rose_leslie/img1.jpg", "knn_examples/train/rose_leslie/img2.jpg"],
}
PROBES = {
    "knn_examples/test/alex_lacamoire1.jpg": "alex_lacamoire",
    "knn_examples/test/johnsnow_test1.jpg": "kit_harington",
    "knn_examples/test/obama1.jpg": "obama",
    "alex-lacamoire.png": "alex_lacamoire",
    "biden.jpg": "biden",
    "obama-480p.jpg": "obama",
    "obama_small.jpg": "obama",
}
STRANGERS = ["lin-manuel-miranda.png"]  # never enrolled
COMPREFACE_A = [f"00{i}_A.jpg" for i in range(1, 7)]  # one person, six photos
COMPREFACE_OTHERS = ["007_B.jpg", "008_B.jpg", "009_C.jpg"]


@pytest.fixture
def default_api(model_cache, tmp_path, make_client):
    from service.core.settings import Settings

    return make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu"))


@pytest.mark.data
def test_identification_at_the_default_threshold(default_api, test_data):
    examples = test_data / "tests" / "face_recognition" / "examples"
    for person, photos in ENROLL.items():
        assert default_api.post("/subjects", json={"id": person, "name": person}).status_code == 201
        for photo in photos:
            assert default_api.post(f"/subjects/{person}/faces", files={"image": (examples / photo).read_bytes()}).status_code == 201
    for probe, person in PROBES.items():
        result = default_api.post("/identify", files={"image": (examples / probe).read_bytes()}).json()
        assert result["match"] and result["match"]["subject_id"] == person, (probe, result["candidates"][:2])
    for stranger in STRANGERS:
        result = default_api.post("/identify", files={"image": (examples / stranger).read_bytes()}).json()
        assert result["match"] is None, (stranger, result["candidates"][:1])
    # two enrolled people in one photo: each face finds its own subject
    both = default_api.post(
        "/identify", files={"image": (examples / "knn_examples/test/obama_and_biden.jpg").read_bytes()}, data={"faces": "all"}
    ).json()
    assert sorted(r["match"]["subject_id"] for r in both["results"] if r["match"]) == ["biden", "obama"]


@pytest.mark.data
def test_verification_at_the_default_threshold(default_api, test_data):
    folder = test_data / "tests" / "compreface"

    def verify(a: str, b: str) -> dict:
        return default_api.post("/verify", files={"image1": (folder / a).read_bytes(), "image2": (folder / b).read_bytes()}).json()

    for a, b in itertools.combinations(COMPREFACE_A, 2):
        result = verify(a, b)
        assert result["match"], (a, b, result["similarity"], result["threshold"])
    for a, b in itertools.product(COMPREFACE_A[:2], COMPREFACE_OTHERS):
        result = verify(a, b)
        assert not result["match"], (a, b, result["similarity"], result["threshold"])
