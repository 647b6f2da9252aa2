"""`facegate calibrate`: the command writing a manifest the service still accepts, and its dry run."""

from __future__ import annotations

import json

import cv2
import numpy as np
import typer
from typer.testing import CliRunner

from service.core.models.files import load_model
from service.core.models.manifest import Manifest
from tests.onnx_models import write_test_embedder
from training.commands import register

app = typer.Typer()
register(app)


def aligned_folder(root, identities: int, per_identity: int):
    """Identity folders of 112×112 crops: each identity a random base image plus small noise."""
    rng = np.random.default_rng(0)
    for k in range(identities):
        base = cv2.resize(rng.integers(0, 256, (8, 8, 3)).astype(np.uint8), (112, 112), interpolation=cv2.INTER_CUBIC)
        folder = root / f"id{k:03d}"
        folder.mkdir(parents=True)
        for j in range(per_identity):
            noisy = np.clip(base.astype(int) + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)
            cv2.imwrite(str(folder / f"{j}.png"), noisy)


def test_calibrate_command_writes_thresholds_the_service_loads(tmp_path):
    manifest_path = write_test_embedder(tmp_path / "models")
    aligned_folder(tmp_path / "heldout", identities=50, per_identity=2)  # 4,900 impostor pairs
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path), "--data", str(tmp_path / "heldout")])
    assert result.exit_code == 0, result.output
    manifest = Manifest.load(manifest_path)
    assert list(manifest.thresholds) == ["1e-2"]  # 49 false accepts allowed; 1e-3 would allow 4
    report = manifest.metrics["calibration"]
    assert report["impostor_pairs"] == 4900 and report["genuine_pairs"] == 50 and report["identities"] == 50
    assert set(report["omitted"]) == {"1e-3", "1e-4", "1e-5"}
    assert report["realized"]["1e-2"]["far"] <= 0.01
    near = manifest.near_copy  # where the recall check's near copies start, the model's own
    assert (
        near is not None and 0 < near.cosine <= 1 and near.source.startswith("100 faces x 4 copies and 50 genuine pairs of all identities")
    )
    # the model file is untouched, so the service still accepts it with its new thresholds
    loaded = load_model(str(manifest_path), manifest_path.parent, manifest_path.parent, device="cpu")
    assert loaded.manifest.thresholds == manifest.thresholds


def test_dry_run_changes_nothing_and_a_model_without_a_split_needs_data(tmp_path):
    manifest_path = write_test_embedder(tmp_path / "models")
    before = manifest_path.read_bytes()
    aligned_folder(tmp_path / "heldout", identities=50, per_identity=2)
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path), "--data", str(tmp_path / "heldout"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert manifest_path.read_bytes() == before
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path)])
    assert result.exit_code == 2 and "--data" in result.output
    assert json.loads(manifest_path.read_bytes()) == json.loads(before)


def test_calibrate_cohort_writes_a_cohort_the_service_loads(tmp_path):
    """`facegate calibrate-cohort`: a third of the identities become the cohort, the others calibrate
    its curve; the written manifest loads for its embedder (and its license is the photos')."""
    from service.core.models.cohort import Cohort

    manifest_path = write_test_embedder(tmp_path / "models")
    aligned_folder(tmp_path / "people", identities=60, per_identity=2)
    out = tmp_path / "cohorts" / "mine"
    out.parent.mkdir()
    args = ["calibrate-cohort", str(manifest_path), "--data", str(tmp_path / "people"), "--out", str(out), "--top", "10"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code != 0 and "--license" in refused.output  # whose photos: no default
    result = CliRunner().invoke(app, [*args, "--license", "own photos, internal use"])
    assert result.exit_code == 0, result.output
    cohort = Cohort.load(out.with_suffix(".json"), Manifest.load(manifest_path))
    assert cohort.faces.shape == (40, 64) and cohort.manifest.top == 10 and cohort.manifest.license == {"name": "own photos, internal use"}
    assert cohort.manifest.metrics["calibration_identities"] == 40 and cohort.manifest.metrics["impostor_pairs"] == 80 * 79 // 2 - 40
    too_few = CliRunner().invoke(app, [*args[:-1], "500", "--license", "x"])
    assert too_few.exit_code != 0 and "fewer than top=500" in too_few.output


def test_calibrating_on_few_people_warns(tmp_path):
    """Eight held-out people were accepted without a word (issue 37): the command now says the
    thresholds are noisy and what to do, and still writes them."""
    manifest_path = write_test_embedder(tmp_path / "models")
    aligned_folder(tmp_path / "few", identities=8, per_identity=3)
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path), "--data", str(tmp_path / "few")])
    assert result.exit_code == 0, result.output
    assert "only 8 identities" in result.output and "--data ALIGNED_FOLDERS" in result.output
    aligned_folder(tmp_path / "many", identities=50, per_identity=2)
    result = CliRunner().invoke(app, ["calibrate", str(manifest_path), "--data", str(tmp_path / "many")])
    assert result.exit_code == 0 and "warning" not in result.output


def test_calibrate_open_set_writes_a_table_the_service_decides_with(tmp_path):
    """`facegate calibrate-open-set`: the margin score's table into the manifest, for the sizes the
    identities allow (50 left as strangers), one face and three per subject; the service loads it
    and decides /identify's FPIR on it; a dry run writes nothing; the embeddings are cached. With
    `--cosine-below 10` the margin decides from 10 subjects (by default from 31, beyond these rows)."""
    from service.core.decision import decide_search

    manifest_path = write_test_embedder(tmp_path / "models")
    aligned_folder(tmp_path / "heldout", identities=80, per_identity=4)
    args = [
        "calibrate-open-set",
        str(manifest_path),
        "--data",
        str(tmp_path / "heldout"),
        "--samples",
        "2000",
        "--cache",
        str(tmp_path / "cache"),
        "--cosine-below",
        "10",
    ]
    before = manifest_path.read_bytes()
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert manifest_path.read_bytes() == before and len(list((tmp_path / "cache").glob("*.npz"))) == 1
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = Manifest.load(manifest_path).open_set
    assert [rows.faces_per_subject for rows in table.tables] == [1, 3]
    assert table.tables[0].subjects == [1, 2, 3, 5, 7, 11, 15, 20, 30]  # 30 people enrolled leave 50 to probe as strangers
    assert table.fpirs == [0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005]  # 2,000 strangers: 10 above the threshold down to 5e-3
    assert table.calibration["identities"] == 80 and table.calibration["seed"] == 0
    loaded = load_model(str(manifest_path), manifest_path.parent, manifest_path.parent, device="cpu")
    decision = decide_search(loaded.manifest, 0.01, None, None, 11, 0.01)  # 11 subjects of one face: a row of the table
    assert decision.score == "margin" and decision.threshold == round(table.tables[0].thresholds[5][5], 6)
    # below 10 subjects the best cosine, held to its rows: for 1 and 3 faces per subject (nobody here has 5 or 10 photos)
    assert table.cosine_below == 10 and [rows.faces_per_subject for rows in table.cosine_tables] == [1, 3]
    assert table.cosine_tables[0].subjects == [1, 2, 3, 5, 7, 11]
    small = decide_search(loaded.manifest, 0.01, None, None, 5, 0.01)
    assert small.score == "cosine" and small.threshold == round(table.cosine_tables[0].thresholds[3][5], 6)


def test_calibrate_open_set_cosine_only_keeps_the_margin_rows(tmp_path):
    """`--cosine-only` (how a shipped manifest without small-gallery rows gets them): the manifest's
    margin rows and their calibration stay as they were, the cosine rows are those a whole
    calibration on the same identities makes, and their calibration is reported beside; a manifest
    without a table is refused, as is a sample count whose FPIRs differ from the table's."""
    manifest_path = write_test_embedder(tmp_path / "models")
    aligned_folder(tmp_path / "heldout", identities=80, per_identity=4)
    args = ["calibrate-open-set", str(manifest_path), "--data", str(tmp_path / "heldout"), "--cache", str(tmp_path / "cache")]
    refused = CliRunner().invoke(app, [*args, "--samples", "2000", "--cosine-only"])
    assert refused.exit_code != 0 and "without --cosine-only" in refused.output
    assert CliRunner().invoke(app, [*args, "--samples", "2000"]).exit_code == 0
    whole = Manifest.load(manifest_path).open_set
    manifest = Manifest.load(manifest_path)
    manifest.open_set = whole.model_copy(update={"cosine_below": 0, "cosine_tables": [], "calibration": {"source": "elsewhere"}})
    manifest.save(manifest_path)
    assert CliRunner().invoke(app, [*args, "--samples", "5000", "--cosine-only"]).exit_code != 0  # other FPIRs than the table's
    result = CliRunner().invoke(app, [*args, "--samples", "2000", "--cosine-only"])
    assert result.exit_code == 0, result.output
    table = Manifest.load(manifest_path).open_set
    assert table.tables == whole.tables and table.calibration["source"] == "elsewhere"
    assert table.cosine_below == 31 and table.cosine_tables == whole.cosine_tables  # the default: a home's 1-30 people
    assert table.calibration["cosine_rows"]["identities"] == 80

    # --template mean on the embeddings --cache kept (issue 46): the rows of the mean, named so, on the same draws
    (embedded,) = (tmp_path / "cache").glob("*.npz")
    args = ["calibrate-open-set", str(manifest_path), "--embeddings", str(embedded), "--samples", "2000", "--cosine-only"]
    result = CliRunner().invoke(app, [*args, "--template", "mean"])
    assert result.exit_code == 0, result.output
    mean = Manifest.load(manifest_path).open_set
    assert mean.cosine_template == "mean" and mean.tables == whole.tables and mean.cosine_tables != whole.cosine_tables
    np.testing.assert_allclose(mean.cosine_tables[0].thresholds, whole.cosine_tables[0].thresholds, atol=2e-6)  # one face: its own mean
    assert mean.calibration["cosine_rows"]["source"] == f"the embeddings in {embedded.name}"
