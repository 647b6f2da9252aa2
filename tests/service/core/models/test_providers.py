import onnxruntime as ort
import pytest

from service.core.errors import ModelError
from service.core.models import providers
from service.core.models.providers import Runtime
from service.core.settings import Settings


@pytest.fixture(autouse=True)
def _fresh_selection():
    providers.select_providers.cache_clear()
    yield
    providers.select_providers.cache_clear()


def _offer(monkeypatch, offered, gpus=1):
    monkeypatch.setattr(providers, "cuda_device_count", lambda: gpus)
    monkeypatch.setattr(ort, "get_available_providers", lambda: list(offered))
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: None, raising=False)


def test_cpu_only_host_gets_the_cpu_provider(monkeypatch):
    monkeypatch.setattr(providers, "cuda_device_count", lambda: 0)
    assert providers.select_providers("auto") == (providers.CPU,)
    with pytest.raises(ModelError, match="no usable GPU"):
        providers.select_providers("cuda")


def test_cuda_is_first_when_offered_and_a_gpu_is_present(monkeypatch):
    _offer(monkeypatch, [providers.CUDA, providers.CPU])
    assert providers.select_providers("auto") == (providers.CUDA, providers.CPU)
    assert providers.select_providers("cpu") == (providers.CPU,)


def test_cuda_options_come_from_settings(monkeypatch, tmp_path):
    _offer(monkeypatch, [providers.TENSORRT, providers.CUDA, providers.CPU])
    settings = Settings(
        model_cache=tmp_path,
        cuda_device_id=1,
        cudnn_conv_algo_search="EXHAUSTIVE",
        gpu_mem_limit=2 << 30,
        arena_extend_strategy="kSameAsRequested",
    )
    chosen = providers.provider_options(Runtime.from_settings(settings))
    assert [name for name, _ in chosen] == [providers.CUDA, providers.CPU]  # TensorRT only when asked for
    assert chosen[0][1] == {
        "device_id": "1",
        "cudnn_conv_algo_search": "EXHAUSTIVE",
        "arena_extend_strategy": "kSameAsRequested",
        "gpu_mem_limit": str(2 << 30),
    }
    default = dict(providers.provider_options(Runtime.from_settings(Settings(model_cache=tmp_path))))
    assert default[providers.CUDA]["cudnn_conv_algo_search"] == "HEURISTIC" and "gpu_mem_limit" not in default[providers.CUDA]


def test_tensorrt_goes_first_when_enabled_and_offered(monkeypatch, tmp_path):
    _offer(monkeypatch, [providers.TENSORRT, providers.CUDA, providers.CPU])
    chosen = providers.provider_options(Runtime.from_settings(Settings(model_cache=tmp_path, tensorrt=True)))
    assert [name for name, _ in chosen] == [providers.TENSORRT, providers.CUDA, providers.CPU]
    assert chosen[0][1]["trt_engine_cache_path"] == str(tmp_path / "tensorrt")
    providers.select_providers.cache_clear()
    _offer(monkeypatch, [providers.CUDA, providers.CPU])  # the plain onnxruntime-gpu wheel: no TensorRT
    chosen = providers.provider_options(Runtime.from_settings(Settings(model_cache=tmp_path, tensorrt=True)))
    assert [name for name, _ in chosen] == [providers.CUDA, providers.CPU]


def test_cpu_session_gets_its_thread_options(embedder_manifest, monkeypatch):
    path = embedder_manifest.with_suffix(".onnx")
    session = providers.create_session(path, Runtime(device="cpu", intra_op_threads=3, intra_op_spinning=True))
    options = session.get_session_options()
    assert options.intra_op_num_threads == 3
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert session.get_providers() == [providers.CPU]
    monkeypatch.setattr(providers, "available_cores", lambda: 1)  # a 1-CPU container
    options = providers.create_session(path, Runtime(device="cpu")).get_session_options()
    assert options.intra_op_num_threads == 1 and options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert isinstance(options, ort.SessionOptions)


def test_a_gpu_session_gets_one_intra_op_thread_unless_set(monkeypatch):
    monkeypatch.setattr(providers, "available_cores", lambda: 16)
    assert providers.session_options(Runtime(), gpu=True).intra_op_num_threads == 1
    assert providers.session_options(Runtime(), gpu=False).intra_op_num_threads == 16
    assert providers.session_options(Runtime(intra_op_threads=4), gpu=True).intra_op_num_threads == 4
