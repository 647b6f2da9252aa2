"""The connections a process holds to the PostgreSQL gallery: one pool and one LISTEN connection
for every collection it serves, not one of each per collection (issue 50: 5 collections on 4
workers would pass PostgreSQL's default max_connections of 100). The server makes one `Connections`
and hands it to each collection's store; a store opened alone (a command, a test's replica) makes
its own and closes it.

A change's NOTIFY names its collection (sync.record_change), and the listener's thread wakes that
collection's followers only; a follower of another collection reads the change at its next poll (a
change of another collection changes nothing in it). After the listener reconnects every follower
is woken: what was committed while it was cut off is caught up."""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

log = logging.getLogger("facegate.gallery")

CHANNEL = "facegate_gallery"
LISTENER_NAME = "facegate-gallery-sync"  # application_name of a process's listening connection (pg_stat_activity)
POOL_NAME = "facegate-gallery"  # application_name of its pool's connections
RETRY_SECONDS = (0.1, 0.5, 1.0, 2.0, 5.0)  # back-off of the listener's reconnection
WAKE_SECONDS = 1.0  # how long a listener waits for a notification before it checks whether it is closing


class Connections:
    """One pool (at most `pool_size` connections; a request waits `pool_timeout` for one), a
    semaphore bounding the direct connections made while the pool reconnects after an outage, and
    the listener. `open` makes the pool's first connection, once; `close` ends them all."""

    def __init__(self, url: str, pool_size: int = 8, pool_timeout: float = 1.0):
        # Text as UTF-8 whatever the database's encoding: on a SQL_ASCII database psycopg would
        # otherwise return text columns as bytes (a model name b'dlib-resnet-v1' is then "another embedder").
        self.url = make_conninfo(url, client_encoding="UTF8")
        self.pool_size, self.pool_timeout = pool_size, pool_timeout
        self.connect_timeout = max(1, round(pool_timeout))
        self.direct = threading.BoundedSemaphore(pool_size)
        self.listener = Listener(self.url)
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()

    def open(self) -> ConnectionPool:
        """The pool, connected (waits up to 30 s for its first connection; a failed try is made anew by the next caller)."""
        with self._lock:
            if self._pool is None:
                # `timeout`: a request waits this long for a connection, then 503 gallery_unavailable (an outage
                # must not hold worker threads for the default 30 s). `check`: a pooled connection is tested
                # before use, so after a database restart a stale one is replaced rather than failing a request.
                pool = ConnectionPool(
                    self.url,
                    min_size=1,
                    max_size=self.pool_size,
                    open=False,
                    name=POOL_NAME,
                    timeout=self.pool_timeout,
                    check=ConnectionPool.check_connection,
                    kwargs={"connect_timeout": self.connect_timeout, "application_name": POOL_NAME},
                )
                try:
                    pool.open(wait=True, timeout=30)
                except BaseException:
                    pool.close()
                    raise
                self._pool = pool
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        self.listener.close(pool)
        if pool is not None:
            pool.close()


class Listener:
    """The one LISTEN connection, read by a thread of its own (started by the first subscriber,
    reconnected after an error with a back-off), which wakes the subscribers of the collection each
    notification names."""

    def __init__(self, url: str):
        self.url = url
        self.listening = False  # connected and listening now
        self._subscribers: dict[str, list[Subscription]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, collection: str) -> Subscription:
        """A follower's wake-ups for `collection`'s changes; its first `wait` returns at once (a first catch-up)."""
        subscription = Subscription(self, collection)
        with self._lock:
            self._subscribers.setdefault(collection, []).append(subscription)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="facegate-gallery-listener", daemon=True)
                self._thread.start()
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            same = self._subscribers.get(subscription.collection, [])
            if subscription in same:
                same.remove(subscription)
            if not same:
                self._subscribers.pop(subscription.collection, None)

    def close(self, pool: ConnectionPool | None) -> None:
        """Stop the thread: woken by a notification of no collection through `pool` if it can, else at its next check."""
        self._stop.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if pool is not None:
            try:
                with pool.connection(timeout=2) as conn:
                    conn.execute("SELECT pg_notify(%s, '')", (CHANNEL,))
            except (psycopg.Error, PoolTimeout):
                pass
        thread.join(WAKE_SECONDS + 10)

    def _wake(self, collection: str | None) -> None:
        """`collection`'s subscribers (None: every one)."""
        with self._lock:
            woken = [s for name, same in self._subscribers.items() if collection in (None, name) for s in same]
        for subscription in woken:
            subscription.wake()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, application_name=LISTENER_NAME, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening, failures = True, 0
                    self._wake(None)  # what was committed before the LISTEN took effect is caught up now
                    while not self._stop.is_set():
                        for notification in conn.notifies(timeout=WAKE_SECONDS):
                            self._wake(notification.payload)
                            if self._stop.is_set():  # `close`'s notification
                                break
            except psycopg.Error as exc:
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                if not self._stop.is_set():
                    log.warning("gallery listener: %s; reconnecting in %.1f s", exc, delay)
                self._stop.wait(delay)
            finally:
                self.listening = False


class Subscription:
    """What one follower waits on (sync.PostgresLog.wait): set by a notification of its collection,
    a reconnection, or `wake`."""

    def __init__(self, listener: Listener, collection: str):
        self.listener, self.collection = listener, collection
        self._event = threading.Event()
        self._event.set()

    @property
    def listening(self) -> bool:
        return self.listener.listening

    def wait(self, timeout: float) -> None:
        """Until woken or `timeout`; a change committed before it returns is read by the catch-up that follows."""
        self._event.wait(timeout)
        self._event.clear()

    def wake(self) -> None:
        self._event.set()

    def close(self) -> None:
        self.listener.unsubscribe(self)
