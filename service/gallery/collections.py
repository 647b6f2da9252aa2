"""Collections: one service, several galleries, each API key bound to one (issue 50). A collection
is a name every subject and face row carries; each collection has a gallery state of its own (its
store handle, index, open-set guard and follower, its counts and recall check), opened lazily for the
collections the keys name, so a small collection is searched, and its FPIR promise kept, as a
gallery of its size whatever the others hold."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from service.core.errors import ExtraNotInstalled, FacegateError, GalleryLoading, GalleryUnavailable
from service.gallery.collection_names import DEFAULT
from service.gallery.interface import GalleryStore
from service.gallery.recall import RecallCheck
from service.gallery.stats import GalleryStats

log = logging.getLogger(__name__)

START_RETRY_SECONDS = 30.0  # how long a start-up collection is tried again while a server fault keeps it from opening
START_RETRY_FIRST, START_RETRY_CAP = 0.5, 5.0  # seconds before the first try again, doubling up to the cap


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
    for it; `get` and `lease` (a request, maybe on the event loop) never do: a collection not yet open
    starts opening on a thread of its own and they answer 503 gallery_loading meanwhile (migrations and
    a PostgreSQL pool take seconds). `retain` (SIGHUP) starts opening those a reloaded key file names
    and closes those it no longer names, each once the last request that leased it has ended."""

    def __init__(self, open_one: Callable[[str], Collection]):
        self._open = open_one
        self._states: dict[str, Collection] = {}
        self._opening: dict[str, threading.Thread] = {}
        self._failed: dict[str, FacegateError] = {}  # the last try's error, answered once, then tried again
        self._at_start: set[str] = set()  # opened by `open`: the host is not ready before their indexes are built
        self._wanted: set[str] | None = None  # what the keys name since the last `retain` (None: whatever is asked)
        self._users: dict[int, int] = {}  # requests under way per state (by id), leased
        self._retired: dict[int, Collection] = {}  # states no key names any more, closed once their last request ends
        self._closing: dict[str, threading.Thread] = {}  # a retired state's close under way, by name
        self._closed = False  # no opening starts once closing began (a request during shutdown)
        self._lock = threading.Lock()

    def open(self, name: str, retry_for: float = START_RETRY_SECONDS) -> Collection:
        """`name`'s state, opened here if need be (blocks: never on the event loop); the host counts
        as ready only once its index is built (`loading`). A server fault (503 gallery_unavailable: a
        database that does not answer yet, a file another process holds) is tried again with backoff
        for `retry_for` seconds before it is raised: uvicorn stops the whole server when one worker
        fails its start-up, a worker it restarts after a crash included."""
        self._at_start.add(name)
        deadline = time.monotonic() + retry_for
        attempt = 0
        while True:
            self._start(name)
            with self._lock:
                opening = self._opening.get(name)
            if opening is not None:
                opening.join()
            try:
                return self.get(name)
            except GalleryUnavailable as exc:
                delay = min(START_RETRY_CAP, START_RETRY_FIRST * 2**attempt)
                if isinstance(exc, ExtraNotInstalled) or time.monotonic() + delay > deadline:
                    raise
                log.warning("collection %r could not be opened (%s): trying again in %.1f s", name, exc.message, delay)
                time.sleep(delay)
                attempt += 1

    def get(self, name: str) -> Collection:
        """`name`'s state if it is open; else GalleryLoading while it opens (or its opening's error)."""
        state = self._states.get(name)
        if state is not None:
            return state
        with self._lock:
            failed = self._failed.pop(name, None)
            unwanted = self._wanted is not None and name not in self._wanted
        if failed is not None:
            raise failed
        if unwanted:  # a request authenticated before the reload that removed its key: retried, it is answered as the keys are now
            raise GalleryLoading(f"collection {name!r} is no longer served (its key was removed); retry")
        self._start(name)
        state = self._states.get(name)
        if state is not None:  # opened meanwhile
            return state
        raise GalleryLoading(f"collection {name!r} is being opened; retry shortly")

    @contextmanager
    def lease(self, name: str) -> Iterator[Collection]:
        """`name`'s state, as `get`, kept open until the block ends (a request's), even if a reload retires it meanwhile."""
        while True:
            state = self.get(name)
            with self._lock:
                if self._states.get(name) is state:  # not retired between `get` and here
                    self._users[id(state)] = self._users.get(id(state), 0) + 1
                    break
        try:
            yield state
        finally:
            with self._lock:
                left = self._users[id(state)] = self._users[id(state)] - 1
                if left == 0:
                    del self._users[id(state)]
                retired = self._retired.pop(id(state)) if left == 0 and id(state) in self._retired else None
            if retired is not None:
                self._close_later(retired)

    def retain(self, names: Iterable[str]) -> None:
        """What SIGHUP runs: every collection of `names` (and default, what callers without a key see)
        starts opening if it is not open, each on its own thread; one no longer named stops being
        served, and is closed (its follower stopped, its handles released) once no request uses it."""
        wanted = {*names, DEFAULT}
        idle = []
        with self._lock:
            self._wanted = wanted
            for name in [name for name in self._states if name not in wanted]:
                state = self._states.pop(name)
                self._at_start.discard(name)
                if self._users.get(id(state)):
                    self._retired[id(state)] = state
                else:
                    idle.append(state)
        for state in idle:
            self._close_later(state)
        for name in sorted(wanted):
            self._start(name)

    def _close_later(self, state: Collection) -> None:
        """Close a retired state on a thread of its own (its follower's last save and join take seconds)."""
        log.info("collection %r is no longer named by any key: closed", state.name)
        with self._lock:
            closing = self._closing[state.name] = threading.Thread(target=state.close, name=f"facegate-close-{state.name}", daemon=True)
        closing.start()

    def _start(self, name: str) -> None:
        with self._lock:
            if self._closed or name in self._states or name in self._opening:
                return
            if self._wanted is not None and name not in self._wanted:
                return
            opening = self._opening[name] = threading.Thread(target=self._run, args=(name,), name=f"facegate-open-{name}", daemon=True)
        opening.start()

    def _run(self, name: str) -> None:
        with self._lock:
            closing = self._closing.pop(name, None)
        if closing is not None:  # named again while its previous state closes: its files and handles released first
            closing.join()
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
            del self._opening[name]
            unwanted = self._wanted is not None and name not in self._wanted
            if not unwanted:
                self._states[name] = state
        if unwanted:  # a reload removed its key while it opened
            self._close_later(state)

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
            retired, self._retired = list(self._retired.values()), {}
            closing = list(self._closing.values())
        for thread in closing:
            thread.join()
        for state in [*states.values(), *retired]:
            state.close()
