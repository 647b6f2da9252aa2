import pytest

from service.errors import ModelError
from service.models import providers


def test_cpu_only_host_gets_the_cpu_provider(monkeypatch):
    monkeypatch.setattr(providers, "cuda_device_count", lambda: 0)
    providers.select_providers.cache_clear()
    assert providers.select_providers("auto") == (providers.CPU,)
    with pytest.raises(ModelError, match="no usable GPU"):
        providers.select_providers("cuda")
    providers.select_providers.cache_clear()


def test_cuda_is_first_when_offered_and_a_gpu_is_present(monkeypatch):
    monkeypatch.setattr(providers, "cuda_device_count", lambda: 1)
    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: [providers.CUDA, providers.CPU])
    monkeypatch.setattr(providers.ort, "preload_dlls", lambda *a, **k: None, raising=False)
    providers.select_providers.cache_clear()
    assert providers.select_providers("auto") == (providers.CUDA, providers.CPU)
    assert providers.select_providers("cpu") == (providers.CPU,)
    providers.select_providers.cache_clear()
