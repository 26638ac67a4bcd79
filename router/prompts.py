"""A request's prompt as token ids the model can take: a text prompt (length-checked, then
tokenized), token ids (checked against the vocabulary) or a chat (rendered by the chat
template). Tokenizer work runs on one thread of its own, never on the event loop.

Every refusal is a ``RequestError(INVALID)`` naming the field, for gRPC and HTTP alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from router.backend import Backend
from router.errors import ErrorKind, RequestError, invalid_argument
from router.request_limits import RequestLimits
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions

T = TypeVar("T")


class Prompts:
    def __init__(self, backend: Backend, limits: RequestLimits | None = None) -> None:
        """``limits``: by default derived from the model (RequestLimits.for_model)."""
        self.backend = backend
        info = backend.model_info()
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        self.limits = limits or RequestLimits.for_model(
            info.max_model_len, _longest_token_chars(backend, info.vocab_size)
        )
        # One thread: a tokenizer object is not made for concurrent calls. Off the event loop,
        # a long prompt or chat template never stalls other requests' streams (the tokenizer
        # releases the GIL while it encodes).
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="pdserve-tokenize")

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (tokenizer work) on the tokenizer thread and return its result."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    def check_text_length(self, text_chars: int, field: str) -> None:
        """Refuse, before tokenizing it, a text too long to fit the model in any tokenization."""
        if text_chars > self.limits.max_prompt_chars:
            raise RequestError(
                ErrorKind.INVALID,
                f"{field} is {text_chars} characters; no text longer than "
                f"{self.limits.max_prompt_chars} characters fits in max_model_len "
                f"({self.max_model_len}) tokens",
                field,
            )

    async def tokenize(self, text: str, field: str, add_special_tokens: bool = True) -> list[int]:
        """A text's ids, on the tokenizer thread, once its length could fit (naming ``field``)."""
        self.check_text_length(len(text), field)
        return await self.run(lambda: self.backend.tokenize(text, add_special_tokens))

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        """A chat's ids as the template renders it. Refuses a chat too long to fit, options
        the messages cannot take (naming the option) and a template that fails on them
        (naming ``messages``)."""
        self.check_text_length(_chat_chars(messages), "messages")
        try:
            return await self.run(lambda: self.backend.render_chat(messages, tools, options))
        except ValueError as e:
            raise invalid_argument(e, "messages") from None

    async def ids(
        self,
        prompt: str | Sequence[int] | None = None,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        """The prompt's ids (from ``messages`` when given, else ``prompt``), refused when
        empty or too long to leave room for output."""
        if messages is not None:
            field, ids = "messages", await self.chat(messages, tools, options)
        else:
            field, ids = "prompt", await self._prompt(prompt)
        if not ids:
            raise invalid_argument(ValueError(f"{field} must not be empty"), field)
        if len(ids) >= self.max_model_len:
            raise invalid_argument(_too_long(field, len(ids), self.max_model_len), field)
        return ids

    async def _prompt(self, prompt: str | Sequence[int] | None) -> list[int]:
        try:
            if isinstance(prompt, str):
                return await self.tokenize(prompt, "prompt")
            if prompt is None:
                raise ValueError("prompt: give a text prompt, token ids or a chat")
            ids = list(prompt)
            if len(ids) >= self.max_model_len:  # before a long list is walked
                raise _too_long("prompt", len(ids), self.max_model_len)
            vocab = self.vocab_size
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                    raise ValueError(
                        f"prompt: token ids must be integers in [0, {vocab}), got {t!r}"
                    )
            return ids
        except ValueError as e:
            raise invalid_argument(e, "prompt") from None


def _too_long(field: str, num_tokens: int, max_model_len: int) -> ValueError:
    return ValueError(
        f"{field} is {num_tokens} tokens; it must be shorter than the model's "
        f"max_model_len ({max_model_len}) to leave room for output"
    )


def _chat_chars(messages: list[dict[str, Any]]) -> int:
    """Characters of every message's text: the rendered prompt holds at least these."""
    total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
    return total


def _longest_token_chars(backend: Backend, vocab_size: int) -> int:
    """Characters of the longest token's text, plus one: a token may stand for a space its
    text alone leaves out (sentencepiece's leading "▁")."""
    strings = backend.token_strings(range(vocab_size))
    return max((len(s) for s in strings), default=1) + 1
