"""The pipeline CLI on real photos (needs FACEGATE_TEST_DATA and FACEGATE_MODEL_CACHE)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from service import cli
from service.core.settings import get_settings


@pytest.fixture
def run(cli_env):
    return lambda *args: cli_env(cli.app, *args)


@pytest.fixture
def lfw(test_data):
    return lambda name, n=1: test_data / "lfw" / name / f"{name}_{n:04d}.jpg"


def test_detect_prints_boxes_landmarks_scores(run, lfw):
    result = run("detect", lfw("Aaron_Peirsol"))
    assert result.exit_code == 0, result.output
    faces = json.loads(result.stdout)["faces"]
    assert len(faces) == 1
    x1, y1, x2, y2 = faces[0]["box"]
    assert 50 < x1 < x2 < 200 and 50 < y1 < y2 < 220  # LFW deep-funneled faces sit in the middle
    assert len(faces[0]["landmarks"]) == 5 and faces[0]["score"] > 0.8


def test_embed_writes_unit_vectors(run, lfw, tmp_path):
    out = tmp_path / "e.npy"
    result = run("embed", lfw("Aaron_Peirsol"), lfw("Aaron_Peirsol", 3), "--out", out)
    assert result.exit_code == 0, result.output
    matrix = np.load(out)
    assert matrix.shape == (2, 64)
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1, atol=1e-5)


def test_compare_same_image_is_one_and_different_images_less(run, lfw):
    same = json.loads(run("compare", lfw("Aaron_Peirsol"), lfw("Aaron_Peirsol")).stdout)
    assert same["similarity"] == pytest.approx(1.0, abs=1e-5)
    other = json.loads(run("compare", lfw("Aaron_Peirsol"), lfw("Abdullah_Gul")).stdout)
    assert other["similarity"] < 0.9999
    assert set(other["match_at_far"]) == {"1e-3", "1e-2"}


def test_bad_image_is_a_clean_error(run, tmp_path):
    fake = tmp_path / "photo.jpg"
    fake.write_text("not a photo")
    result = run("detect", fake)
    assert result.exit_code == 2 and "not a readable image" in result.output


def test_no_face_is_reported(run, tmp_path):
    blank = tmp_path / "blank.png"
    import cv2

    cv2.imwrite(str(blank), np.full((200, 200, 3), 128, np.uint8))
    result = run("embed", blank)
    assert result.exit_code == 2 and "no face" in result.output


def test_missing_embedder_names_the_setting(model_cache, monkeypatch, lfw):
    monkeypatch.setenv("FACEGATE_MODEL_CACHE", str(model_cache))
    monkeypatch.setenv("FACEGATE_EMBEDDER", "no-such-model")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli.app, ["embed", str(lfw("Aaron_Peirsol"))])
        assert result.exit_code == 2 and "no-such-model" in result.output
    finally:
        get_settings.cache_clear()


def installed_script() -> Path:
    """The `facegate` script pip wrote into this environment (make test installs the project)."""
    script = Path(sys.executable).with_name("facegate")
    assert script.is_file(), f"no console script at {script}: install the project (make install-test)"
    return script


def test_console_script_has_every_command():
    result = subprocess.run([sys.executable, installed_script(), "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("serve", "models", "detect", "embed", "compare", "bench", "heads", "align", "train", "eval", "export", "model-info"):
        assert command in result.stdout


def test_console_script_run_again_in_a_child_process_imports_no_command_line():
    """multiprocessing runs the main script again in every process it starts (the model host, each
    HTTP worker, each image decoder), as runpy does here: the `facegate` script may import there only
    its small entry module, not the command line's Typer, Rich and settings (23 MiB a decoder)."""
    code = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__mp_main__'); "
        "print(sorted(name for name in ('typer', 'rich', 'pydantic', 'service.cli') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code, installed_script()], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
