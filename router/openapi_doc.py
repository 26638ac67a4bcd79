"""``/openapi.json`` for endpoints whose bodies are parsed by hand (so each failure gets
OpenAI's error body, never FastAPI's 422): the request and response schemas come from the
same pydantic models the handlers use, so the document cannot drift from the code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_REF = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI's error body, for every 4xx/5xx answer."""

    error: ErrorDetail


@dataclass(frozen=True)
class Operation:
    """What one path documents: its request body (None for GET) and its 200 bodies by media
    type (``application/json``, ``text/event-stream``)."""

    method: str
    request: type[BaseModel] | None = None
    responses: dict[str, type[BaseModel]] = field(default_factory=dict)
    errors: tuple[int, ...] = (400, 404, 413, 429, 503, 504)
    alternatives: tuple[type[BaseModel], ...] = ()  # other request bodies (oneOf)


def install_openapi(app: FastAPI, operations: dict[str, Operation]) -> None:
    """Replace ``app.openapi`` with one that documents ``operations`` (path -> Operation)."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        models: list[type[BaseModel]] = [ErrorResponse]
        for op in operations.values():
            if op.request is not None:
                models.append(op.request)
            models.extend(op.alternatives)
            models.extend(op.responses.values())
        unique = list(dict.fromkeys(models))
        _, defs = models_json_schema([(m, "validation") for m in unique], ref_template=_REF)
        doc.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
        for path, op in operations.items():
            entry = doc["paths"].setdefault(path, {}).setdefault(op.method, {})
            if op.request is not None:
                schema: dict[str, Any] = _ref(op.request)
                if op.alternatives:
                    schema = {"oneOf": [schema, *(_ref(m) for m in op.alternatives)]}
                entry["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": schema}},
                }
            responses: dict[str, Any] = {}
            if op.responses:
                responses["200"] = {
                    "description": "OK",
                    "content": {media: {"schema": _ref(m)} for media, m in op.responses.items()},
                }
            for status in op.errors:
                responses[str(status)] = {
                    "description": _ERROR_TEXT.get(status, "error"),
                    "content": {"application/json": {"schema": _ref(ErrorResponse)}},
                }
            if responses:
                entry["responses"] = responses
        app.openapi_schema = doc
        return doc

    setter: Callable[[], dict[str, Any]] = build
    app.openapi = setter  # type: ignore[method-assign]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


_ERROR_TEXT = {
    400: "invalid request (the message and param name the field)",
    404: "unknown model",
    413: "request body too large",
    429: "too many requests in flight (Retry-After)",
    503: "not serving (shutting down, workers unreachable)",
    504: "the request's timeout passed",
}
