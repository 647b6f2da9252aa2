"""Every failure in one schema, `{"error": {"code", "message"}}`: the typed errors, FastAPI's
validation errors, routing errors (404/405, 413 from the body limit) and, as a last resort,
unexpected exceptions (500, logged: a 5xx for bad input is a bug). Codes come from
`service.core.errors` only."""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
    An `overloaded` or `gallery_loading` answer says when to retry, wherever it was raised (admission, a budget, a route)."""
    if error.retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(error.retry_after)}
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details is not None:
        body["details"] = error.details
    return JSONResponse({"error": body}, status_code=status or error.status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(FacegateError)
    async def facegate_error(_: Request, exc: FacegateError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(InvalidParameters(validation_message(exc)))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        error = error_for_status(exc.status_code)(str(exc.detail))
        return error_response(error, exc.status_code, exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(InternalError("an unexpected server error occurred; it has been logged"))
