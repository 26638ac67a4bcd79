"""OpenAI-compatible request bodies (pydantic), plus vLLM's extras, and their mapping to
``SamplingParams``. Types are strict: ``"16"`` is not a number and ``1.0`` is not an integer.

No field is ever silently ignored: an unknown field is a 400 naming it (``extra="forbid"``),
and each OpenAI field this server does not implement is declared in ``_UNSUPPORTED`` and
refused unless it holds its neutral value (``store: false``, ``modalities: ["text"]``, ...).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredOutput
from router.openai_tools import (
    ChatTool,
    ToolCall,
    ToolChoice,
    forced_names,
    template_tools,
    tool_grammar,
    tool_mode,
)
from router.tokenizer_ops import ChatTemplateOptions


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: accepted, usage comes once at the end

    @model_validator(mode="after")
    def _no_continuous(self) -> StreamOptions:
        if self.continuous_usage_stats:
            raise ValueError("continuous_usage_stats: not supported (usage comes at the end)")
        return self


class JsonSchemaFormat(_Strict):
    name: str = "schema"
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsParams(_Strict):
    """vLLM's ``structured_outputs`` extra: exactly one of these."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


# OpenAI fields this server does not implement, with the values that mean "not used".
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "suffix": (None, ""),
    "audio": (None,),
    "function_call": (None,),
    "functions": (None,),
    "metadata": (None,),
    "modalities": (None, ["text"]),
    "moderation": (None,),
    "prediction": (None,),
    "prompt_cache_key": (None,),
    "prompt_cache_options": (None,),
    "prompt_cache_retention": (None,),
    "reasoning_effort": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "verbosity": (None,),
    "web_search_options": (None,),
}


class _Common(_Strict):
    """Fields both endpoints share: OpenAI's, then vLLM's extras, then pdserve's."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=128)
    best_of: int | None = Field(default=None, ge=1, le=128)
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a JSON key) -> bias
    user: str | None = None  # accepted; identifies the end user, never changes the output
    safety_identifier: str | None = None  # the same, by its newer name
    response_format: ResponseFormat | None = None
    # vLLM extras
    top_k: int | None = None
    min_tokens: int = 0
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0  # lower is served first
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # pdserve: seconds the whole request may take (HTTP has no deadline header of its own)
    timeout: float | None = Field(default=None, gt=0)
    # Declared so that a client sending them is told, not ignored.
    suffix: Any = None
    audio: Any = None
    function_call: Any = None
    functions: Any = None
    metadata: Any = None
    modalities: Any = None
    moderation: Any = None
    prediction: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    reasoning_effort: Any = None
    service_tier: Any = None
    store: Any = None
    verbosity: Any = None
    web_search_options: Any = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> _Common:
        for name, neutral in _UNSUPPORTED.items():
            value = getattr(self, name)
            if name in self.model_fields_set and value not in neutral:
                raise ValueError(f"{name}: not supported by this server")
        return self

    def _check(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.best_of is not None:
            if self.best_of < self.n:
                raise ValueError(f"best_of ({self.best_of}) must be at least n ({self.n})")
            if self.stream and self.best_of > self.n:
                raise ValueError("best_of: cannot be combined with stream")

    def structured(self) -> StructuredOutput | None:
        """The one structured-output constraint the request asks for, if any."""
        found: list[StructuredOutput] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(StructuredOutput("json_object", "", "response_format"))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise ValueError("response_format: json_schema needs a json_schema object")
            found.append(StructuredOutput("json", json.dumps(rf.json_schema.schema_)))
        if self.guided_json is not None:
            found.append(StructuredOutput("json", _schema_text(self.guided_json), "guided_json"))
        if self.guided_regex is not None:
            found.append(StructuredOutput("regex", self.guided_regex, "guided_regex"))
        if self.guided_choice is not None:
            found.append(
                StructuredOutput("choice", json.dumps(self.guided_choice), "guided_choice")
            )
        if self.guided_grammar is not None:
            found.append(StructuredOutput("grammar", self.guided_grammar, "guided_grammar"))
        so = self.structured_outputs
        if so is not None:
            f = "structured_outputs"
            if so.json_ is not None:
                found.append(StructuredOutput("json", _schema_text(so.json_), f))
            if so.regex is not None:
                found.append(StructuredOutput("regex", so.regex, f))
            if so.choice is not None:
                found.append(StructuredOutput("choice", json.dumps(so.choice), f))
            if so.grammar is not None:
                found.append(StructuredOutput("grammar", so.grammar, f))
            if so.json_object:
                found.append(StructuredOutput("json_object", "", f))
        if len(found) > 1:
            names = ", ".join(dict.fromkeys(s.field for s in found))
            raise ValueError(f"{found[1].field}: give one structured output, got {names}")
        return found[0] if found else None

    def _sampling_params(
        self, max_tokens: int | None, logprobs: int | None, structured: StructuredOutput | None
    ) -> SamplingParams:
        self._check()
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias: keys must be token ids, got {key!r}")
            bias[int(key)] = value
        return SamplingParams(
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=0 if self.top_k is None else self.top_k,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=() if self.stop is None else self.stop,
            stop_token_ids=self.stop_token_ids or (),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=bias,
            structured=structured,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _schema_text(schema: str | dict[str, Any]) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)


Prompt = str | list[int]


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False

    def prompts(self) -> list[Prompt]:
        """The prompts (a batch is a list of strings or of token-id lists); never empty."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            return list(p)  # type: ignore[arg-type]
        return [p]  # type: ignore[list-item]

    def sampling_params(self) -> SamplingParams:
        if self.echo and self.logprobs is not None:
            raise ValueError("echo: cannot be combined with logprobs (no prompt logprobs here)")
        return self._sampling_params(self.max_tokens, self.logprobs, self.structured())


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                f"content: a {self.role} message needs content (a string or text parts)"
            )
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only assistant messages carry tool calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("tool_call_id: a tool message must name the call it answers")
        return self

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.as_template_input() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatTemplateFields(BaseModel):
    """vLLM's chat template extras, on chat completions and /tokenize alike. ``render_chat``
    checks them against the messages (ChatTemplateOptions.check)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def template_options(self) -> ChatTemplateOptions:
        return ChatTemplateOptions(
            self.add_generation_prompt, self.continue_final_message, self.chat_template_kwargs or {}
        )


class ChatCompletionRequest(_Common, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def tool_mode(self) -> Literal["none", "auto", "forced"]:
        """How tools are used: not at all, parsed from free output, or forced by a grammar."""
        return tool_mode(self.tools, self.tool_choice)

    def forced_tools(self) -> tuple[str, ...]:
        """The tool names a forcing grammar allows (none unless calls are forced)."""
        return forced_names(self.tools, self.tool_choice)

    def sampling_params(self) -> SamplingParams:
        max_tokens = self.max_completion_tokens
        if max_tokens is None:
            max_tokens = self.max_tokens
        elif self.max_tokens is not None:
            raise ValueError("max_tokens: give max_tokens or max_completion_tokens, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        structured = self.structured()
        if self.tool_mode() == "forced":
            if structured is not None:
                raise ValueError(f"tool_choice: cannot be combined with {structured.field}")
            assert self.tools is not None and self.tool_choice is not None
            structured = tool_grammar(
                self.tools, self.tool_choice, parallel=self.parallel_tool_calls is not False
            )
        return self._sampling_params(max_tokens, logprobs, structured)

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (None when there are none)."""
        return template_tools(self.tools)
