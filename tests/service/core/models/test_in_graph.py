"""Preprocessing in the graph (uint8 NHWC input) gives the embeddings of the numpy path (float32
NCHW input) to 1e-5, for either colour order; the manifest says which form a model takes, and a
manifest without the fields is the older form."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from service.core.errors import ModelError
from service.core.models.embedder import FaceEmbedder, preprocess, uses_io_binding
from service.core.models.files import load_model
from service.core.models.manifest import InputSpec, Manifest
from tests.onnx_models import write_in_graph, write_test_embedder


def _load(manifest_path) -> FaceEmbedder:
    loaded = load_model(str(manifest_path), manifest_path.parent, manifest_path.parent, device="cpu")
    return FaceEmbedder(loaded.manifest, loaded.session, batch_sizes=[8])


def _crops(n, size=112, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("color", ["RGB", "BGR"])
def test_in_graph_matches_numpy_path(tmp_path, color):
    numpy_form = write_test_embedder(tmp_path / "numpy", color=color)
    graph_form = write_in_graph(numpy_form, tmp_path / "graph")
    a, b = _load(numpy_form), _load(graph_form)
    assert not a.manifest.input.in_graph and b.manifest.input.in_graph
    assert b.manifest.input.shape == ["batch", 112, 112, 3] and b.manifest.input.color == color
    crops = _crops(19)  # three runs of 8, the last padded
    assert preprocess(crops, b.manifest.input).dtype == np.uint8
    assert np.abs(a.raw(crops) - b.raw(crops)).max() <= 1e-5 * np.abs(a.raw(crops)).max()
    assert np.abs(a.embed(crops) - b.embed(crops)).max() <= 1e-5


def test_bgr_graph_swaps_channels(tmp_path):
    """The colour order is not a no-op: the RGB and BGR models disagree on a coloured crop."""
    rgb = _load(write_in_graph(write_test_embedder(tmp_path / "rgb"), tmp_path / "rgb-graph"))
    bgr = _load(write_in_graph(write_test_embedder(tmp_path / "bgr", color="BGR"), tmp_path / "bgr-graph"))
    crops = _crops(2)
    assert np.abs(rgb.embed(crops) - bgr.embed(crops)).max() > 0.01


def test_dlib_model_in_graph_matches_numpy_path(dlib_model, tmp_path):
    """The default embedder (a 29-layer ResNet) with its preprocessing moved into the graph."""
    from tests.conftest import REPO

    folder = tmp_path / "numpy"
    folder.mkdir()
    (folder / "dlib-resnet-v1.json").write_bytes((REPO / "models" / "dlib-resnet-v1.json").read_bytes())
    (folder / dlib_model.name).symlink_to(dlib_model)
    a, b = _load(folder / "dlib-resnet-v1.json"), _load(write_in_graph(folder / "dlib-resnet-v1.json", tmp_path / "graph"))
    crops = _crops(4, size=150)
    assert np.abs(a.embed(crops) - b.embed(crops)).max() <= 1e-5


def test_older_manifest_is_float32_nchw(tmp_path):
    path = write_test_embedder(tmp_path)
    data = json.loads(path.read_text())
    data["input"].pop("layout"), data["input"].pop("dtype")
    path.write_text(json.dumps(data))
    spec = Manifest.load(path).input
    assert (spec.dtype, spec.layout, spec.in_graph, spec.height) == ("float32", "NCHW", False, 112)


@pytest.mark.parametrize("dtype, layout", [("float32", "NHWC"), ("uint8", "NCHW")])
def test_other_forms_are_refused(dtype, layout):
    with pytest.raises(ValueError, match="float32 NCHW .* or uint8 NHWC"):
        InputSpec(name="input", shape=["batch", 3, 112, 112], color="RGB", dtype=dtype, layout=layout)


def test_uint8_shape_is_nhwc():
    with pytest.raises(ValueError, match="3 colour channels"):
        InputSpec(name="input", shape=["batch", 3, 112, 112], color="RGB", dtype="uint8", layout="NHWC")


def test_manifest_that_misstates_the_input_type_is_refused(tmp_path):
    """A float32 model whose manifest claims uint8 NHWC: refused at load, not fed the wrong array."""
    path = write_test_embedder(tmp_path)
    manifest = Manifest.load(path)
    manifest.model_copy(
        update={"input": manifest.input.model_copy(update={"dtype": "uint8", "layout": "NHWC", "shape": ["batch", 112, 112, 3]})}
    ).save(path)
    with pytest.raises(ModelError, match="input"):
        load_model(str(path), tmp_path, tmp_path, device="cpu")


def test_io_binding_on_gpu_providers_only(tmp_path):
    assert uses_io_binding(["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert uses_io_binding(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    assert not uses_io_binding(["CPUExecutionProvider"])
    embedder = _load(write_in_graph(write_test_embedder(tmp_path / "m"), tmp_path / "g"))
    assert not embedder.io_binding  # a CPU session runs plainly
    batch = preprocess(_crops(3), embedder.manifest.input)
    np.testing.assert_array_equal(embedder.run_bound(batch), embedder.run(batch))


class _ReportsCuda:
    """A CPU session that says it runs on CUDA: load_model then takes its GPU path (preprocessing
    wrapped into the graph, free dimensions checked on CPU sessions), which this host can run."""

    def __init__(self, session):
        self._session = session

    def get_providers(self):
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def __getattr__(self, name):
        return getattr(self._session, name)


@pytest.fixture
def gpu_path(monkeypatch):
    """Call it to make the models loaded after it take the GPU path."""
    from service.core.models import files

    real = files.create_session
    return lambda: monkeypatch.setattr(files, "create_session", lambda model, runtime=None: _ReportsCuda(real(model, runtime)))


@pytest.mark.data
def test_on_a_gpu_the_detector_takes_uint8_canvases_and_finds_the_same_faces(gpu_path, lfw_faces, settings):
    """YuNet, its batch and image size freed and its cast and transpose moved into the graph (the
    GPU path), finds on real photos at every size and batch the faces the float32 graph finds."""
    from service.core.models.detector import FaceDetector
    from service.core.models.model_set import load_models

    reference = load_models(settings).detector  # the CPU path: the shipped float32 input
    gpu_path()
    wrapped = load_models(settings).detector
    assert wrapped is not None and reference is not None
    spec = wrapped.session.get_inputs()[0]
    assert spec.type == "tensor(uint8)" and isinstance(spec.shape[0], str) and spec.shape[3] == 3 and isinstance(spec.shape[1], str)
    assert reference.session.get_inputs()[0].type == "tensor(float)"
    sizes = tuple(settings.detect_sizes)
    a = FaceDetector(wrapped.manifest, wrapped.session, sizes=sizes, batch_sizes=[1, 4])
    b = FaceDetector(reference.manifest, reference.session, sizes=sizes, batch_sizes=[1, 4])
    assert a.uint8_input and not b.uint8_input and a.sizes == b.sizes == sizes
    images = [cv2.imdecode(np.frombuffer(photo, np.uint8), cv2.IMREAD_COLOR) for photos in lfw_faces.values() for photo in photos]
    for size in sizes:
        canvases = np.stack([a.letterbox(image, size)[0] for image in images])
        for got, want in zip(a.infer(canvases), b.infer(canvases), strict=True):
            assert got.shape == want.shape and len(got) > 0
            assert np.allclose(got, want, atol=1e-3)


def test_on_a_gpu_a_float32_embedder_is_wrapped_to_take_uint8_crops(gpu_path, dlib_model, tmp_path):
    """The shipped dlib-resnet-v1 (float32 NCHW, preprocessing in numpy) is wrapped at load on a GPU:
    same file, same sha256, same embeddings, its preprocessing run by the provider."""
    from tests.conftest import REPO

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "dlib-resnet-v1.json").write_bytes((REPO / "models" / "dlib-resnet-v1.json").read_bytes())
    (folder / dlib_model.name).symlink_to(dlib_model)
    reference = _load(folder / "dlib-resnet-v1.json")
    gpu_path()
    loaded = load_model("dlib-resnet-v1", folder, folder, feed_color="RGB")
    embedder = FaceEmbedder(loaded.manifest, loaded.session, batch_sizes=[4])
    assert embedder.in_graph and not loaded.manifest.input.in_graph and embedder.io_binding
    crops = _crops(5, size=150)
    assert np.abs(embedder.embed(crops) - reference.embed(crops)).max() <= 1e-5


def test_on_a_gpu_each_input_shape_runs_on_a_session_of_its_own(gpu_path, settings):
    """A CUDA session whose input shape changes between runs rebuilds its cuDNN plans on the CPU each
    time: on a GPU every batch size (and detector image size) has its own session, the same graph."""
    from service.core.pipeline import FacePipeline

    settings = settings.model_copy(update={"batch_sizes": [1, 4], "detect_batch_sizes": [1, 2], "detect_sizes": [320, 640]})
    reference = FacePipeline.from_settings(settings)
    gpu_path()
    pipeline = FacePipeline.from_settings(settings)
    embedder, detector = pipeline.require_embedder(), pipeline.detector
    assert reference.require_embedder().sessions == {} and reference.detector.sessions == {}  # a CPU needs none
    assert set(embedder.sessions) == {1, 4} and len({id(s) for s in embedder.sessions.values()} | {id(embedder.session)}) == 3
    assert set(detector.sessions) == {(1, 320), (2, 320), (1, 640), (2, 640)}
    seen = {}
    for key, session in [*embedder.sessions.items(), *detector.sessions.items()]:
        spy = _Spy(session)
        seen[key] = spy.shapes
        (embedder.sessions if isinstance(key, int) else detector.sessions)[key] = spy
    crops = _crops(3, size=embedder.size[0])
    assert np.abs(embedder.embed(crops) - reference.require_embedder().embed(crops)).max() <= 1e-5
    detector.infer(np.zeros((2, 640, 640, 3), np.uint8))
    detector.infer(np.zeros((1, 320, 320, 3), np.uint8))
    assert seen[4] and all(s[0] == 4 for s in seen[4]) and not seen[1]  # 3 crops run padded to 4, on the 4's session
    assert seen[2, 640] and seen[1, 320] and not seen[1, 640] and not seen[2, 320]


class _Spy:
    def __init__(self, session):
        self._session, self.shapes = session, []

    def run(self, names, feed, *args):
        self.shapes += [v.shape for v in feed.values()]
        return self._session.run(names, feed, *args)

    def io_binding(self):
        return _SpyBinding(self, self._session.io_binding())

    def run_with_iobinding(self, binding, *args):
        return self._session.run_with_iobinding(binding.binding, *args)

    def __getattr__(self, name):
        return getattr(self._session, name)


class _SpyBinding:
    def __init__(self, spy, binding):
        self.spy, self.binding = spy, binding

    def bind_cpu_input(self, name, value):
        self.spy.shapes.append(value.shape)
        self.binding.bind_cpu_input(name, value)

    def __getattr__(self, name):
        return getattr(self.binding, name)
