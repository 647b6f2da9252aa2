"""Preprocessing moved into the graph: a float32 NCHW model becomes one that takes uint8 pixels
(NHWC: the aligned RGB crops of an embedder, the BGR canvases of the detector) and does the cast,
channel order, mean/std and transpose itself. On a GPU that work then runs on the device, and a
quarter of the bytes cross the bus; on a CPU it costs what numpy did. `facegate export` writes it
into a new file (its manifest's input says uint8 NHWC); on a GPU provider the service wraps a
shipped float32 model in memory at load (service/core/models/files.py), after the file's sha256 is
checked: the same float32 arithmetic, so the same embeddings, and no `gallery reembed`."""

from __future__ import annotations

import numpy as np

from service.core.models.manifest import InputSpec


def in_graph_spec(spec: InputSpec) -> InputSpec:
    """The manifest input of the wrapped model: same name, colour order and mean/std, uint8 NHWC."""
    if spec.in_graph:
        raise ValueError("the input is already uint8 NHWC")
    batch, channels, height, width = spec.shape
    return spec.model_copy(update={"dtype": "uint8", "layout": "NHWC", "shape": [batch, height, width, channels]})


def uint8_nhwc_input(model, spec: InputSpec, feed_color: str = "RGB"):
    """`model` (an onnx.ModelProto taking `spec`, float32 NCHW) with uint8 NHWC pixels in
    `feed_color`'s channel order as its input: Cast → (other order: reverse channels) → Sub mean →
    Div std → Transpose, in front of the old graph. The arithmetic is numpy's
    (`service.core.models.embedder.normalize`), in float32 and the same order."""
    from onnx import TensorProto, checker, helper, numpy_helper

    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    (old,) = [i for i in graph.input if i.name not in initializers]
    if old.name != spec.name or old.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ValueError(f"the model's input is not the float32 {spec.name!r} the manifest describes")
    inner = f"{spec.name}_nchw"
    for node in graph.node:
        node.input[:] = [inner if name == spec.name else name for name in node.input]

    front, x = [], spec.name

    def add(op, inputs, **attrs):
        nonlocal x
        out = f"{spec.name}_{op.lower()}"
        front.append(helper.make_node(op, [x, *inputs], [out], name=out, **attrs))
        x = out

    def const(name, values, dtype):
        graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype), f"{spec.name}_{name}"))
        return f"{spec.name}_{name}"

    add("Cast", [], to=TensorProto.FLOAT)
    if spec.color != feed_color:
        add("Gather", [const("bgr", [2, 1, 0], np.int64)], axis=3)
    if spec.mean is not None:
        add("Sub", [const("mean", spec.mean, np.float32)])
        add("Div", [const("std", spec.std, np.float32)])
    add("Transpose", [], perm=[0, 3, 1, 2])
    front[-1].output[0] = inner
    nodes = front + list(graph.node)  # still topologically sorted: the front first
    del graph.node[:]
    graph.node.extend(nodes)

    batch, channels, height, width = (d.dim_param or d.dim_value for d in old.type.tensor_type.shape.dim)
    new_input = helper.make_tensor_value_info(spec.name, TensorProto.UINT8, [batch, height, width, channels])
    index = list(graph.input).index(old)
    graph.input.remove(old)
    graph.input.insert(index, new_input)
    checker.check_model(model)
    return model
