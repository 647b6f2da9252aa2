import pytest

from service import runtime
from service.errors import ModelError


def test_cpu_only_host_gets_the_cpu_provider(monkeypatch):
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: 0)
    runtime.select_providers.cache_clear()
    assert runtime.select_providers("auto") == (runtime.CPU,)
    with pytest.raises(ModelError, match="no usable GPU"):
        runtime.select_providers("cuda")
    runtime.select_providers.cache_clear()


def test_cuda_is_first_when_offered_and_a_gpu_is_present(monkeypatch):
    monkeypatch.setattr(runtime, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(runtime.ort, "get_available_providers", lambda: [runtime.CUDA, runtime.CPU])
    monkeypatch.setattr(runtime.ort, "preload_dlls", lambda *a, **k: None, raising=False)
    runtime.select_providers.cache_clear()
    assert runtime.select_providers("auto") == (runtime.CUDA, runtime.CPU)
    assert runtime.select_providers("cpu") == (runtime.CPU,)
    runtime.select_providers.cache_clear()
