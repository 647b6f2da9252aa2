"""Pure ASGI middleware, outermost first: request metrics, API-key check, body size limit.

The body limit refuses a declared Content-Length above the limit before reading anything, and
caps the bytes actually streamed (chunked uploads declare nothing)."""

from __future__ import annotations

import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.auth import ApiKeys
from service.api.error_handlers import error_response
from service.errors import BodyTooLarge, Unauthorized
from service.metrics import Metrics

PUBLIC_PATHS = {"/healthz", "/readyz"}


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
            route = scope.get("route")
            label = getattr(route, "path", "unmatched")  # the template, never the raw path: bounded label values
            self.metrics.requests.labels(label, scope["method"], str(status)).inc()
            self.metrics.latency.labels(label, scope["method"]).observe(time.perf_counter() - started)


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, keys: ApiKeys):
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.keys.enabled and scope["path"] not in PUBLIC_PATHS:
            presented = dict(scope["headers"]).get(b"x-api-key", b"").decode("latin-1")
            if not self.keys.check(presented):
                response = error_response(Unauthorized("a valid X-API-Key header is required"))
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> str:
        return f"the request body exceeds the {self.max_bytes}-byte limit (FACEGATE_MAX_REQUEST_BYTES)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(BodyTooLarge(self._too_large()), headers={"Connection": "close"})
            return await response(scope, receive, send)
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # An HTTPException, not BodyTooLarge: FastAPI turns any other error while it reads a
                    # body into a 400; the handler answers 413 with BodyTooLarge's code.
                    raise HTTPException(BodyTooLarge.status, self._too_large())
            return message

        await self.app(scope, capped, send)
