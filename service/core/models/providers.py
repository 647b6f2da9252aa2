"""The one place that picks onnxruntime execution providers, sets their options and builds
inference sessions. What a session actually got is read back from it (`get_provider_options`)
for GET /readyz."""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from service.core.cpus import available_cores
from service.core.errors import ModelError

if TYPE_CHECKING:  # imported where a session is made: an HTTP worker under a model host never needs it (19 MiB)
    import onnxruntime as ort

log = logging.getLogger("facegate.providers")

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Runtime:
    """How sessions run: the settings' onnxruntime group (service/core/settings.py documents each)."""

    device: str = "auto"
    cuda_device_id: int = 0
    cudnn_conv_algo_search: str = "HEURISTIC"
    gpu_mem_limit: int = 0
    arena_extend_strategy: str = "kNextPowerOfTwo"
    tensorrt: bool = False
    tensorrt_cache: Path | None = None
    intra_op_threads: int = 0
    intra_op_spinning: bool = False

    @classmethod
    def from_settings(cls, settings) -> Runtime:
        return cls(
            device=settings.device,
            cuda_device_id=settings.cuda_device_id,
            cudnn_conv_algo_search=settings.cudnn_conv_algo_search,
            gpu_mem_limit=settings.gpu_mem_limit,
            arena_extend_strategy=settings.arena_extend_strategy,
            tensorrt=settings.tensorrt,
            tensorrt_cache=Path(settings.model_cache).expanduser() / "tensorrt",
            intra_op_threads=settings.intra_op_threads,
            intra_op_spinning=settings.intra_op_spinning,
        )

    def threads(self, gpu: bool) -> int:
        """Intra-op threads per session: the setting; else 1 on a GPU (its kernels use no CPU
        thread pool, and idle pools only contend with the threads feeding it), else the cores this
        process may use."""
        return self.intra_op_threads or (1 if gpu else available_cores())


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
def select_providers(device: str = "auto", tensorrt: bool = False) -> tuple[str, ...]:
    """CUDA first when onnxruntime offers it and a GPU is usable (TensorRT before it when asked
    for and offered), else CPU.

    `device="cuda"` makes a missing GPU a start-up error instead of a silent CPU fallback.
    """
    import onnxruntime as ort

    offered = ort.get_available_providers()
    if device != "cpu" and CUDA in offered and cuda_device_count() > 0:
        if hasattr(ort, "preload_dlls"):
            # onnxruntime-gpu's pip extras ship CUDA/cuDNN as wheels; load them before the session.
            ort.preload_dlls()
        if tensorrt and TENSORRT not in offered:
            log.warning("FACEGATE_TENSORRT is set but onnxruntime offers no TensorRT provider (%s); using CUDA", ", ".join(offered))
        return ((TENSORRT,) if tensorrt and TENSORRT in offered else ()) + (CUDA, CPU)
    if device == "cuda":
        raise ModelError(
            f"FACEGATE_DEVICE=cuda but no usable GPU (onnxruntime offers {offered}, "
            f"{cuda_device_count()} CUDA devices); install the 'gpu' extra on a GPU host or use device=auto"
        )
    return (CPU,)


def provider_options(runtime: Runtime) -> list[tuple[str, dict[str, str]]]:
    """The providers for `runtime`, each with its options (onnxruntime's names, string values)."""
    options: dict[str, dict[str, str]] = {
        CUDA: {
            "device_id": str(runtime.cuda_device_id),
            "cudnn_conv_algo_search": runtime.cudnn_conv_algo_search,
            "arena_extend_strategy": runtime.arena_extend_strategy,
            **({"gpu_mem_limit": str(runtime.gpu_mem_limit)} if runtime.gpu_mem_limit else {}),
        },
        TENSORRT: {
            "device_id": str(runtime.cuda_device_id),
            "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(runtime.tensorrt_cache or Path("tensorrt-cache")),
        },
        CPU: {},
    }
    return [(name, options[name]) for name in select_providers(runtime.device, runtime.tensorrt)]


def session_options(runtime: Runtime, gpu: bool = False) -> ort.SessionOptions:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = runtime.threads(gpu)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if runtime.intra_op_spinning else "0")
    options.log_severity_level = 3  # errors only: provider warnings are summarised by our own log line
    return options


_logged: set[tuple[str, ...]] = set()


def create_session(model: Path | bytes, runtime: Runtime | None = None) -> ort.InferenceSession:
    """A session for a model file (or its bytes, already verified against the manifest)."""
    import onnxruntime as ort

    runtime = runtime or Runtime()
    chosen = provider_options(runtime)
    if runtime.tensorrt_cache and any(name == TENSORRT for name, _ in chosen):
        runtime.tensorrt_cache.mkdir(parents=True, exist_ok=True)
    source = model if isinstance(model, bytes) else str(model)
    gpu = chosen[0][0] != CPU
    try:
        session = ort.InferenceSession(
            source, sess_options=session_options(runtime, gpu), providers=[n for n, _ in chosen], provider_options=[o for _, o in chosen]
        )
    except Exception as exc:  # onnxruntime raises bare Fail/InvalidGraph types
        raise ModelError(f"onnxruntime cannot load {model if isinstance(model, Path) else 'the model'}: {exc}") from None
    active = tuple(session.get_providers())
    if active not in _logged:
        _logged.add(active)
        log.info("onnxruntime providers: %s (%d intra-op threads)", ", ".join(active), session.get_session_options().intra_op_num_threads)
    return session
