"""Request bodies from bytes to a checked JSON object, every failure a ``RequestError``.

In order: UTF-8, JSON (no ``NaN``/``Infinity``, which Python's parser accepts and JSON does
not), nesting depth (iteratively, so a ``[`` * 100,000 body is a 400, not a RecursionError),
and strings (a lone surrogate such as ``"\\ud800"`` is valid JSON but no text: the tokenizer
cannot take it). The offending field is named by its path (``messages.0.content``).
"""

from __future__ import annotations

import json
from typing import Any

from router.errors import ErrorKind, RequestError


def refuse_constant(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def parse_json_object(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The body as a dict. Raises RequestError(INVALID) saying what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(
            ErrorKind.INVALID, f"the body is not valid UTF-8 (byte {e.start})"
        ) from None
    try:
        obj = json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as e:
        raise RequestError(ErrorKind.INVALID, f"malformed JSON: {e}") from None
    except ValueError as e:
        raise RequestError(ErrorKind.INVALID, f"malformed JSON: {e}") from None
    except RecursionError:
        raise RequestError(
            ErrorKind.INVALID, f"the body nests deeper than {max_depth} levels"
        ) from None
    if not isinstance(obj, dict):
        raise RequestError(ErrorKind.INVALID, "the body must be a JSON object")
    check_json_value(obj, max_depth)
    return obj


def check_json_value(obj: object, max_depth: int) -> None:
    """Depth and string checks over a parsed JSON value, without recursion."""
    stack: list[tuple[object, tuple[str | int, ...]]] = [(obj, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, dict | list):
            continue
        if len(path) >= max_depth:
            raise RequestError(
                ErrorKind.INVALID,
                f"{_dotted(path)}: nests deeper than {max_depth} levels",
                _top(path),
            )
        if isinstance(value, dict):
            for k, v in value.items():
                _check_text(k, path)
                stack.append((v, (*path, k)))
        else:
            stack.extend(
                (v, (*path, i)) for i, v in enumerate(value) if isinstance(v, str | dict | list)
            )


def _check_text(s: str, path: tuple[str | int, ...]) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        where = _dotted(path) or "the body"
        raise RequestError(
            ErrorKind.INVALID,
            f"{where}: the text holds a lone surrogate (U+{ord(s[e.start]):04X} at character "
            f"{e.start}), which is not a character",
            _top(path),
        ) from None


def _dotted(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path)


def _top(path: tuple[str | int, ...]) -> str | None:
    return str(path[0]) if path else None
