"""Collections' states (service/gallery/collections.py) without a server: a request never opens a
collection itself (it starts opening on a thread and answers 503 gallery_loading meanwhile), an
opening's error is answered once and the next request tries again, and nothing opens once closing began."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from service.core.errors import GalleryLoading, GalleryUnavailable
from service.gallery.collections import Collections
from tests.polling import wait_until


class Opener:
    """Opens a stand-in state per call, each held until released; `fail` makes the next one raise."""

    def __init__(self) -> None:
        self.release, self.calls, self.fail = threading.Event(), [], False

    def __call__(self, name: str):
        self.calls.append((name, threading.current_thread().name))
        assert self.release.wait(30)
        if self.fail:
            self.fail = False
            raise GalleryUnavailable("the database does not answer")
        return SimpleNamespace(name=name, gallery=SimpleNamespace(loading=False), close=lambda: None)


def test_a_request_starts_the_opening_and_answers_loading_until_it_is_open():
    opener = Opener()
    states = Collections(opener)
    for _ in range(3):  # asked again while it opens: one opening
        with pytest.raises(GalleryLoading):
            states.get("home")
    opener.release.set()
    state = wait_until(lambda: "home" in states.opened() and states.get("home"), "home open")
    assert state.name == "home" and opener.calls == [("home", "facegate-open-home")]


def test_an_openings_error_is_answered_once_then_tried_again():
    opener = Opener()
    opener.fail = True
    opener.release.set()
    states = Collections(opener)
    with pytest.raises(GalleryLoading):
        states.get("home")
    wait_until(lambda: "home" not in states._opening, "the failed opening ended")
    with pytest.raises(GalleryUnavailable):
        states.get("home")
    opener.release.clear()
    with pytest.raises(GalleryLoading):  # the next request opens it again
        states.get("home")
    opener.release.set()
    assert wait_until(lambda: "home" in states.opened(), "home open on the second try") and len(opener.calls) == 2


def test_nothing_opens_once_closing_began():
    opener = Opener()
    opener.release.set()
    states = Collections(opener)
    states.prepare(["a", "b"])
    states.close()  # waits for both openings, closes their states
    with pytest.raises(GalleryLoading):
        states.get("c")
    assert sorted(name for name, _ in opener.calls) == ["a", "b"] and states.opened() == {}
