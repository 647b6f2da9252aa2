"""Raw photos → served model, through the commands a user runs: `facegate align`, `facegate train`
(resume included), `facegate export`, `facegate eval` on an LFW slice (checkpoint and ONNX agree),
and the service pipeline loading the export unchanged."""

from __future__ import annotations

import json
import shutil

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tests.training.tiny import TINY
from training.commands import register

pytestmark = pytest.mark.data


@pytest.fixture
def cli(monkeypatch, model_cache):
    from service.core.settings import get_settings

    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(model_cache))
    monkeypatch.setenv("FACEGATE_DEVICE", "cpu")
    get_settings.cache_clear()
    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    yield invoke
    get_settings.cache_clear()


def _lfw_slice(test_data, folder):
    """pairs.txt in LFW's format: 10 folds of 1 matched + 1 mismatched pair from View 2's first fold."""
    lines = (test_data / "lfw" / "pairs.txt").read_text().splitlines()
    matched, mismatched = lines[1:11], lines[301:311]
    body = [line for pair in zip(matched, mismatched, strict=True) for line in pair]
    (folder / "pairs.txt").write_text("10\t1\n" + "\n".join(body) + "\n")
    return folder / "pairs.txt"


def test_raw_photos_to_served_model(cli, test_data, tmp_path):
    raw = tmp_path / "raw"
    for identity in sorted(p.name for p in (test_data / "train").glob("cfp_*"))[:4]:
        (raw / identity).mkdir(parents=True)
        for image in sorted((test_data / "train" / identity).glob("*.jpg"))[:4]:
            shutil.copy(image, raw / identity)
    cli("align", raw, tmp_path / "aligned", "--workers", "1")
    assert len(list((tmp_path / "aligned").rglob("*.jpg"))) == 16

    config = {
        **TINY,
        "data": {**TINY["data"], "train": str(tmp_path / "aligned"), "license": {"name": "CFP", "terms": "research use only"}},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    cli("train", tmp_path / "tiny.yaml", "--set", f"output={run}", "--set", "steps=3")
    cli("train", tmp_path / "tiny.yaml", "--set", f"output={run}", "--set", "steps=4", "--resume", run / "last.pt")
    from training.checkpoint import load_checkpoint

    assert load_checkpoint(run / "last.pt")["step"] == 4

    pairs = _lfw_slice(test_data, tmp_path)
    cache = tmp_path / "cache"
    ckpt = json.loads(
        cli("eval", run / "last.pt", "--pairs", pairs, "--images", test_data / "lfw", "--cache", cache, "--out", tmp_path / "eval.json")
    )
    assert 20 < ckpt["images"] <= 40 and ckpt["flip"]["pairs"] == 20 and len(list(cache.iterdir())) == 1

    models = tmp_path / "models"
    cli(
        "export",
        run / "last.pt",
        "--out",
        models / "tiny-face.onnx",
        "--eval",
        tmp_path / "eval.json",
        "--license",
        "test photos",
        "--license-terms",
        "research use only",
    )
    onnx = json.loads(cli("eval", models / "tiny-face.json", "--pairs", pairs, "--images", test_data / "lfw", "--cache", cache, "--record"))
    # the same figures up to float noise: a 4-step model's scores on 20 pairs are packed so tightly
    # that noise may swap two pairs' order (test_eval compares the embeddings themselves)
    for key in ("flip", "no_flip"):
        assert onnx[key]["accuracy"] == pytest.approx(ckpt[key]["accuracy"], abs=2 / 20 + 1e-9)
        assert onnx[key]["auc"] == pytest.approx(ckpt[key]["auc"], abs=2 / 20 + 1e-9)

    from service.core.models.manifest import Manifest
    from service.core.pipeline import FacePipeline
    from service.core.settings import Settings

    manifest = Manifest.load(models / "tiny-face.json")
    # `eval --record` replaced the export's (checkpoint) figures with the exported model's own
    assert manifest.metrics["flip"] == onnx["flip"] and manifest.license == {"name": "test photos", "terms": "research use only"}
    settings = Settings(models_dir=models, model_cache=Settings().model_cache, embedder="tiny-face", device="cpu")
    shutil.copy(Settings().models_dir / "face_detection_yunet_2023mar.json", models)
    face = FacePipeline.from_settings(settings).embed_file(test_data / "lfw" / "Aaron_Peirsol" / "Aaron_Peirsol_0001.jpg")
    assert face.embedding.shape == (32,) and abs(float((face.embedding**2).sum()) - 1) < 1e-5
