"""`facegate gallery reembed`: faces another model made are re-embedded from their stored crops."""

import os
import subprocess
import sys

import numpy as np

from service.core.alignment import template_chip
from service.core.models.manifest import EmbedderKey, Manifest
from service.gallery.interface import NewFace
from service.gallery.sqlite import SqliteGallery
from tests.conftest import REPO


def test_reembed_command(tmp_path, embedder_manifest, model_cache, pipeline):
    old = EmbedderKey("old-model", "0" * 64, 64)
    gallery = SqliteGallery.open(tmp_path, old)
    gallery.create_subject("A", {}, "a")
    vector = np.ones(64, np.float32) / 8
    crop = np.random.default_rng(0).integers(0, 256, (112, 112, 3), dtype=np.uint8)
    gallery.add_faces("a", [NewFace(vector, chip=template_chip(crop, "arcface_112")), NewFace(vector)])
    gallery.close()

    env = {
        **os.environ,
        "FACEGATE_DATA_DIR": str(tmp_path),
        "FACEGATE_EMBEDDER": str(embedder_manifest),
        "FACEGATE_MODEL_CACHE": str(model_cache),
        "FACEGATE_DEVICE": "cpu",
    }
    # app() rather than main(): this tests the service's command without loading training's.
    result = subprocess.run(
        [sys.executable, "-c", "from service.cli import app; app()", "gallery", "reembed"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "1 faces re-embedded" in result.stderr and "1 faces have no stored crop" in result.stderr

    manifest = Manifest.load(embedder_manifest)
    active = EmbedderKey(manifest.name, manifest.file.sha256, 64)
    gallery = SqliteGallery.open(tmp_path, active)
    assert gallery.index.size == 1 and gallery.counts()["incompatible_faces"] == 1
    expected = pipeline.embedder.embed(crop[None])[0]
    assert np.allclose(gallery.subject_embeddings("a")[0], expected, atol=1e-5)  # the crop's embedding, made now
    gallery.close()
