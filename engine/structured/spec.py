"""What a request's output must match, as plain data that crosses every process boundary.

``StructuredOutput.kind`` is one of:

| kind          | value                         | from (OpenAI / vLLM)                   |
|---------------|-------------------------------|----------------------------------------|
| ``json``      | a JSON schema (JSON text)     | response_format json_schema, guided_json |
| ``json_object`` | ``""`` (any JSON object)    | response_format json_object            |
| ``regex``     | a regular expression          | guided_regex                           |
| ``choice``    | a JSON list of strings        | guided_choice                          |
| ``grammar``   | Lark, or GBNF (``root ::=``)  | guided_grammar, tool_choice            |

``to_grammar`` compiles it to llguidance's grammar text; ``validate`` checks it without a
tokenizer (the router calls it, so a bad schema is a 400 before any response starts). Neither
imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

Kind = Literal["json", "json_object", "regex", "choice", "grammar"]
KINDS: tuple[Kind, ...] = ("json", "json_object", "regex", "choice", "grammar")

# JSON without optional whitespace: a model cannot pad its output with endless blanks. Every
# JSON this server forces uses it: response formats here, and tool calls' bodies, whose Lark
# grammar carries it as the schema's "x-guidance" (router/openai_tools.py).
JSON_OPTIONS: Any = {"whitespace_flexible": False}


@dataclass(frozen=True)
class StructuredOutput:
    kind: Kind
    value: str = ""
    # The request field it came from, for error messages (not part of the grammar's identity).
    field: str = field(default="response_format", compare=False)

    def to_grammar(self) -> str:
        """llguidance's grammar for this spec. Raises ValueError naming the field."""
        try:
            if self.kind == "json":
                return str(
                    llguidance.LLMatcher.grammar_from_json_schema(
                        json.loads(self.value), defaults=JSON_OPTIONS
                    )
                )
            if self.kind == "json_object":
                return str(
                    llguidance.LLMatcher.grammar_from_json_schema(
                        {"type": "object"}, defaults=JSON_OPTIONS
                    )
                )
            if self.kind == "regex":
                return str(llguidance.LLMatcher.grammar_from_regex(self.value))
            if self.kind == "choice":
                choices = json.loads(self.value)
                alternatives = " | ".join(json.dumps(c) for c in choices)
                return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"))
            text = self.value
            if "::=" in text:  # GBNF (llama.cpp's), as vLLM's guided_grammar examples write it
                text = gbnf_to_lark(text)
            return str(llguidance.LLMatcher.grammar_from_lark(text))
        except ValueError as e:
            raise ValueError(f"{self.field}: {e}") from None

    def validate(self) -> None:
        """Raises ValueError naming the field when the grammar cannot be built."""
        if self.kind not in KINDS:
            raise ValueError(f"{self.field}: unknown structured output kind {self.kind!r}")
        if self.kind == "choice":
            try:
                choices = json.loads(self.value)
            except json.JSONDecodeError:
                choices = None
            if (
                not isinstance(choices, list)
                or not choices
                or not all(isinstance(c, str) and c for c in choices)
            ):
                raise ValueError(f"{self.field}: give a non-empty list of non-empty strings")
        ok, errors = _validate(self.to_grammar())
        if not ok:
            raise ValueError(f"{self.field}: {errors}")


def _validate(grammar: str) -> tuple[bool, str]:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return not is_error, "; ".join(messages)
