"""Every request, answered or refused, is work for the process's idle trim (service/runtime/heap.py),
whose thread runs while the app does."""

from __future__ import annotations

from service.api import app as app_module
from service.runtime.decode_workers import DecodeWorkers
from service.runtime.heap import IdleTrim
from tests.conftest import started_client


def test_every_request_is_noted_as_work_and_the_trim_runs_while_the_app_does(api_settings, monkeypatch):
    made: list[IdleTrim] = []

    class Recorded(IdleTrim):
        def __init__(self, quiet: float) -> None:
            super().__init__(quiet)
            made.append(self)

    monkeypatch.setattr(app_module, "IdleTrim", Recorded)
    with started_client(api_settings) as client:
        (idle,) = made
        assert idle.quiet == api_settings.idle_trim_seconds == 30  # FACEGATE_IDLE_TRIM_SECONDS
        assert idle._thread is not None and idle._thread.is_alive()
        assert [action.__func__ for action in idle.also] == [DecodeWorkers.give_back]  # the decoders' buffers too
        before = idle.work
        assert client.get("/healthz").status_code == 200
        assert client.get("/no-such-route").status_code in (401, 404)
        assert idle.work == before + 4  # as each starts and as each ends
    assert not idle._thread.is_alive()
