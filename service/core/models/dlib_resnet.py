"""Read dlib's face recognition ResNet (dlib_face_recognition_resnet_model_v1.dat, public domain)
with numpy only, and export it to ONNX: `facegate models pull dlib-resnet-v1` runs this on the
user's machine, so no converted weights are redistributed and neither dlib nor torch is needed.

The .dat file is dlib's own binary serialization of its inference network type
(loss_metric + affine, i.e. batch norm already folded by dlib into a per-channel
scale/shift).  `read_dat` turns it into a framework-neutral description
(`DlibResNet`): a stem, a list of residual blocks and a final linear layer.  `to_onnx`
turns that description into an ONNX graph whose output matches dlib's
`compute_face_descriptor` to float32 rounding.

Network input: 150x150 RGB, NCHW float32, already normalised as dlib does:
(pixel - mean_rgb[c]) / 256.  Output: the raw 128-D descriptor (not normalised).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from service.core.fileio import sha256_file

if TYPE_CHECKING:
    import onnx

# ---------------------------------------------------------------------------
# Framework-neutral description
# ---------------------------------------------------------------------------


@dataclass
class Conv:
    weight: np.ndarray  # (out, in, kh, kw) float32, cross-correlation like ONNX/torch
    bias: np.ndarray  # (out,) float32
    stride: int
    pad: int  # symmetric zero padding (dlib: k//2 if stride==1 else 0)


@dataclass
class Affine:
    """dlib affine_ (batch norm folded at save time): y = scale[c] * x + shift[c]."""

    scale: np.ndarray  # (C,) float32
    shift: np.ndarray  # (C,) float32


@dataclass
class Pool:
    kind: str  # "max" or "avg"
    kernel: int
    stride: int
    pad: int


@dataclass
class Block:
    """relu(add_prev(conv2/bn2(relu(bn1(conv1(x)))), shortcut(x))).

    shortcut is x itself, or `down` (2x2/2 avg pool) when the block downsamples.
    dlib's add_prev zero-pads the smaller operand to the larger one's shape
    (channels at the end, rows/cols at the bottom/right) before adding.
    """

    conv1: Conv
    bn1: Affine
    conv2: Conv
    bn2: Affine
    down: Pool | None = None


def add_prev_pads(shape: tuple[int, ...], target: tuple[int, ...]) -> list[int]:
    """dlib's add_prev zero-pads each operand to the elementwise larger (C, H, W) shape, at the end
    of every axis: the trailing pad per axis of `shape` up to `target`.  One rule for every backend."""
    return [t - s for s, t in zip(shape, target, strict=True)]


def add_prev_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The shape add_prev's two operands are padded to before they are added."""
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


@dataclass
class DlibResNet:
    mean_rgb: tuple[float, float, float]  # subtract, then divide by 256
    input_size: int  # 150
    stem_conv: Conv
    stem_bn: Affine
    stem_pool: Pool  # after relu
    blocks: list[Block]
    fc_weight: np.ndarray  # (128, 256): y = mean_hw(x) @ fc_weight.T, no bias

    def stages(self) -> list[list[Block]]:
        """The blocks grouped by resolution: a new stage starts at each downsampling block (dlib's
        level4 … level0: 3, 4, 3, 3 and 1 blocks)."""
        groups: list[list[Block]] = []
        for blk in self.blocks:
            if blk.down is not None or not groups:
                groups.append([])
            groups[-1].append(blk)
        return groups


# ---------------------------------------------------------------------------
# dlib serialization primitives (dlib/serialize.h, dlib/cuda/tensor.h)
# ---------------------------------------------------------------------------


class _Stream:
    def __init__(self, data: bytes):
        self.b, self.i = data, 0

    def int(self) -> int:
        """Control byte (low nibble = byte count, 0x80 = negative), then LE bytes."""
        ctrl = self.b[self.i]
        n = ctrl & 0x0F
        v = int.from_bytes(self.b[self.i + 1 : self.i + 1 + n], "little")
        self.i += 1 + n
        return -v if ctrl & 0x80 else v

    def float(self) -> float:
        """float_details: int64 mantissa, int16 exponent; value = m * 2**e."""
        if self.b[self.i] & 0x70:
            raise ValueError("old ASCII float encoding not supported")
        m, e = self.int(), self.int()
        if e >= 32000:
            raise ValueError("inf/nan in header field")
        return float(np.ldexp(float(m), e))

    def bool(self) -> bool:
        c = self.b[self.i : self.i + 1]
        self.i += 1
        if c not in (b"0", b"1"):
            raise ValueError(f"bad bool at {self.i - 1}")
        return c == b"1"

    def text(self) -> str:
        n = self.int()
        s = self.b[self.i : self.i + n].decode("ascii")
        self.i += n
        return s

    def peek_text(self) -> str:
        pos = self.i
        try:
            return self.text()
        except (UnicodeDecodeError, IndexError):
            return ""
        finally:
            self.i = pos

    def tensor(self) -> np.ndarray:
        """resizable_tensor v2: 4 ints (n,k,nr,nc) then little-endian float32."""
        if self.int() != 2:
            raise ValueError("unexpected tensor version")
        shape = tuple(self.int() for _ in range(4))
        count = int(np.prod(shape))
        a = np.frombuffer(self.b, "<f4", count, self.i).reshape(shape).astype(np.float32)
        self.i += 4 * count
        return a

    def alias_tensor(self) -> tuple:
        if self.int() != 1:
            raise ValueError("unexpected alias_tensor version")
        return tuple(self.int() for _ in range(4))


def _read_layer(s: _Stream) -> dict:
    """One layer's `details` record, identified by its version string.

    Only the record versions present in dlib_face_recognition_resnet_model_v1.dat
    are accepted (con_4, affine_, relu_, max_pool_2, avg_pool_2, add_prev_, fc_2);
    anything else raises, rather than being guessed at.
    """
    name = s.text()
    if name == "con_4":
        params = s.tensor().ravel()
        nf, nr, nc, sy, sx, py, px = (s.int() for _ in range(7))
        fshape, _ = s.alias_tensor(), s.alias_tensor()
        for _ in range(4):
            s.float()  # learning-rate / weight-decay multipliers
        if sy != sx or py != px or nr != nc:
            raise ValueError("non-square conv not supported")
        nw = int(np.prod(fshape))  # params = filters (nf,k,nr,nc) then biases (nf)
        return {"kind": "con", "conv": Conv(params[:nw].reshape(fshape).copy(), params[nw : nw + nf].copy(), sy, py)}
    if name == "affine_":
        # The file already holds dlib's inference-time affine_ (batch norm folded by
        # dlib at save time): params = gamma (scale) then beta (shift), one per channel.
        params = s.tensor().ravel()
        g_shape, _ = s.alias_tensor(), s.alias_tensor()
        if s.int() != 0:  # layer_mode: CONV_MODE
            raise ValueError("expected a per-channel (CONV_MODE) affine layer")
        k = int(np.prod(g_shape))
        return {"kind": "bn", "affine": Affine(params[:k].copy(), params[k : 2 * k].copy())}
    if name == "relu_":
        return {"kind": "relu"}
    if name in ("max_pool_2", "avg_pool_2"):
        nr, nc, sy, sx, py, px = (s.int() for _ in range(6))
        if nr != nc or sy != sx or py != px:
            raise ValueError("non-square pooling not supported")
        return {"kind": name[:-7] + "_pool", "pool": Pool(name[:3], nr, sy, py)}
    if name == "add_prev_":
        return {"kind": "add_prev"}
    if name == "fc_2":
        n_out, n_in = s.int(), s.int()
        params = s.tensor().ravel()
        s.alias_tensor(), s.alias_tensor()
        if s.int() != 1:  # fc_bias_mode: FC_NO_BIAS
            raise ValueError("expected fc_no_bias")
        for _ in range(4):
            s.float()
        w = params[: n_in * n_out].reshape(n_in, n_out)  # dlib: out = in @ W
        return {"kind": "fc", "weight": np.ascontiguousarray(w.T)}
    raise ValueError(f"unsupported layer record {name!r} at byte {s.i}")


def _read_flat(data: bytes):
    """Return (mean_rgb, input_size, items) with items in input-to-output order.

    add_layer<L, SUB> writes: version, SUB, L's details, bookkeeping.  So the file
    starts with the versions of all nested wrappers (outermost first), then the
    input layer, then the layer details innermost first.  tag/skip wrappers write
    only their version (1); they appear in `items` as {"kind": "mark"}.
    """
    s = _Stream(data)
    if s.int() != 1 or not s.text().startswith("loss_metric_"):
        raise ValueError("not a dlib loss_metric network")
    s.float(), s.float()  # margin, distance threshold
    versions = []
    while not s.peek_text().startswith("input_"):
        versions.append(s.int())
    input_version = versions.pop()  # the add_layer that owns the input layer
    if s.text() != "input_rgb_image_sized":
        raise ValueError("unexpected input layer")
    mean_rgb = (s.float(), s.float(), s.float())
    size, size_c = s.int(), s.int()
    if size != size_c:
        raise ValueError("non-square input")

    def trailer(first: bool, version: int):
        for _ in range(3):
            s.bool()  # setup_called, gradient_stale, output_disabled
        for _ in range(3):
            s.tensor()  # x_grad, cached_output, params_grad/grad_final
        if first and version >= 3:
            s.int()  # sample_expansion_factor

    items = [_read_layer(s)]
    trailer(True, input_version)
    for v in reversed(versions):
        if v == 1:
            items.append({"kind": "mark"})
        elif v == 2:
            items.append(_read_layer(s))
            trailer(False, v)
        else:
            raise ValueError(f"unexpected wrapper version {v}")
    if s.i != len(data):
        raise ValueError(f"{len(data) - s.i} trailing bytes")
    return tuple(np.float32(m) for m in mean_rgb), size, items


def read_dat(path: Path) -> DlibResNet:
    """Parse the .dat file and check it has the dlib face ResNet topology."""
    with open(path, "rb") as f:
        mean_rgb, size, items = _read_flat(f.read())
    kinds = [it["kind"] for it in items]

    def take(i, *expected):
        if tuple(kinds[i : i + len(expected)]) != expected:
            raise ValueError(f"unexpected layers at {i}: {kinds[i : i + len(expected)]}")
        return items[i : i + len(expected)]

    conv, bn, _, pool = take(0, "con", "bn", "relu", "max_pool")
    blocks: list[Block] = []
    i = 4
    while kinds[i] == "mark":  # tag1 marks a block's input
        _, c1, b1, _, c2, b2 = take(i, "mark", "con", "bn", "relu", "con", "bn")
        i += 6
        down = None
        if kinds[i] == "mark":  # tag2 + skip1 -> 2x2 average pool of the block input
            down = take(i, "mark", "mark", "avg_pool")[2]["pool"]
            i += 3
        take(i, "add_prev", "relu")
        i += 2
        blocks.append(Block(c1["conv"], b1["affine"], c2["conv"], b2["affine"], down))
    gap, fc = take(i, "avg_pool", "fc")
    if gap["pool"].kernel != 0 or i + 2 != len(items):
        raise ValueError("expected global average pool + fc at the end")
    return DlibResNet(mean_rgb, size, conv["conv"], bn["affine"], pool["pool"], blocks, fc["weight"])


# ---------------------------------------------------------------------------
# ONNX export
# ---------------------------------------------------------------------------

OPSET = 17
IR_VERSION = 8  # the IR version that introduced opset 17 support; fixed for byte stability


def to_onnx(net: DlibResNet, fold_affine: bool = False) -> onnx.ModelProto:
    """Build an ONNX graph equivalent to dlib's forward pass (static 150x150 input).
    `fold_affine`: each affine is folded into the conv before it (in numpy, so the same bytes
    everywhere), which leaves the quantizer plain Conv → Relu chains to quantize."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    counter = [0]

    def name(prefix):
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def const(prefix, arr):
        n = name(prefix)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), n))
        return n

    def op(op_type, inputs, **attrs):
        out = name(op_type.lower())
        nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def conv(x, c: Conv, hw):
        k = c.weight.shape[-1]
        y = op("Conv", [x, const("w", c.weight), const("b", c.bias)], kernel_shape=[k, k], strides=[c.stride] * 2, pads=[c.pad] * 4)
        return y, (hw + 2 * c.pad - k) // c.stride + 1

    def conv_affine(x, c: Conv, a: Affine, hw):
        if not fold_affine:
            y, hw = conv(x, c, hw)
            return affine(y, a), hw
        return conv(x, Conv(c.weight * a.scale[:, None, None, None], c.bias * a.scale + a.shift, c.stride, c.pad), hw)

    def affine(x, a: Affine):
        x = op("Mul", [x, const("scale", a.scale.reshape(1, -1, 1, 1))])
        return op("Add", [x, const("shift", a.shift.reshape(1, -1, 1, 1))])

    def pool(x, p: Pool, hw):
        y = op("MaxPool" if p.kind == "max" else "AveragePool", [x], kernel_shape=[p.kernel] * 2, strides=[p.stride] * 2, pads=[p.pad] * 4)
        return y, (hw + 2 * p.pad - p.kernel) // p.stride + 1

    def pad_to(x, shape, target):
        """Zero-pad channels and rows/cols at the end, as dlib's add_prev does."""
        if shape == target:
            return x
        pads = [0, 0, 0, 0, 0] + add_prev_pads(shape, target)
        return op("Pad", [x, const("pads", np.array(pads, np.int64))])

    x, hw = conv_affine("input", net.stem_conv, net.stem_bn, net.input_size)
    x = op("Relu", [x])
    x, hw = pool(x, net.stem_pool, hw)
    ch = net.stem_conv.weight.shape[0]
    for blk in net.blocks:
        y, hw_y = conv_affine(x, blk.conv1, blk.bn1, hw)
        y = op("Relu", [y])
        y, hw_y = conv_affine(y, blk.conv2, blk.bn2, hw_y)
        s, hw_s = pool(x, blk.down, hw) if blk.down else (x, hw)
        y_shape, s_shape = (blk.conv2.weight.shape[0], hw_y, hw_y), (ch, hw_s, hw_s)
        target = add_prev_shape(y_shape, s_shape)
        x = op("Relu", [op("Add", [pad_to(y, y_shape, target), pad_to(s, s_shape, target)])])
        ch, hw = target[0], target[1]
    x = op("Flatten", [op("GlobalAveragePool", [x])], axis=1)
    op("MatMul", [x, const("fc", net.fc_weight.T)])
    nodes[-1].output[0] = "embedding"
    nodes[-1].name = "embedding"

    graph = helper.make_graph(
        nodes,
        "dlib_face_recognition_resnet_model_v1",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, net.input_size, net.input_size])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", net.fc_weight.shape[0]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="facegate.dlib_resnet")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def onnx_bytes(path: Path) -> bytes:
    """The .dat as a serialized ONNX model: the same bytes on every machine (its manifest pins them)."""
    return to_onnx(read_dat(path)).SerializeToString()


def build_manifest(dat: Path, net: DlibResNet, onnx_file: Path) -> dict:
    """The uncalibrated manifest of a network of one's own trained with dlib (`import-dlib --out`):
    its terms are those of its training data, which only its owner knows. dlib's published model
    has its manifest in models/, with its provenance and licence."""
    size = net.input_size
    return {
        "name": dat.stem,
        "version": "1.0",
        "task": "embedder",
        "file": {"name": onnx_file.name, "sha256": sha256_file(onnx_file), "bytes": onnx_file.stat().st_size},
        "input": {
            "name": "input",
            "shape": ["batch", 3, size, size],
            "color": "RGB",
            "mean": [float(m) for m in net.mean_rgb],
            "std": [256.0] * 3,
        },
        "outputs": [{"name": "embedding", "shape": ["batch", int(net.fc_weight.shape[0])]}],
        "embedding_dim": int(net.fc_weight.shape[0]),
        "alignment": "dlib_150",
        "provenance": {
            "architecture": f"dlib ResNet ({len(net.blocks)} residual blocks), {size}x{size} RGB input",
            "source_file": dat.name,
            "source_sha256": sha256_file(dat),
            "conversion": "facegate models import-dlib: numpy reader of dlib's serialization, ONNX opset 17",
        },
        "license": {"name": "unknown", "terms": "Set the terms of the network's training data before serving it."},
    }
