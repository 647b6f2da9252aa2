"""Free batch and image-size dimensions for YuNet, built in memory and kept only when they reproduce the original."""

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from service.core.models.providers import Runtime, create_session
from service.core.models.rebatch import free_batch, free_size, same_outputs, scales_with_area

CPU = Runtime(device="cpu")


def test_yunet_gets_a_free_batch_dimension_with_the_same_outputs(model_cache):
    path = Path(model_cache) / "face_detection_yunet_2023mar.onnx"
    data = path.read_bytes()
    graph = free_batch(data)
    assert graph is not None and path.read_bytes() == data  # the file is untouched
    single, batched = create_session(path, CPU), create_session(graph, CPU)
    assert single.get_inputs()[0].shape[0] == 1 and batched.get_inputs()[0].shape[0] == "N"
    assert same_outputs(single, batched, batch=3)
    assert free_batch(graph) is None  # nothing fixed left to free


def _transposing_model() -> bytes:
    """input [1,2,3] → Transpose(1,0,2) → Reshape [1,-1]: the leading 1 of its Reshape is not the batch."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["input"], ["t"], perm=[1, 0, 2]), helper.make_node("Reshape", ["t", "shape"], ["output"])],
        "transposing",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2, 3])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 6])],
        initializer=[numpy_helper.from_array(np.array([1, -1], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_rewrite_that_mixes_images_is_rejected():
    data = _transposing_model()
    graph = free_batch(data)
    assert graph is not None
    assert not same_outputs(create_session(data, CPU), create_session(graph, CPU))


def test_the_service_loads_the_detector_batched_at_a_free_size(settings):
    from service.core.models.model_set import load_models

    models = load_models(settings)
    assert models.detector.session.get_inputs()[0].shape == ["N", 3, "H", "W"]


def test_yunet_gets_a_free_image_size_with_the_same_outputs(model_cache):
    path = Path(model_cache) / "face_detection_yunet_2023mar.onnx"
    batched = free_batch(path.read_bytes())
    graph = free_size(batched)
    assert graph is not None
    fixed, freed = create_session(batched, CPU), create_session(graph, CPU)
    assert freed.get_inputs()[0].shape == ["N", 3, "H", "W"]
    assert scales_with_area(fixed, freed, (320, 480, 640))
    assert free_size(graph) is None  # nothing fixed left to free


def _size_baked_model() -> bytes:
    """input [1,1,4,4] → Reshape [1,16,1]: the row count is the 4×4 size written as a constant."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["input", "shape"], ["output"])],
        "baked",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 16, 1])],
        initializer=[numpy_helper.from_array(np.array([1, 16, 1], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_size_baked_into_the_graph_is_rejected():
    data = _size_baked_model()
    graph = free_size(data)
    assert graph is not None
    assert not scales_with_area(create_session(data, CPU), create_session(graph, CPU), (2,))
