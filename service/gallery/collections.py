"""Collections: one service, several galleries, each API key bound to one (issue 50). A collection
is a name every subject and face row carries; each collection has a gallery state of its own (its
store handle, index, open-set guard and follower, its counts and recall check), opened lazily for the
collections the keys name, so a small collection is searched, and its FPIR promise kept, as a
gallery of its size whatever the others hold."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from service.core.errors import FacegateError, GalleryLoading, GalleryUnavailable
from service.gallery.interface import GalleryStore
from service.gallery.recall import RecallCheck
from service.gallery.stats import GalleryStats

DEFAULT = "default"  # a key without `collection=`, every FACEGATE_API_KEYS key, anonymous mode
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # the key file's contract (issue 50)
log = logging.getLogger(__name__)
COLLECTION = "facegate.collection"  # the ASGI scope key the caller's collection is set under


def valid(name: str) -> bool:
    return NAME.fullmatch(name) is not None


def folder(name: str) -> str:
    """The name of a collection's index folder, which no other name's folds to on a case-insensitive
    disk (macOS, Windows: `Home` and `home` would share one and overwrite each other's snapshot): an
    upper-case letter is spelt `%` and its code in lower-case hex (`Home`: `%48ome`), and "." and ".."
    (the folder itself, default's) `%2E`; no name holds `%`, so lower-case names keep their folders."""
    if name in (".", ".."):
        return name.replace(".", "%2E")
    return re.sub("[A-Z]", lambda letter: f"%{ord(letter[0]):02x}", name)


@dataclass(frozen=True)
class Collection:
    """What one collection is served from."""

    name: str
    gallery: GalleryStore
    stats: GalleryStats  # its counts for /readyz and /metrics
    recall: RecallCheck  # its index's measured recall@1
    started: threading.Thread  # starts the recall check once the index is built (ended by the gallery's close)

    def close(self) -> None:
        self.stats.close()
        self.gallery.close()  # first: a build still under way stops, and the wait for it ends
        self.started.join()
        self.recall.close()


class Collections:
    """The per-collection states, each made by `open_one` once. `open` (start-up, on a thread) waits
    for it; `get` (a request, maybe on the event loop) never does: a collection not yet open starts
    opening on a thread of its own and `get` answers 503 gallery_loading meanwhile (migrations and a
    PostgreSQL pool take seconds); `prepare` starts opening those a reloaded key file names."""

    def __init__(self, open_one: Callable[[str], Collection]):
        self._open = open_one
        self._states: dict[str, Collection] = {}
        self._opening: dict[str, threading.Thread] = {}
        self._failed: dict[str, FacegateError] = {}  # the last try's error, answered once, then tried again
        self._at_start: set[str] = set()  # opened by `open`: the host is not ready before their indexes are built
        self._closed = False  # no opening starts once closing began (a request during shutdown)
        self._lock = threading.Lock()

    def open(self, name: str) -> Collection:
        """`name`'s state, opened here if need be (blocks: never on the event loop); the host counts
        as ready only once its index is built (`loading`)."""
        self._at_start.add(name)
        self._start(name)
        with self._lock:
            opening = self._opening.get(name)
        if opening is not None:
            opening.join()
        return self.get(name)

    def get(self, name: str) -> Collection:
        """`name`'s state if it is open; else GalleryLoading while it opens (or its opening's error)."""
        state = self._states.get(name)
        if state is not None:
            return state
        with self._lock:
            failed = self._failed.pop(name, None)
        if failed is not None:
            raise failed
        self._start(name)
        state = self._states.get(name)
        if state is not None:  # opened meanwhile
            return state
        raise GalleryLoading(f"collection {name!r} is being opened; retry shortly")

    def prepare(self, names: Iterable[str]) -> None:
        """Start opening every collection of `names` not open yet, each on its own thread (SIGHUP)."""
        for name in names:
            self._start(name)

    def _start(self, name: str) -> None:
        with self._lock:
            if self._closed or name in self._states or name in self._opening:
                return
            opening = self._opening[name] = threading.Thread(target=self._run, args=(name,), name=f"facegate-open-{name}", daemon=True)
        opening.start()

    def _run(self, name: str) -> None:
        try:
            state = self._open(name)
        except FacegateError as exc:
            log.error("collection %r could not be opened: %s", name, exc.message)
            with self._lock:
                self._failed[name] = exc
                del self._opening[name]
            return
        except Exception as exc:  # a server fault: its request answers 503, a later one tries again
            log.exception("collection %r could not be opened", name)
            with self._lock:
                self._failed[name] = GalleryUnavailable(f"collection {name!r} could not be opened: {type(exc).__name__}")
                del self._opening[name]
            return
        with self._lock:
            self._states[name] = state
            del self._opening[name]

    def opened(self) -> dict[str, Collection]:
        return dict(self._states)

    def loading(self) -> list[str]:
        """The collections opened at start-up whose index and guard are still being built: until none
        is, /readyz answers 503 whoever asks and no worker counts as ready. One a reloaded key file
        adds later answers its own callers 503 gallery_loading meanwhile, and leaves the host ready."""
        return sorted(name for name, state in self.opened().items() if name in self._at_start and state.gallery.loading)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opening = list(self._opening.values())
        for thread in opening:  # an opening under way ends before its state is closed
            thread.join()
        with self._lock:
            states, self._states = self._states, {}
        for state in states.values():
            state.close()
