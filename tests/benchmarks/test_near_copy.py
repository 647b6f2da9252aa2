"""benchmarks/near_copy.py measures an embedder's near-copy bound (the manifest's `near_copy`, which the
index's recall check reads) from a checkout: a small run on a few training photos and LFW pairs
prints a block the manifest schema accepts, its figures consistent with one another."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from service.core.models.manifest import NearCopy
from tests.conftest import REPO


def test_it_prints_a_near_copy_block_the_manifest_takes(test_data, model_cache):
    env = {**os.environ, "FACEGATE_MODEL_CACHE": str(model_cache)}
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "near_copy.py"),
            "--embedder",
            "facegate-default",
            "--train",
            str(test_data / "train"),
            "--lfw",
            str(test_data / "lfw"),
            "--faces",
            "12",
            "--pairs",
            "12",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    block = NearCopy.model_validate(json.loads(run.stdout[run.stdout.index("{") :])["near_copy"])
    assert block.copies_reaching >= 0.7 and block.cosine <= block.copies_median  # the bound lies under most copies
    assert "training faces x 4 copies" in block.source and "LFW genuine pairs" in block.source
