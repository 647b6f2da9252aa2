"""Free dimensions for a graph exported at fixed ones (YuNet as published: batch 1, 640×640), built
in memory from the sha256-verified file, which stays untouched on disk.

The batch: the input's and outputs' first dimension becomes symbolic, and every Reshape whose
constant target starts with 1 copies the batch dimension instead (0 in ONNX Reshape). It is kept
only if the batched session reproduces the original, image by image, on a probe batch; otherwise
the model runs one image at a time as before.

The image size: the input's height and width and the outputs' inner dimensions become symbolic
(a fully convolutional graph whose reshapes keep -1 for the rows needs nothing else). It is kept
only if the freed session reproduces the original at the original size and, at each smaller size
the service will run, its outputs' row counts scale with the image's area; otherwise every image
is letterboxed to the original size as before.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

log = logging.getLogger("facegate.models")


def free_batch(model_bytes: bytes) -> bytes | None:
    """The graph with a symbolic batch dimension, or None when it has no fixed batch of 1 to free."""
    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    tensors = [*graph.input, *graph.output]
    if any(t.type.tensor_type.shape.dim[0].dim_value != 1 for t in tensors):
        return None
    for t in tensors:
        t.type.tensor_type.shape.dim[0].dim_param = "N"
    constants = {i.name: i for i in graph.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"})
    for node in graph.node:
        if node.op_type == "Reshape" and node.input[1] in constants:
            target = numpy_helper.to_array(constants[node.input[1]])
            if target.ndim == 1 and len(target) and target[0] == 1:
                constants[node.input[1]].CopyFrom(
                    numpy_helper.from_array(np.concatenate([[0], target[1:]]).astype(target.dtype), constants[node.input[1]].name)
                )
    del graph.value_info[:]  # stale batch-1 shapes; onnxruntime infers them again
    return model.SerializeToString()


def same_outputs(single: ort.InferenceSession, batched: ort.InferenceSession, batch: int = 2, atol: float = 1e-4) -> bool:
    """Whether `batched` on a probe batch gives each row what `single` gives that row alone."""
    spec = single.get_inputs()[0]
    rng = np.random.default_rng(0)
    probe = rng.uniform(0, 255, (batch, *spec.shape[1:])).astype(np.float32)
    try:
        together = batched.run(None, {spec.name: probe})
    except Exception as exc:  # onnxruntime's bare Fail types: the rewrite did not hold
        log.info("free batch dimension rejected: %s", exc)
        return False
    for i in range(batch):
        alone = single.run(None, {spec.name: probe[i : i + 1]})
        if any(t.shape[0] != batch or not np.allclose(t[i], a[0], atol=atol) for t, a in zip(together, alone, strict=True)):
            return False
    return True


def free_size(model_bytes: bytes) -> bytes | None:
    """The graph with a symbolic input height and width, or None when they are not fixed numbers."""
    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    dims = graph.input[0].type.tensor_type.shape.dim
    if len(dims) != 4 or not (dims[2].HasField("dim_value") and dims[3].HasField("dim_value")):
        return None
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    for out in graph.output:
        for i, dim in enumerate(out.type.tensor_type.shape.dim[1:-1], start=1):
            dim.dim_param = f"{out.name}_{i}"
    del graph.value_info[:]  # stale fixed-size shapes
    return model.SerializeToString()


def scales_with_area(fixed: ort.InferenceSession, freed: ort.InferenceSession, sizes: tuple[int, ...]) -> bool:
    """Whether `freed` gives `fixed`'s outputs at the fixed size and, at each square size of `sizes`,
    outputs whose row counts scale with the area (a size baked into a reshape fails here)."""
    spec = fixed.get_inputs()[0]
    if not same_outputs(fixed, freed, batch=1):
        return False
    channels, height, width = spec.shape[1:]
    reference = [t.shape for t in freed.run(None, {spec.name: np.zeros((1, channels, height, width), np.float32)})]
    for size in sizes:
        try:
            outputs = freed.run(None, {spec.name: np.zeros((1, channels, size, size), np.float32)})
        except Exception as exc:  # onnxruntime's bare Fail types: the rewrite did not hold at this size
            log.info("free image size rejected at %d: %s", size, exc)
            return False
        for t, ref in zip(outputs, reference, strict=True):
            if t.shape[2:] != ref[2:] or t.shape[1] * height * width != ref[1] * size * size:
                return False
    return True
