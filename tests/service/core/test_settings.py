import pytest
from pydantic import ValidationError

from service.core.settings import Settings


def test_a_replaced_setting_stops_start_up_and_names_its_replacement(monkeypatch):
    monkeypatch.setenv("FACEGATE_EMBED_MAX_BATCH", "8")
    with pytest.raises(ValidationError, match="FACEGATE_BATCH_SIZES"):
        Settings()


def test_batch_sizes_are_sorted_and_must_be_positive(monkeypatch):
    monkeypatch.setenv("FACEGATE_BATCH_SIZES", "[8, 1, 4, 4]")
    assert Settings().batch_sizes == [1, 4, 8]
    monkeypatch.setenv("FACEGATE_BATCH_SIZES", "[0, 4]")
    with pytest.raises(ValidationError, match="positive"):
        Settings()


def test_detector_sizes_are_sorted_multiples_of_32(monkeypatch):
    monkeypatch.setenv("FACEGATE_DETECT_SIZES", "[640, 320, 320]")
    assert Settings().detect_sizes == [320, 640]
    monkeypatch.setenv("FACEGATE_DETECT_SIZES", "[300, 640]")
    with pytest.raises(ValidationError, match="multiples of 32"):
        Settings()
