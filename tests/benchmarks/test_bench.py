"""`facegate bench`: the commands the benchmarks package registers on `facegate`."""

from __future__ import annotations

import pytest
import typer

from benchmarks.commands import register

app = typer.Typer()
register(app)


@pytest.fixture
def run(cli_env):
    return lambda *args: cli_env(app, *args)


def lfw(test_data, name: str, number: int = 1):
    return test_data / "lfw" / name / f"{name}_{number:04d}.jpg"


def test_bench_all_prints_the_whole_table(run, test_data):
    """Machine and versions, stages, embed scaling at the asked batch sizes, and HTTP load on a
    spawned server (a few requests: the figures are printed, never asserted)."""
    images = [lfw(test_data, "Aaron_Peirsol"), lfw(test_data, "George_W_Bush", 7), lfw(test_data, "Colin_Powell", 40)]
    result = run("bench", "all", *images, "--seconds", "0.01", "--batch", "1", "--batch", "3", "--concurrency", "2", "--requests", "2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "machine:" in out and "onnxruntime" in out and "numpy" in out and "opencv" in out
    assert "float32 NCHW input" in out and "IO binding off" in out
    for stage in ("decode", "detect", "align"):
        assert f"│ {stage}" in out
    scaling = out[out.index("embed batch scaling (") :]
    assert [line.split("│")[1].strip() for line in scaling.splitlines() if line.startswith("│")][:2] == ["1", "3"]
    assert "│ /verify" in out and "│ /identify" in out and out.count("200:2") == 2
    # The peer (face_recognition, which `make test` installs) on the same photos: both find the three faces.
    peer = out[out.index("the peer on the same") : out.index("HTTP load")]
    rows = {line.split("│")[1].strip(): line.split("│")[4].strip() for line in peer.splitlines() if line.startswith("│")}
    assert rows == {"facegate": "3", "face_recognition": "3"}, peer
    assert "facegate / face_recognition wall time:" in peer


def test_the_table_says_which_weights_the_embedder_runs():
    """The int8 model's manifest says how its weights were quantized on import; the others, how exported."""
    from benchmarks.bench import weights_description
    from service.core.models.manifest import Manifest
    from tests.conftest import REPO

    assert weights_description(Manifest.load(REPO / "models" / "dlib-resnet-v1-int8.json")) == "QInt8 (7-bit), activations QUInt8"
    assert weights_description(Manifest.load(REPO / "models" / "dlib-resnet-v1.json")) == "float32"


def test_bench_load_spawns_workers_with_their_model_host(run, test_data):
    """`facegate bench load`: the rows of a spawned `facegate serve --workers 2` (its model host
    running the models), /verify and what the generator offers against /healthz, every answer a 200."""
    images = [lfw(test_data, "Aaron_Peirsol"), lfw(test_data, "George_W_Bush", 7)]
    result = run(
        "bench", "load", *images, "--workers", "2", "--route", "verify", "--route", "healthz", "--concurrency", "2", "--seconds", "0.5"
    )
    assert result.exit_code == 0, result.output
    rows = [line.split("│")[1:-1] for line in result.stdout.splitlines() if line.startswith("│")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("2 workers + model host", "/verify"), ("2 workers + model host", "/healthz")]
    assert all(r[-1].strip().startswith("200:") and "," not in r[-1] for r in rows), rows
