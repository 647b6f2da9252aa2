"""The shipped default embedder, models/facegate-default: its file matches its manifest, the manifest
carries what a deployer needs (calibrated thresholds, terms, measured accuracy), and the accuracy it
claims holds on a fold of LFW through the full pipeline (decode → YuNet → align → embed)."""

from __future__ import annotations

import numpy as np
import pytest

from service.models.manifest import Manifest
from service.models.store import sha256_file
from tests.conftest import REPO
from training.evaluate import read_lfw_pairs

MANIFEST = REPO / "models" / "facegate-default.json"


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return Manifest.load(MANIFEST)


def test_file_matches_manifest(manifest):
    path = MANIFEST.with_name(manifest.file.name)
    assert path.stat().st_size == manifest.file.bytes <= 20 * 2**20
    assert sha256_file(path) == manifest.file.sha256


def test_manifest_is_complete(manifest):
    assert manifest.task == "embedder" and manifest.alignment == "arcface_112"
    # calibrated on held-out training identities, never on LFW
    calibration = manifest.metrics["calibration"]
    assert "held-out identities" in calibration["source"]
    assert {"1e-2", "1e-3", "1e-4"} <= set(manifest.thresholds)
    assert set(manifest.thresholds) | set(calibration["omitted"]) == {"1e-2", "1e-3", "1e-4", "1e-5"}
    ordered = [manifest.thresholds[k] for k in sorted(manifest.thresholds, key=float, reverse=True)]
    assert ordered == sorted(ordered), "a lower FAR needs a higher threshold"
    assert "non-commercial" in manifest.license["terms"]
    assert manifest.provenance["config"]["data"]["val_fraction"] > 0 and manifest.metrics["set"] == "lfw"


@pytest.mark.data
def test_lfw_fold_accuracy_holds_through_the_pipeline(manifest, test_data, model_cache):
    """The first of LFW's ten folds (600 pairs), scored at the manifest's LFW threshold."""
    from service.pipeline import FacePipeline
    from service.settings import Settings

    pipeline = FacePipeline.from_settings(Settings(model_cache=model_cache, embedder="facegate-default", device="cpu"))
    pairs, issame, folds = read_lfw_pairs(test_data / "lfw" / "pairs.txt")
    fold = [p for p, f in zip(pairs, folds) if f == 0]
    same = issame[folds == 0]
    cache: dict[tuple[str, int], np.ndarray] = {}

    def embedding(name: str, number: int) -> np.ndarray:
        if (name, number) not in cache:
            cache[(name, number)] = pipeline.embed_file(test_data / "lfw" / name / f"{name}_{number:04d}.jpg").embedding
        return cache[(name, number)]

    scores = np.array([float(embedding(a, ia) @ embedding(b, ib)) for a, ia, b, ib in fold])
    served = manifest.metrics["no_flip"]  # the model as exported (flip-TTA, if any, is inside it)
    accuracy = float(((scores >= served["threshold"]) == same).mean())
    assert accuracy >= served["accuracy"] - 0.015, (accuracy, served["accuracy"])


@pytest.mark.data
def test_the_service_serves_it_by_default(manifest, model_cache, test_data, tmp_path, make_client):
    """No FACEGATE_EMBEDDER: the app loads the shipped file, and /verify decides with its calibrated thresholds."""
    from service.settings import Settings

    api = make_client(Settings(model_cache=model_cache, data_dir=tmp_path / "gallery", device="cpu"))
    ready = api.get("/readyz").json()
    assert ready["models"]["embedder"]["name"] == "facegate-default"
    assert ready["models"]["embedder"]["sha256"] == manifest.file.sha256
    photo = sorted((test_data / "lfw" / "George_W_Bush").glob("*.jpg"))[0].read_bytes()
    for far in ("1e-2", "1e-3", "1e-4"):
        result = api.post("/verify", files={"image1": photo, "image2": photo}, data={"far": far}).json()
        assert result["threshold"] == manifest.thresholds[far] and result["match"] and result["model"]["name"] == "facegate-default"
