"""HTTP request bodies in, OpenAI error bodies out: the parts every endpoint shares.

A body is read with a size cap (413), parsed by ``router.json_body`` (depth, NaN, surrogates),
then validated by pydantic in strict mode; each failure is OpenAI's error body naming the
field, never FastAPI's 422.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from router.errors import ErrorKind, RequestError
from router.json_body import parse_json_object
from router.service import Router

M = TypeVar("M", bound=BaseModel)

_HTTP_STATUS = {
    ErrorKind.INVALID: 400,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.BUSY: 429,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.INTERNAL: 500,
}
CLIENT_CLOSED_REQUEST = 499  # nginx's code; nobody reads it, but logs do


def error_body(e: RequestError) -> dict[str, Any]:
    status = _HTTP_STATUS[e.kind]
    return {"error": {"message": e.message, "type": e.kind.value, "param": e.param, "code": status}}


def error_response(e: RequestError) -> JSONResponse:
    headers = {}
    if e.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(e.retry_after_s)))
    return JSONResponse(error_body(e), status_code=_HTTP_STATUS[e.kind], headers=headers)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused with 413 past ``max_bytes`` (before reading it all when the
    client declares its length)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(int(declared), max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(size, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, max_bytes: int) -> RequestError:
    return RequestError(
        ErrorKind.TOO_LARGE,
        f"the request body is {size}+ bytes; this server reads at most {max_bytes}",
    )


_PARSE_INLINE_BYTES = 64 << 10  # larger bodies are parsed on a worker thread


async def parse_body(request: Request, model: type[M], router: Router) -> M:
    raw = await read_body(request, router.limits.max_body_bytes)
    depth = router.limits.max_json_depth
    if len(raw) <= _PARSE_INLINE_BYTES:
        obj = parse_json_object(raw, depth)
    else:
        obj = await asyncio.to_thread(parse_json_object, raw, depth)
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = first["loc"]
        param = str(loc[0]) if loc else None
        where = ".".join(str(p) for p in loc)
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "not a field this server knows; it would be ignored, so it is refused"
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if not loc:  # a whole-body rule: its message starts with the field it is about
            m = re.match(r"([a-z_]+):", message)
            param = m.group(1) if m else None
            raise RequestError(ErrorKind.INVALID, message, param) from None
        raise RequestError(ErrorKind.INVALID, f"{where}: {message}", param) from None
