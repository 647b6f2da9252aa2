"""Small ONNX models built in the tests, so the engine is tested without a trained network."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from service.core.fileio import sha256_file
from service.core.models.manifest import Manifest


def write_test_embedder(
    folder: Path,
    dim: int = 64,
    batch: int | str = "batch",
    color: str = "RGB",
    name: str = "test-embedder",
    size: int = 112,
    alignment: str = "arcface_112",
) -> Path:
    """size×size×3 → 8×8 average pool → fixed random projection → `dim` floats.

    Not a face model: it exists to test preprocessing, batching, normalization and manifests.
    `size` and `alignment` (a template in service.core.alignment.TEMPLATES) make a model that aligns
    differently from the default one.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    cell = size // 8  # an 8×8 grid of cells (a size not divisible by 8 leaves its last rows/columns out)
    rng = np.random.default_rng(0)
    projection = rng.standard_normal((3 * 8 * 8, dim)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("AveragePool", ["input"], ["pooled"], kernel_shape=[cell, cell], strides=[cell, cell]),
            helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "projection"], ["embedding"]),
        ],
        "test_embedder",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [batch, dim])],
        initializer=[numpy_helper.from_array(projection, "projection")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path = folder / f"{name}.onnx"
    onnx.save(model, onnx_path)
    manifest = Manifest(
        name=name,
        version="0",
        task="embedder",
        file={"name": onnx_path.name, "sha256": sha256_file(onnx_path), "bytes": onnx_path.stat().st_size},
        input={"name": "input", "shape": [batch, 3, size, size], "color": color, "mean": [127.5] * 3, "std": [127.5] * 3},
        outputs=[{"name": "embedding", "shape": [batch, dim]}],
        embedding_dim=dim,
        alignment=alignment,
        thresholds={"1e-3": 0.9, "1e-2": 0.8},
        license={"name": "test-only"},
    )
    path = folder / f"{name}.json"
    manifest.save(path)
    return path


def write_in_graph(manifest_path: Path, folder: Path) -> Path:
    """The model of `manifest_path` (float32 NCHW) with its preprocessing moved into the graph
    (uint8 NHWC input), saved with its manifest under `folder`."""
    import onnx

    from service.core.models.in_graph import in_graph_spec, uint8_nhwc_input

    manifest = Manifest.load(manifest_path)
    folder.mkdir(parents=True, exist_ok=True)
    onnx_path = folder / manifest.file.name
    onnx.save(uint8_nhwc_input(onnx.load(str(manifest_path.parent / manifest.file.name)), manifest.input), onnx_path)
    spec = in_graph_spec(manifest.input)
    file = manifest.file.model_copy(update={"sha256": sha256_file(onnx_path), "bytes": onnx_path.stat().st_size})
    path = folder / manifest_path.name
    manifest.model_copy(update={"input": spec, "file": file}).save(path)
    return path
