"""OpenAI-compatible request bodies (pydantic), plus vLLM's extras, and their mapping to
``SamplingParams``. Types are strict: ``"16"`` is not a number and ``1.0`` is not an integer.
Unknown fields are ignored, as OpenAI clients send fields this server does not use."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.sampling_params import SamplingParams


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    """Fields both endpoints share: OpenAI's, then vLLM's extras, then pdserve's."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # vLLM extras
    top_k: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = 0  # lower is served first
    # pdserve: seconds the whole request may take (HTTP has no deadline header of its own)
    timeout: float | None = Field(default=None, gt=0)

    def _check_unsupported(self) -> None:
        if self.n != 1:
            raise ValueError(f"n: only n=1 is supported, got {self.n}")
        if self.presence_penalty != 0.0:
            raise ValueError("presence_penalty: penalties are not supported")
        if self.frequency_penalty != 0.0:
            raise ValueError("frequency_penalty: penalties are not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        self._check_unsupported()
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
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False

    def single_prompt(self) -> str | list[int]:
        """The one prompt (text or token ids); a batch of prompts is refused."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            if len(p) != 1:
                raise ValueError("prompt: batches are not supported; send one prompt per request")
            return p[0]  # type: ignore[return-value]
        if self.echo:
            raise ValueError("echo: not supported")
        return p  # type: ignore[return-value]

    def sampling_params(self) -> SamplingParams:
        return self._sampling_params(self.max_tokens, self.logprobs)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None:
            raise ValueError(
                f"content: a {self.role} message needs content (a string or text parts)"
            )
        return self

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": self.role, "content": content or ""}


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def sampling_params(self) -> SamplingParams:
        max_tokens = self.max_completion_tokens
        if max_tokens is None:
            max_tokens = self.max_tokens
        elif self.max_tokens is not None:
            raise ValueError("max_tokens: give max_tokens or max_completion_tokens, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: requires logprobs to be true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(max_tokens, logprobs)
