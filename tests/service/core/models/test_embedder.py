import numpy as np

from service.core.models.embedder import FaceEmbedder, preprocess
from service.core.models.files import load_model
from service.core.models.manifest import Manifest
from tests.onnx_models import write_test_embedder


def _embedder(tmp_path, **kw) -> FaceEmbedder:
    loaded = load_model(str(write_test_embedder(tmp_path, **kw)), tmp_path, tmp_path, device="cpu")
    return FaceEmbedder(loaded.manifest, loaded.session, batch_sizes=[1, 4])


def _crops(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 112, 112, 3), dtype=np.uint8)


def test_embeddings_have_unit_norm(tmp_path):
    out = _embedder(tmp_path).embed(_crops(5))
    assert out.shape == (5, 64) and out.dtype == np.float32
    assert np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-6)


def test_batch_equals_singles_across_chunking(tmp_path):
    embedder = _embedder(tmp_path)
    crops = _crops(11)  # runs of 4, 4 and 3 padded to 4
    batched = embedder.embed(crops)
    singles = np.stack([embedder.embed(c)[0] for c in crops])
    assert np.allclose(batched, singles, atol=1e-5)


def test_fixed_batch_model_runs_one_at_a_time(tmp_path):
    embedder = _embedder(tmp_path, batch=1)
    assert embedder.shapes.sizes == (1,)  # the configured [1, 4] give way to the graph's fixed batch
    assert embedder.embed(_crops(3)).shape == (3, 64)


def test_the_session_only_sees_its_batch_shapes(tmp_path):
    """Every run is at one of the configured sizes, whoever calls: the service's engine, the CLI or
    training's evaluation (one place decides, so a GPU only meets shapes it warmed)."""
    embedder = _embedder(tmp_path)
    seen, run = [], embedder.run
    embedder.run = lambda batch: seen.append(len(batch)) or run(batch)
    assert embedder.embed(_crops(11)).shape == (11, 64)
    assert seen == [4, 4, 4]


def test_empty_input_gives_empty_output(tmp_path):
    assert _embedder(tmp_path).embed(np.zeros((0, 112, 112, 3), np.uint8)).shape == (0, 64)


def test_preprocess_follows_the_manifest(tmp_path):
    manifest = Manifest.load(write_test_embedder(tmp_path / "rgb"))
    crop = np.zeros((1, 112, 112, 3), np.uint8)
    crop[..., 0] = 255  # pure red in RGB
    x = preprocess(crop, manifest.input)
    assert x.shape == (1, 3, 112, 112)
    assert np.allclose(x[0, 0], 1.0) and np.allclose(x[0, 2], -1.0)
    bgr = Manifest.load(write_test_embedder(tmp_path / "bgr", color="BGR"))
    assert np.allclose(preprocess(crop, bgr.input)[0, 2], 1.0)  # red moves to the last channel
