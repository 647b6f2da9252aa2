"""Collections: one service, several galleries, each API key bound to one (issue 50). A collection
is a name every subject and face row carries; each collection has a gallery state of its own (its
store handle, index, open-set guard and follower, its counts and recall check), opened lazily for the
collections the keys name, so a small collection is searched, and its FPIR promise kept, as a
gallery of its size whatever the others hold."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from service.gallery.interface import GalleryStore
from service.gallery.recall import RecallCheck
from service.gallery.stats import GalleryStats

DEFAULT = "default"  # a key without `collection=`, every FACEGATE_API_KEYS key, anonymous mode
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
COLLECTION = "facegate.collection"  # the ASGI scope key the caller's collection is set under


def valid(name: str) -> bool:
    return NAME.fullmatch(name) is not None


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
    """The per-collection states, each made by `open_one` the first time its collection is asked for
    (once, whoever asks at the same time)."""

    def __init__(self, open_one: Callable[[str], Collection]):
        self._open = open_one
        self._states: dict[str, Collection] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Collection:
        state = self._states.get(name)
        if state is not None:
            return state
        with self._lock:  # opening one is rare: every key's collection is opened at start-up
            if name not in self._states:
                self._states[name] = self._open(name)
            return self._states[name]

    def opened(self) -> dict[str, Collection]:
        return dict(self._states)

    def close(self) -> None:
        with self._lock:
            states, self._states = self._states, {}
        for state in states.values():
            state.close()
