"""Request bodies. Image requests come in either encoding: multipart/form-data (files plus text
fields) or a JSON object whose image fields hold base64 strings under the same names. Both end as
the same options model and raw image bytes (`read_image_request`, the opening every image route
shares), and `request_body` documents both in the OpenAPI schema. Every JSON body, image or
gallery, is parsed by `parse_json` (`read_json_model` for the gallery's), so malformed or absurdly
nested JSON is one 400 everywhere, and a field given twice is refused rather than silently
overwritten. Parsing and validation both run on a worker thread: a body of up to
FACEGATE_MAX_REQUEST_BYTES never holds the event loop (and /healthz) while it is read into models."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from service.core.errors import InvalidBase64, InvalidJson, InvalidParameters, UnsupportedMediaType
from service.readiness import Readiness

MAX_FORM_FIELDS = 64  # text fields in one multipart body: every route takes a handful
# Objects and arrays in one JSON body, counted before parsing (an upper bound: brackets inside strings
# count too; base64 has none). The largest legitimate body, metadata at its limit, holds far fewer;
# millions of `{}` would cost seconds and hundreds of MB to parse.
MAX_JSON_CONTAINERS = 10_000
# Values (numbers, strings, …) in one JSON body, bounded before parsing by its commas: a flat list is
# one container, and millions of its items cost seconds to validate. The largest legitimate body,
# CompreFace's 1,000 embeddings of 512 numbers, holds about half of it.
MAX_JSON_VALUES = 1_000_000
# An escaped UTF-16 surrogate (\ud800–\udfff): paired it is one character, alone it is not text.
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
IMAGE = "An image (JPEG, PNG, WebP, BMP, GIF, TIFF): a file part, or base64 in a JSON body."
Options = TypeVar("Options", bound=BaseModel)
Model = TypeVar("Model", bound=BaseModel)


def validation_message(exc: ValidationError | Any) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads' object hook: a repeated member would otherwise silently keep the last value."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise InvalidParameters(f"{key} is given more than once")
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise InvalidJson(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _finite(text: str) -> float:
    """json.loads' float hook: `1e400` would otherwise become Infinity, which no JSON can answer."""
    value = float(text)
    if not math.isfinite(value):
        raise InvalidJson(f"the number {text[:40]} is beyond a double's range")
    return value


def parse_json(raw: bytes) -> Any:
    """The one JSON parser for request bodies: UTF-8 only, no NaN/Infinity or float overflow, at most
    MAX_JSON_CONTAINERS objects and arrays and MAX_JSON_VALUES values, no unpaired surrogate (422:
    no store can hold it, and no answer could carry it). Nesting deep enough to exhaust the parser's
    recursion (a few hundred levels) and integers past Python's digit limit are malformed input
    here, not server errors. Blocking: routes call it off the event loop."""
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_JSON_CONTAINERS:
        raise InvalidJson(f"the JSON body holds more than {MAX_JSON_CONTAINERS} objects and arrays")
    if raw.count(b",") + containers > MAX_JSON_VALUES:
        raise InvalidJson(f"the JSON body holds more than {MAX_JSON_VALUES} values")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidJson("the JSON body is not UTF-8") from None
    try:
        parsed = json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise InvalidJson(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJson("the JSON body is nested too deeply") from None
    except ValueError:  # an integer of more than sys.get_int_max_str_digits() digits
        raise InvalidJson("the JSON body holds a number too long to read") from None
    if SURROGATE_ESCAPE.search(raw) and _unpaired_surrogate(parsed):
        raise InvalidParameters(
            "the JSON body holds an unpaired UTF-16 surrogate (an escape in \\ud800–\\udfff without its pair): "
            "that is not text, and cannot be stored"
        )
    return parsed


def _unpaired_surrogate(value: Any) -> bool:
    """Whether any string of a parsed body, key or value, holds a lone surrogate (UTF-8 refuses it)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _media(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _is_json(media: str) -> bool:
    return media == "application/json" or media.endswith("+json")


async def read_json_model(request: Request, model: type[Model], check: Callable[[Model], None] | None = None) -> Model:
    """A JSON body (no content type is read as JSON, as curl without -H sends) as `model`, then
    `check`ed (a route's own limits): parsed, validated and checked on a worker thread."""
    media = _media(request)
    if media and not _is_json(media):
        raise UnsupportedMediaType(f"unsupported content type {media!r}; send application/json")
    return await run_in_threadpool(_json_model, await request.body(), model, check)


def _json_model(raw: bytes, model: type[Model], check: Callable[[Model], None] | None) -> Model:
    body = validated(model, parse_json(raw))
    if check is not None:
        check(body)
    return body


def validated(model: type[Model], value: Any) -> Model:
    """`value` as `model`, or 422 invalid_parameters saying what is wrong. Blocking for a large value."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise InvalidParameters(validation_message(exc)) from None


def _b64(name: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise InvalidParameters(f"{name}: a base64 string is expected in a JSON body")
    if value.startswith("data:") and "base64," in value:
        value = value.split("base64,", 1)[1]  # a data: URL as browsers make them
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidBase64(f"{name} is not valid base64") from None


@dataclass(frozen=True)
class ImageRequest(Generic[Options]):
    options: Options
    images: dict[str, bytes]  # by field name
    many: list[bytes]  # the `multi` field's images, in order


async def read_image_request(
    request: Request,
    readiness: Readiness,
    options: type[Options],
    required: tuple[str, ...] = (),
    optional: tuple[str, ...] = (),
    multi: str | None = None,
    max_files: int = 8,
) -> ImageRequest[Options]:
    """Parse the body, refuse while no model is usable (503), then require the `required` images.
    `max_files`: most file parts (Starlette answers 400 bad_request beyond it, before reading them)."""
    parsed, found, many = await _parse(request, options, required + optional, multi, max_files)
    readiness.require()
    for name in required:
        if name not in found:
            raise InvalidParameters(f"{name} is required")
    return ImageRequest(parsed, found, many)


async def _parse(request: Request, options: type[Options], images: tuple[str, ...], multi: str | None, max_files: int):
    """(options, {field: bytes}, [bytes of the `multi` field]) from a multipart or JSON body."""
    media = _media(request)
    fields: dict[str, Any] = {}
    found: dict[str, bytes] = {}
    many: list[bytes] = []
    if media == "multipart/form-data":
        async with request.form(max_files=max_files, max_fields=MAX_FORM_FIELDS) as form:
            for name, value in form.multi_items():
                if name != multi and (name in found or name in fields):
                    raise InvalidParameters(f"{name} is given more than once")
                if isinstance(value, UploadFile):
                    if name == multi:
                        many.append(await value.read())
                    elif name in images:
                        found[name] = await value.read()
                    else:
                        raise InvalidParameters(
                            f"unexpected file field {name!r}; image fields are {', '.join(images + ((multi,) if multi else ()))}"
                        )
                elif name in images or name == multi:
                    raise InvalidParameters(f"{name} must be a file part in a multipart body (base64 strings belong in a JSON body)")
                else:
                    fields[name] = value
    elif _is_json(media):
        fields, found, many = await run_in_threadpool(_json_fields, await request.body(), images, multi)
    else:
        raise UnsupportedMediaType(f"unsupported content type {media or '(none)'!r}; send multipart/form-data or application/json")
    return await run_in_threadpool(validated, options, fields), found, many


def _json_fields(raw: bytes, images: tuple[str, ...], multi: str | None) -> tuple[dict[str, Any], dict[str, bytes], list[bytes]]:
    """A JSON image body → (option fields, {image field: bytes}, [bytes of the `multi` field]);
    blocking (parsing and base64 of up to FACEGATE_MAX_REQUEST_BYTES), run off the event loop."""
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise InvalidParameters("the JSON body must be an object")
    fields: dict[str, Any] = {}
    found: dict[str, bytes] = {}
    many: list[bytes] = []
    for name, value in body.items():
        if name == multi:
            if not isinstance(value, list):
                raise InvalidParameters(f"{name}: a list of base64 strings is expected")
            many.extend(_b64(f"{name}[{i}]", v) for i, v in enumerate(value))
        elif name in images:
            found[name] = _b64(name, value)
        else:
            fields[name] = value
    return fields, found, many


def request_body(
    options: type[BaseModel], images: dict[str, str], required: list[str], multi: tuple[str, str] | None = None, example: dict | None = None
) -> dict:
    """`openapi_extra` documenting a route's body in both encodings."""

    def schema(image_type: dict) -> dict:
        base = options.model_json_schema()
        props = {name: {**image_type, "description": text} for name, text in images.items()}
        if multi:
            props[multi[0]] = {"type": "array", "items": image_type, "description": multi[1]}
        out = {**base, "properties": {**props, **base.get("properties", {})}}
        if required:
            out["required"] = required
        return out

    json_schema = schema({"type": "string", "contentEncoding": "base64"})
    if example:
        json_schema["example"] = example
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {"schema": schema({"type": "string", "format": "binary"})},
                "application/json": {"schema": json_schema},
            },
        }
    }
