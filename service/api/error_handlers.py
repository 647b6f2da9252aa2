"""Every failure in one schema, `{"error": {"code", "message"}}`: the typed errors, FastAPI's
validation errors, routing errors (404/405, 413 from the body limit) and, as a last resort,
unexpected exceptions (500, logged: a 5xx for bad input is a bug). Codes come from
`service.core.errors` only. Under a foreign API's prefix (`shapes`: CompreFace's /api/v1/) they come
in that API's shape instead, so its clients read an unknown route's error as they read any other."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from service.api.requests import validation_message
from service.core.errors import FacegateError, InternalError, InvalidParameters, error_for_status

log = logging.getLogger("facegate.api")


def error_response(error: FacegateError, status: int | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The answer for an error; `status` overrides the class's for a bare HTTP status it stands for.
    An error that will pass (`overloaded`, `gallery_loading`, a model host restarting) says when to retry, wherever it was raised."""
    if error.retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(error.retry_after)}
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details is not None:
        body["details"] = error.details
    return JSONResponse({"error": body}, status_code=status or error.status, headers=headers)


class WhileReading(HTTPException):
    """A typed error raised while a body is read (by `service.api.middleware.BodyLimit`): FastAPI turns
    any exception from its body parsing into a 400 but an HTTPException, which it passes on; the
    handler answers with the error it carries."""

    def __init__(self, error: FacegateError, headers: Mapping[str, str] | None = None):
        retry = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}  # for routes that answer it themselves
        super().__init__(error.status, error.message, headers={**(headers or {}), **retry})
        self.error = error


def install(app: FastAPI, shapes: Mapping[str, Callable[[FacegateError], JSONResponse]]) -> None:
    """`shapes`: a path prefix → how errors under it are answered (a foreign API's error shape)."""

    def answer(request: Request, error: FacegateError, status: int | None = None, headers: Mapping[str, str] | None = None):
        shape = next((render for prefix, render in shapes.items() if request.url.path.startswith(prefix)), None)
        if shape is None:
            return error_response(error, status, headers)
        response = shape(error)
        response.status_code = status or error.status
        response.headers.update(headers or {})
        return response

    @app.exception_handler(FacegateError)
    async def facegate_error(request: Request, exc: FacegateError) -> JSONResponse:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(request, InvalidParameters(validation_message(exc)))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if isinstance(exc, WhileReading):
            return answer(request, exc.error, headers=exc.headers)
        error = error_for_status(exc.status_code)(str(exc.detail))
        return answer(request, error, exc.status_code, exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return answer(request, InternalError("an unexpected server error occurred; it has been logged"))
