"""Admission control: how many requests are served at once, and how much of their bodies is held.

Requests are admitted in two classes, so that a client without a key cannot take a keyed client's
place. A request whose key is known to be good (`ApiKeyAuth` checked its X-API-Key header, or no keys
are configured) takes one of FACEGATE_MAX_INFLIGHT_REQUESTS slots. A request whose key is not known
yet — DeepStack's routes, whose clients send the key as a form field that is read with the body —
takes one of FACEGATE_MAX_UNAUTHENTICATED_REQUESTS slots, at most FACEGATE_MAX_UNAUTHENTICATED_PER_CLIENT
from one client address (both counted for the whole host by its model host under `facegate serve
--workers N`), and moves to a keyed slot once its key checks out (`Ticket.authenticated`).
However many anonymous uploads trickle, keyed clients keep their slots. Beyond either limit: a JSON
503 `overloaded` with Retry-After, at once.

A keyed request's body is charged to FACEGATE_MAX_BODY_MEGABYTES (`service.budget.BodyBudget`) as it
arrives (`Ticket.charge`, called by `service.api.middleware.BodyLimit` for each piece) and held until
its answer: what has arrived, never what is declared, so a body that trickles holds next to nothing
(and BodyLimit ends it at its minimum upload rate). A piece that does not fit waits up to
FACEGATE_DECODE_WAIT seconds, the body no longer read meanwhile, then 503. An unauthenticated
request's body is bounded by its class (its slots × FACEGATE_MAX_REQUEST_BYTES) and enters the budget,
what has arrived of it, with its key.

Counts not open connections (an idle socket costs a file descriptor, and `service.api.server` closes
it at its header deadline), and never refuses /healthz, /readyz, /metrics or the console's static
files: those hold no slot, since they cost a file read at most and a flood of them (2,000 GETs of
/console/js/main.js, 128 at once) must not take the slots of keyed image requests. The event loop is
single-threaded: plain counters are exact."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api import console
from service.api.error_handlers import error_response
from service.budget import BodyBudget, SharedTally, take_shared
from service.core.errors import FacegateError, Overloaded

ALWAYS_ADMITTED = {"/healthz", "/readyz", "/metrics"}
AUTHENTICATED = "facegate.authenticated"  # scope key set by ApiKeyAuth: the request's key checked out (or none is needed)
TICKET = "facegate.admission"  # scope key: the request's Ticket
ANONYMOUS = "anonymous"  # the shared tally's name for requests whose key is not yet known (and, with an address, one client's)
GIVE_WAY_POLL = 0.05  # seconds between looks, while a body waits for room, at whether every holder waits too


class Ticket:
    """One admitted request's slot and body share, released when it ends."""

    def __init__(self, admission: Admission, keyed: bool, client: str, shared: SharedTally | None = None):
        """`shared`: where an unauthenticated request's slot is also counted for the whole host."""
        self.admission, self.keyed, self.client, self.shared = admission, keyed, client, shared
        self.number = next(admission.numbers)  # its order of admission: the newest gives way
        self.arrived = 0  # bytes of the body received so far
        self.held = 0  # bytes of the body budget taken
        self.need = 0  # bytes of it the piece it waits with needs

    async def charge(self, size: int) -> None:
        """`size` more bytes of the body arrived: a keyed request takes them from the body budget
        (waiting for room, then 503 overloaded); an unauthenticated one counts them for later.
        Bodies arriving at once can each hold part of the budget and all wait for more: when every
        holder waits, none can finish, and the newest gives way (503) so that the others can."""
        self.arrived += size
        admission = self.admission
        room = admission.bodies.capacity - self.held  # a body larger than the whole budget holds all of it
        if not (self.keyed and size and room):
            return
        bodies, deadline = admission.bodies, time.monotonic() + admission.bodies.wait
        self.need = min(size, room)
        try:
            while True:
                try:
                    self.held += await bodies.acquire(self.need, wait=GIVE_WAY_POLL)
                    admission.holding.add(self)
                    return
                except Overloaded:
                    admission.waiting.add(self)  # after a first look found no room
                    if time.monotonic() >= deadline:
                        raise Overloaded(f"the {bodies.setting} stayed spent for {bodies.wait:g} s; retry later") from None
                    if admission.gives_way() is self:
                        raise Overloaded(
                            "request bodies still arriving fill FACEGATE_MAX_BODY_MEGABYTES and each waits for more: "
                            f"the newest gives way; retry in {Overloaded.retry_after} s"
                        ) from None
        finally:
            admission.waiting.discard(self)

    async def authenticated(self) -> None:
        """The key read from the body checked out: move to a keyed slot and into the body budget with
        what has arrived (503 overloaded when the keyed slots are full, or the budget stays spent)."""
        if self.keyed:
            return
        admission = self.admission
        admission.leave_unauthenticated(self.client, self.shared)
        self.keyed = True
        admission.inflight += 1
        if admission.inflight > admission.limit:
            raise Overloaded(admission.full_message())
        self.held = await admission.bodies.acquire(self.arrived)
        admission.holding.add(self)

    async def release(self) -> None:
        if self.keyed:
            self.admission.inflight -= 1
            try:
                if self.held:
                    await self.admission.bodies.release(self.held)
            finally:  # a holder until its share is back: else the others could see none but waiters and give way
                self.admission.holding.discard(self)
        else:
            self.admission.leave_unauthenticated(self.client, self.shared)


def _shared_tally(scope: Scope) -> SharedTally | None:
    """The counts the worker processes of this host share (their model host's), if any: known once
    the app's lifespan has started it."""
    service = getattr(getattr(scope.get("app"), "state", None), "service", None)
    hosted = getattr(service, "hosted", None)
    return hosted if isinstance(hosted, SharedTally) else None


def _give(shared: SharedTally, name: str) -> None:
    """One of `name`'s count back to the host, off the loop as its take (a send may wait on the link's lock)."""
    asyncio.get_running_loop().run_in_executor(None, shared.give, name, 1)


def client_address(scope: Scope) -> str:
    return (scope.get("client") or ("unknown",))[0]


def ticket(request: Request) -> Ticket | None:
    """The request's admission ticket (None on a path never refused)."""
    found: Ticket | None = request.scope.get(TICKET)
    return found


class Admission:
    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        unauthenticated: int,
        per_client: int,
        bodies: BodyBudget,
    ):
        self.app, self.limit, self.unauthenticated, self.per_client = app, limit, unauthenticated, per_client
        self.bodies = bodies
        self.inflight = 0
        self.numbers = itertools.count()
        self.holding: set[Ticket] = set()  # keyed requests holding part of the body budget
        self.waiting: set[Ticket] = set()  # requests waiting for room in it
        self.waiting_for_key: Counter[str] = Counter()  # unauthenticated requests by client address

    def gives_way(self) -> Ticket | None:
        """Where every request holding part of the body budget waits for more than is free (none can
        finish and give any back), the newest of them, which is refused so that the others go on; else None."""
        if self.holding and self.holding <= self.waiting and all(waiting.need > self.bodies.free for waiting in self.waiting):
            return max(self.holding, key=lambda held: held.number)
        return None

    def full_message(self) -> str:
        return f"{self.limit} requests are being served (FACEGATE_MAX_INFLIGHT_REQUESTS); retry in {Overloaded.retry_after} s"

    def leave_unauthenticated(self, client: str, shared: SharedTally | None) -> None:
        self.waiting_for_key[client] -= 1
        if self.waiting_for_key[client] <= 0:
            del self.waiting_for_key[client]  # the counter stays as small as the requests in flight
        if shared is not None:
            _give(shared, ANONYMOUS)
            _give(shared, f"{ANONYMOUS} {client}")

    async def _shared_refusal(self, shared: SharedTally, client: str) -> str | None:
        """The host-wide count of unauthenticated requests (`facegate serve --workers N`: the model
        host's tally), taken for this one; the refusal where it is full."""
        if not await take_shared(shared, ANONYMOUS, 1, self.unauthenticated):
            return self._all_taken()
        try:
            taken = await take_shared(shared, f"{ANONYMOUS} {client}", 1, self.per_client)
        except BaseException:
            _give(shared, ANONYMOUS)
            raise
        if not taken:
            _give(shared, ANONYMOUS)
            return self._client_taken()
        return None

    def _all_taken(self) -> str:
        return (
            f"{self.unauthenticated} requests whose key is not yet known are being served "
            f"(FACEGATE_MAX_UNAUTHENTICATED_REQUESTS); send the key as an X-API-Key header, or retry in {Overloaded.retry_after} s"
        )

    def _client_taken(self) -> str:
        return (
            f"{self.per_client} requests whose key is not yet known are being served for this client "
            f"(FACEGATE_MAX_UNAUTHENTICATED_PER_CLIENT); send the key as an X-API-Key header, or retry in {Overloaded.retry_after} s"
        )

    def _refusal(self, scope: Scope) -> str | None:
        if scope.get(AUTHENTICATED):
            return self.full_message() if self.inflight >= self.limit else None
        client = client_address(scope)
        if sum(self.waiting_for_key.values()) >= self.unauthenticated:
            return self._all_taken()
        if self.waiting_for_key[client] >= self.per_client:
            return self._client_taken()
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in ALWAYS_ADMITTED or console.is_console(scope["path"]):
            return await self.app(scope, receive, send)
        refusal = self._refusal(scope)
        if refusal:
            return await error_response(Overloaded(refusal))(scope, receive, send)
        keyed = bool(scope.get(AUTHENTICATED))
        client = client_address(scope)
        shared = None if keyed else _shared_tally(scope)
        if shared is not None:
            try:
                refusal = await self._shared_refusal(shared, client)
            except (OSError, EOFError, FacegateError):  # the model host is away or slow to answer: this process's counts hold
                shared, refusal = None, None
            if refusal:
                return await error_response(Overloaded(refusal))(scope, receive, send)
        admitted = Ticket(self, keyed, client, shared)
        if keyed:
            self.inflight += 1
        else:
            self.waiting_for_key[client] += 1
        scope[TICKET] = admitted
        try:
            await self.app(scope, receive, send)
        finally:
            await admitted.release()
