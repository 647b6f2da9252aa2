"""Collections' states (service/gallery/collections.py) without a server: a request never opens a
collection itself (it starts opening on a thread and answers 503 gallery_loading meanwhile), an
opening's error is answered once and the next request tries again, and nothing opens once closing began."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from service.core.errors import ExtraNotInstalled, GalleryLoading, GalleryUnavailable, InvalidParameters
from service.gallery.collections import Collections
from service.gallery.extras import POSTGRES_EXTRA_MISSING
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


class FailingOpener:
    """Raises each error of `errors` in turn, one per call, then opens."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self, name: str):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return SimpleNamespace(name=name, gallery=SimpleNamespace(loading=False), close=lambda: None)


def test_start_up_tries_a_server_fault_again_with_backoff(monkeypatch):
    """A database not answering yet, or SQLite's file held by another process (an OperationalError,
    a server fault): start-up tries again, since a worker that fails its start-up stops the server."""
    monkeypatch.setattr("service.gallery.collections.START_RETRY_FIRST", 0.01)
    opener = FailingOpener(GalleryUnavailable("the database does not answer"), RuntimeError("database is locked"))
    state = Collections(opener).open("home", retry_for=10)
    assert state.name == "home" and opener.calls == 3


def test_start_up_raises_a_lasting_fault_after_its_retries_and_any_other_error_at_once(monkeypatch):
    monkeypatch.setattr("service.gallery.collections.START_RETRY_FIRST", 0.01)
    opener = FailingOpener(*[GalleryUnavailable("the database does not answer")] * 100)
    with pytest.raises(GalleryUnavailable):
        Collections(opener).open("home", retry_for=0.2)
    assert 2 <= opener.calls < 100
    opener = FailingOpener(InvalidParameters("this gallery was made by another embedder"))  # a lasting fault, not the server's
    with pytest.raises(InvalidParameters):
        Collections(opener).open("home", retry_for=10)
    assert opener.calls == 1
    opener = FailingOpener(ExtraNotInstalled(POSTGRES_EXTRA_MISSING))  # a 503 too, that no retry can mend
    with pytest.raises(ExtraNotInstalled):
        Collections(opener).open("home", retry_for=10)
    assert opener.calls == 1


def test_nothing_opens_once_closing_began():
    opener = Opener()
    opener.release.set()
    states = Collections(opener)
    states.retain(["a", "b"])
    states.close()  # waits for the openings (default's too: what callers without a key see), closes their states
    with pytest.raises(GalleryLoading):
        states.get("c")
    assert sorted(name for name, _ in opener.calls) == ["a", "b", "default"] and states.opened() == {}


class Closable:
    """A stand-in state that records its close."""

    def __init__(self, name: str):
        self.name, self.gallery, self.closed = name, SimpleNamespace(loading=False), threading.Event()

    def close(self) -> None:
        assert not self.closed.is_set(), "closed twice"
        self.closed.set()


def test_a_reload_closes_a_collection_no_key_names_once_its_last_request_ends():
    made: dict[str, list[Closable]] = {}

    def open_one(name: str) -> Closable:
        made.setdefault(name, []).append(Closable(name))
        return made[name][-1]

    states = Collections(open_one)
    for name in ("default", "home", "office"):
        states.open(name)
    home, office = made["home"][0], made["office"][0]
    with states.lease("home") as leased:  # a request under way in home
        assert leased is home
        states.retain(["default"])  # the key file no longer names home nor office
        wait_until(office.closed.is_set, "office, which no request used, closed")
        assert not home.closed.is_set()  # still used
        with pytest.raises(GalleryLoading, match="no longer served"):  # a request keyed before the reload
            states.get("home")
    wait_until(home.closed.is_set, "home closed once its request ended")
    assert sorted(states.opened()) == ["default"] and not made["default"][0].closed.is_set()
    states.retain(["home"])  # named again: a fresh state
    wait_until(lambda: "home" in states.opened(), "home opened again")
    assert states.get("home") is made["home"][1]
    states.close()
    assert all(state.closed.is_set() for same in made.values() for state in same)
