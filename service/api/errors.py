"""Every failure in one schema, `{"error": {"code", "message"}}`: the pipeline's typed errors,
FastAPI's validation errors, routing errors (404/405, 413 from the body limit) and, as a last
resort, unexpected exceptions (500, logged: a 5xx for bad input is a bug)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from service.api.body import validation_message
from service.api.schemas import ErrorResponse
from service.errors import FacegateError

log = logging.getLogger("facegate.api")

HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


def error_response(status: int, code: str, message: str, details: list | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(FacegateError)
    async def facegate_error(_: Request, exc: FacegateError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, getattr(exc, "details", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_parameters", validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}"), str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "an unexpected server error occurred; it has been logged")


def documented(*statuses: int) -> dict:
    """`responses=` entries for a route's error statuses, all in the one error schema."""
    descriptions = {
        400: "Undecodable image or JSON",
        401: "Missing or invalid X-API-Key (when keys are configured)",
        404: "Unknown subject or face",
        409: "A subject with this id exists",
        413: "Body or image too large",
        415: "Unsupported content type or image format",
        422: "Bad parameters, no face, multiple faces, low quality, unknown FAR",
        503: "Model unavailable",
    }
    return {s: {"model": ErrorResponse, "description": descriptions[s]} for s in statuses}
