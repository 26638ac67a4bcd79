"""JSON schemas for structured-output tests and benchmarks: nested objects, enums, arrays,
bounded numbers, regex patterns, optional fields, unions. Every string is bounded (maxLength,
enum or pattern) so that a random-weight model's output ends within a few hundred tokens:
the grammar alone must make it valid."""

from __future__ import annotations

from typing import Any

_name = {"type": "string", "maxLength": 12}
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": _name, "age": {"type": "integer", "minimum": 0,
     "maximum": 130}}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
     "maxItems": 4},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
     "additionalProperties": False},
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9}},
        "required": ["x", "y"], "additionalProperties": False}},
     "required": ["point"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
     "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"tags": {"type": "array", "items": _name,
     "maxItems": 3}, "id": {"type": "string", "pattern": "^[a-f0-9]{8}$"}},
     "required": ["tags", "id"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]},
    {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number",
     "minimum": 0, "maximum": 10}}, "required": ["kind", "r"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"enum": [1, 2, 3]}}, "required": ["c"],
        "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"date": {"type": "string",
     "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}, "temp": {"type": "integer",
     "minimum": -40, "maximum": 50}}, "required": ["date", "temp"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"k": _name, "v": {
        "type": "integer", "minimum": 0, "maximum": 9}}, "required": ["k", "v"],
        "additionalProperties": False}, "maxItems": 3},
    {"type": "null"},
    {"type": "object", "properties": {"email": {"type": "string",
     "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.(com|org)$"}}, "required": ["email"],
     "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["active", "inactive"]},
     "count": {"type": "integer", "minimum": 1, "maximum": 5}, "note": _name},
     "required": ["status", "count"], "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 3, "maxItems": 3},
    {"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "array",
     "items": {"type": "integer", "minimum": 0, "maximum": 1}, "minItems": 2,
     "maxItems": 2}, "minItems": 2, "maxItems": 2}}, "required": ["matrix"],
     "additionalProperties": False},
    {"type": "object", "properties": {"version": {"type": "string",
     "pattern": "^[0-9]\\.[0-9]\\.[0-9]$"}, "stable": {"type": "boolean"}},
     "required": ["version", "stable"], "additionalProperties": False},
    {"oneOf": [{"type": "object", "properties": {"cat": _name}, "required": ["cat"],
     "additionalProperties": False}, {"type": "object", "properties": {"dog": _name},
     "required": ["dog"], "additionalProperties": False}]},
]  # fmt: skip
