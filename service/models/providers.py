"""The one place that picks onnxruntime execution providers and builds inference sessions."""

from __future__ import annotations

import ctypes
import logging
from functools import lru_cache
from pathlib import Path

import onnxruntime as ort

from service.errors import ModelError

log = logging.getLogger("facegate.providers")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@lru_cache
def cuda_device_count() -> int:
    """Ask the CUDA driver directly, so a CPU host with onnxruntime-gpu installed never tries the
    CUDA provider (which would print a screen of loader errors and then fall back anyway)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


@lru_cache
def select_providers(device: str = "auto") -> tuple[str, ...]:
    """CUDA first when onnxruntime offers it and a GPU is usable, else CPU.

    `device="cuda"` makes a missing GPU a start-up error instead of a silent CPU fallback.
    """
    offered = ort.get_available_providers()
    if device != "cpu" and CUDA in offered and cuda_device_count() > 0:
        if hasattr(ort, "preload_dlls"):
            # onnxruntime-gpu's pip extras ship CUDA/cuDNN as wheels; load them before the session.
            ort.preload_dlls()
        return (CUDA, CPU)
    if device == "cuda":
        raise ModelError(
            f"FACEGATE_DEVICE=cuda but no usable GPU (onnxruntime offers {offered}, "
            f"{cuda_device_count()} CUDA devices); install the 'gpu' extra on a GPU host or use device=auto"
        )
    return (CPU,)


_logged: set[tuple[str, ...]] = set()


def create_session(path: Path, device: str = "auto", intra_op_threads: int = 0) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    options.log_severity_level = 3  # errors only: provider warnings are summarised by our own log line
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=list(select_providers(device)))
    except Exception as exc:  # onnxruntime raises bare Fail/InvalidGraph types
        raise ModelError(f"onnxruntime cannot load {path}: {exc}") from None
    active = tuple(session.get_providers())
    if active not in _logged:
        _logged.add(active)
        log.info("onnxruntime providers: %s", ", ".join(active))
    return session
