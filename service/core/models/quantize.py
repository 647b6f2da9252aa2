"""dlib-resnet-v1's int8 form, made on the user's machine by `facegate models pull dlib-resnet-v1-int8`:
dlib's published weights → the float graph (affines folded into the convs) → onnxruntime's static
quantizer, reading activation ranges from a file committed beside the manifest. The ranges were
calibrated once on training photos that cannot ship (`facegate calibrate-int8`); they are derived
statistics, pinned by sha256 like the int8 file itself, so no photo is needed to rebuild it."""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

from service.core.errors import ModelError
from service.core.fileio import write_atomically
from service.core.models import dlib_resnet
from service.core.models.manifest import Quantization


def float_graph(weights: Path) -> bytes:
    """The graph both calibration and quantization run on: the ranges name its tensors."""
    return dlib_resnet.to_onnx(dlib_resnet.read_dat(weights), fold_affine=True).SerializeToString()


def checked_ranges(options: Quantization, manifest_dir: Path) -> bytes:
    """The committed ranges file's bytes, refused unless they are the ones the manifest pins."""
    path = Path(manifest_dir) / options.ranges
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"cannot read the quantization ranges {path}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != options.ranges_sha256:
        raise ModelError(f"{path}: sha256 {digest} does not match the manifest ({options.ranges_sha256})")
    return data


def quantize(float_model: bytes, ranges: bytes, options: Quantization) -> bytes:
    """onnxruntime's static quantization of `float_model` at the given ranges (no calibration run)."""
    with tempfile.TemporaryDirectory(prefix="facegate-int8-") as tmp:
        source, cache, out = Path(tmp) / "float.onnx", Path(tmp) / "ranges.json", Path(tmp) / "int8.onnx"
        source.write_bytes(float_model)
        cache.write_bytes(ranges)  # a copy: onnxruntime rewrites a cache it cannot use
        quantize_static(
            str(source),
            str(out),
            None,
            quant_format=QuantFormat.QDQ,
            per_channel=options.per_channel,
            reduce_range=options.reduce_range,
            activation_type=QuantType[options.activation_type],
            weight_type=QuantType[options.weight_type],
            calibrate_method=CalibrationMethod[options.method],
            calibration_cache_path=cache,
        )
        return out.read_bytes()


def int8_bytes(weights: Path, options: Quantization, manifest_dir: Path) -> bytes:
    """Published weights + committed ranges → the int8 file's bytes."""
    ranges = checked_ranges(options, manifest_dir)
    return quantize(float_graph(weights), ranges, options)


class _OneByOne(CalibrationDataReader):
    def __init__(self, inputs: np.ndarray, name: str):
        self._runs: Iterator[dict] = iter([{name: inputs[i : i + 1]} for i in range(len(inputs))])

    def get_next(self) -> dict | None:
        return next(self._runs, None)


def calibrate_ranges(weights: Path, inputs: np.ndarray, input_name: str, method: str, out: Path) -> None:
    """Activation ranges of the float graph over preprocessed crops, as onnxruntime's calibration
    cache (JSON). The crops go one per run, in order: the sample alone decides the ranges, and the
    histogram calibrators, which stack the runs' outputs, get runs of one shape."""
    with tempfile.TemporaryDirectory(prefix="facegate-calib-") as tmp:
        source = Path(tmp) / "float.onnx"
        source.write_bytes(float_graph(weights))
        extra = {"percentile": 99.999} if method == "Percentile" else {}
        calibrator = create_calibrator(
            source, augmented_model_path=str(Path(tmp) / "augmented.onnx"), calibrate_method=CalibrationMethod[method], extra_options=extra
        )
        calibrator.collect_data(_OneByOne(inputs, input_name))
        ranges = calibrator.compute_data()
        save_tensors_data(ranges, Path(tmp) / "ranges.json")
        payload = json.loads((Path(tmp) / "ranges.json").read_text())  # tensors come in set order: sorted, the same bytes each run
        write_atomically(out, (json.dumps(payload, sort_keys=True, indent=1) + "\n").encode())
