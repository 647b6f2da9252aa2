"""A free batch dimension for a graph exported with a fixed batch of 1 (YuNet as published), built
in memory from the sha256-verified file, which stays untouched on disk.

The rewrite: the input's and outputs' first dimension becomes symbolic, and every Reshape whose
constant target starts with 1 copies the batch dimension instead (0 in ONNX Reshape). It is kept
only if the batched session reproduces the original, image by image, on a probe batch; otherwise
the model runs one image at a time as before.
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
                constants[node.input[1]].CopyFrom(numpy_helper.from_array(np.concatenate([[0], target[1:]]).astype(target.dtype), constants[node.input[1]].name))
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
        if any(t.shape[0] != batch or not np.allclose(t[i], a[0], atol=atol) for t, a in zip(together, alone)):
            return False
    return True
