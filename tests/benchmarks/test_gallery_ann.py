"""benchmarks/gallery_ann.py runs from a checkout: its faces come from FACEGATE_TEST_DATA through the
pipeline (cached under the model cache), a missing folder is one line naming it, and both kinds of
distractors give a table, with facegate's default search parameters printed as resolved. A small
run on a few LFW and training people: the figures are printed, never asserted, but the exact index
finds every exact answer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from service.gallery.index import default_ef_search, default_nprobe
from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gallery_ann.py"


def run(*args, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_a_missing_folder_is_one_line_naming_it(tmp_path, monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != "FACEGATE_TEST_DATA"}
    unset = run("--size", "1000", env=env)
    assert unset.returncode == 1 and unset.stderr.strip().splitlines() == [
        "gallery_ann.py: FACEGATE_TEST_DATA is not set (the folder holding train/ and lfw/, as for the tests); or pass --real FOLDER..."
    ]
    missing = run("--size", "1000", env={**env, "FACEGATE_TEST_DATA": str(tmp_path)})
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert f"no folder {tmp_path / 'train'}" in missing.stderr and "Traceback" not in missing.stderr


@pytest.fixture
def small_data(test_data, tmp_path):
    """FACEGATE_TEST_DATA's layout with 8 training people (CFP: 13–14 photos each) and 12 LFW people of several photos (links)."""
    for part, people in (("train", sorted((test_data / "train").glob("cfp_*"))[:8]), ("lfw", [])):
        (tmp_path / part).mkdir()
        for person in people:
            (tmp_path / part / person.name).symlink_to(person)
    lfw = [p for p in sorted((test_data / "lfw").iterdir()) if p.is_dir() and len(list(p.glob("*.jpg"))) > 2][:12]
    for person in lfw:
        (tmp_path / "lfw" / person.name).symlink_to(person)
    return tmp_path


def test_it_runs_from_a_checkout_with_either_distractors(small_data, model_cache, tmp_path):
    env = {**os.environ, "FACEGATE_TEST_DATA": str(small_data), "FACEGATE_MODEL_CACHE": str(model_cache), "FACEGATE_DEVICE": "cpu"}
    cache = tmp_path / "cache"
    for distractors in ("gaussian", "faces"):
        done = run(
            "--size", "500", "--queries", "10", "--indexes", "Flat", "HNSW16", "IVF4,Flat", "--params", "", "", "nprobe=1|",
            "--distractors", distractors, "--cache", cache, "--check-truth", "--new-photos", "10",
            env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        rows = {
            tuple(line.split()[:2]): line.split()
            for line in done.stdout.splitlines()
            if line.split()[:1] in (["Flat"], ["HNSW16"], ["IVF4,Flat"])
        }
        defaults = {("HNSW16", f"efSearch={default_ef_search(500)}"), ("IVF4,Flat", f"nprobe={default_nprobe(4)}")}
        assert set(rows) == {("Flat", "-"), ("IVF4,Flat", "nprobe=1")} | defaults, done.stdout
        flat = rows[("Flat", "-")]  # the exact index finds every one: mate@1, its check's faces as new photos, the check of the
        assert flat[-7] == flat[-3] == flat[-2] == flat[-1] == "1.000", flat  # people the new photos left alone, the new photos
        assert "new photos: 10 faces of the gallery's people, one per person" in done.stdout
        assert ("near copies of the training faces" if distractors == "faces" else "Gaussian") in done.stdout
    assert sorted(p.name.split("-")[0] for p in (cache / "crops").iterdir()) == ["lfw", "train"]  # aligned once, reused
    assert len(list((cache / "embeddings").glob("*.npy"))) == 3  # train, lfw, and the training faces' near copies
