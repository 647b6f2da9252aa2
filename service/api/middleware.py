"""Pure ASGI middleware, outermost first: request metrics, the idle trim's count of work, API-key check, admission control
(`service.api.admission`), body size limit and deadline, and cancellation of a request whose client
went away.

The body limit refuses a declared Content-Length
above the limit before reading anything, caps the bytes actually streamed (chunked uploads
declare nothing), gives the whole body FACEGATE_BODY_TIMEOUT seconds to arrive and keeps it arriving
at FACEGATE_BODY_MIN_RATE, and charges each piece to the request's admission ticket as it arrives."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import body_key, console
from service.api.admission import AUTHENTICATED, TICKET, Ticket, client_address
from service.api.auth import ApiKeys
from service.api.error_handlers import WhileReading, error_response
from service.budget import CLIENT
from service.core.errors import BodyTooLarge, FacegateError, RequestTimeout, Unauthorized
from service.gallery.collection_names import COLLECTION, DEFAULT
from service.metrics import Metrics
from service.runtime.heap import IdleTrim

PUBLIC_PATHS = {"/healthz", "/readyz"}
ABANDONED = "facegate.abandoned"  # scope key: the client went away before its answer (metrics count a 499)
# Metric label values come from closed sets: anyone can invent a method or a path.
METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}


class RequestMetrics:
    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            status = 499 if scope.get(ABANDONED) else status  # nginx's "client closed request"
            route = scope.get("route")
            label = getattr(route, "path", "unmatched")  # the template, never the raw path: bounded label values
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.requests.labels(label, method, str(status)).inc()
            self.metrics.latency.labels(label, method).observe(time.perf_counter() - started)


class NoteWork:
    """Counts each request, as it starts and as it ends, as this process's work, after which the
    idle trim gives the heap back (`heap.IdleTrim`)."""

    def __init__(self, app: ASGIApp, idle: IdleTrim):
        self.app, self.idle = app, idle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.idle.note()
        try:
            await self.app(scope, receive, send)
        finally:
            self.idle.note()


class ApiKeyAuth:
    """`body_key_paths`: routes whose clients send the key in the body (DeepStack's `api_key` form
    field); their route class checks it, header or field, once the body is read, and a key among the
    body's first fields (`service.api.body_key`) already counts here. A request whose
    key checked out here (or that needs none) is marked `AUTHENTICATED` for admission control.
    `refusals`: under a path prefix, the answer to a missing or empty (False) or wrong (True) key in
    a foreign API's shape.
    The console's static files need no key: they hold no data, and every call they make sends one."""

    def __init__(
        self,
        app: ASGIApp,
        keys: ApiKeys,
        body_key_paths: frozenset[str] = frozenset(),
        refusals: Mapping[str, Callable[[bool], Response]] | None = None,
    ):
        self.app, self.keys, self.body_key_paths, self.refusals = app, keys, body_key_paths, refusals or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        presented = [value for name, value in scope["headers"] if name == b"x-api-key"]
        # Two X-API-Key headers are refused: which one a proxy or a framework reads differs.
        collection = self.keys.collection(presented[0].decode("latin-1")) if len(presented) == 1 else None
        valid = not self.keys.enabled or collection is not None
        path = scope.get("path")
        key = presented[0].decode("latin-1") if self.keys.enabled and valid else None  # a key that checked out, never one made up
        if not valid and not presented and path in self.body_key_paths:  # a key in the body's first fields counts before admission
            key, receive = await body_key.peek_key(scope, receive)
            collection = self.keys.collection(key)
            valid = collection is not None
        # the caller's collection (anonymous: the one collection); a body-key route sets its own once it read the key
        scope[COLLECTION] = collection if self.keys.enabled else DEFAULT
        # who the request is for fairness (service.budget.CostLanes): its key, else its address
        CLIENT.set(f"key {hashlib.sha256(key.encode()).hexdigest()[:16]}" if valid and key else f"address {client_address(scope)}")
        public = path in PUBLIC_PATHS or path in self.body_key_paths or (path is not None and console.is_console(path))
        if not valid and not public:
            refuse = next((r for prefix, r in self.refusals.items() if scope["path"].startswith(prefix)), None)
            response = refuse(any(presented)) if refuse else error_response(Unauthorized("a valid X-API-Key header is required"))
            return await response(scope, receive, send)
        # A body-key route's key is not known yet; the console's files need none (and admission holds no slot for them).
        scope[AUTHENTICATED] = valid or (public and path not in self.body_key_paths)
        await self.app(scope, receive, send)


class BodyLimit:
    """`min_rate`: bytes a second the body must keep arriving at, judged over RATE_WINDOW seconds (the
    spirit of nginx's client_body_timeout, by volume rather than by read): a trickle is ended within
    a window instead of holding its slot for FACEGATE_BODY_TIMEOUT. Time spent waiting for room in the
    body budget (`Ticket.charge`) is not the client's: both clocks stop meanwhile."""

    RATE_WINDOW = 5.0  # seconds

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 60.0, min_rate: int = 0):
        self.app, self.max_bytes, self.timeout, self.min_rate = app, max_bytes, timeout, min_rate

    def _too_large(self) -> str:
        return f"the request body exceeds the {self.max_bytes}-byte limit (FACEGATE_MAX_REQUEST_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(BodyTooLarge(self._too_large()), headers={"Connection": "close"})
            return await response(scope, receive, send)
        admitted: Ticket | None = scope.get(TICKET)
        seen = 0
        deadline = time.monotonic() + self.timeout
        window = self.min_rate * self.RATE_WINDOW  # bytes due by `window_end`
        window_end, window_seen = time.monotonic() + self.RATE_WINDOW, 0
        complete = False

        def timed_out(slow: bool) -> WhileReading:
            message = (
                f"the request body arrived slower than {self.min_rate} bytes/s over {self.RATE_WINDOW:g} s (FACEGATE_BODY_MIN_RATE)"
                if slow
                else f"the request body did not arrive within {self.timeout:g} s (FACEGATE_BODY_TIMEOUT)"
            )
            return WhileReading(RequestTimeout(message), headers={"Connection": "close"})

        async def capped() -> Message:
            nonlocal seen, complete, deadline, window_end, window_seen
            if complete:  # after the body only a disconnect can come: no deadline on waiting for it
                return await receive()
            until = min(deadline, window_end) if window else deadline
            try:
                message = await asyncio.wait_for(receive(), max(until - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                raise timed_out(slow=until < deadline) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                seen += size
                if seen > self.max_bytes:
                    raise WhileReading(BodyTooLarge(self._too_large()))
                window_seen += size
                if window_seen >= window:
                    window_end, window_seen = time.monotonic() + self.RATE_WINDOW, 0
                if admitted is not None:
                    waited = time.monotonic()
                    try:
                        await admitted.charge(size)
                    except FacegateError as exc:  # the budget stayed spent
                        raise WhileReading(exc) from None
                    waited = time.monotonic() - waited
                    deadline, window_end = deadline + waited, window_end + waited
            return message

        await self.app(scope, capped, send)


class CancelOnDisconnect:
    """Stops a request's work when its client goes away before the answer. Once the app has read
    the whole body, the next message can only be a disconnect: a watcher waits for it and cancels
    the request (the engine then stops its decoder process: `Engine.faces`). Starlette does not do
    this for ordinary responses, so an abandoned image would be decoded and embedded to the end."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body_read = asyncio.Event()
        answered = False
        request = asyncio.current_task()
        assert request is not None

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def send_answer(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        async def watch() -> None:
            await body_read.wait()
            if (await receive())["type"] == "http.disconnect" and not answered:
                scope[ABANDONED] = True
                request.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await self.app(scope, receive_body, send_answer)
        except asyncio.CancelledError:
            if not scope.get(ABANDONED):
                raise
            uncancel = getattr(request, "uncancel", None)  # Python 3.11+: the cancellation was ours, and is handled
            if uncancel:
                uncancel()
        finally:
            watcher.cancel()
