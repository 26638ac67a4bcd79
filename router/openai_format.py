"""OpenAI response bodies built from engine outputs: whole responses and stream chunks, for
one or many choices (``index``), with echo, logprobs and tool calls."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.outputs import RequestOutput, SampledToken
from router.openai_tools import ParsedCall, ToolCallStream, parse_tool_calls

TokenStrings = Callable[[Sequence[int]], list[str]]

_FINISH = {"stop": "stop", "length": "length"}


def finish_reason(out: RequestOutput, called_tools: bool = False) -> str | None:
    if not out.finished:
        return None
    if called_tools and out.finish_reason == "stop":
        return "tool_calls"
    return _FINISH.get(out.finish_reason or "", out.finish_reason)


def usage(finals: Mapping[int, RequestOutput], n: int = 1) -> dict[str, Any]:
    """Prompt tokens once per prompt (choices ``p * n .. p * n + n - 1`` share one),
    completion tokens over every choice."""
    prompts = {i // n: out for i, out in sorted(finals.items(), reverse=True)}
    prompt = sum(len(o.prompt_token_ids) for o in prompts.values())
    completion = sum(len(o.token_ids) for o in finals.values())
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": sum(o.num_cached_tokens for o in prompts.values())
        },
    }


class _Formatter:
    object_name = ""
    chunk_object_name = ""

    def __init__(self, request_id: str, model: str, token_strings: TokenStrings, n: int) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.token_strings = token_strings
        self.n = n

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def usage_chunk(self, finals: Mapping[int, RequestOutput]) -> dict[str, Any]:
        body = self._envelope(self.chunk_object_name, [])
        body["usage"] = usage(finals, self.n)
        return body


class CompletionFormatter(_Formatter):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(
        self,
        request_id: str,
        model: str,
        token_strings: TokenStrings,
        n: int = 1,
        echo: Sequence[str] | None = None,
    ) -> None:
        """``echo[p]``: prompt p's text, prepended to its choices (``echo: true``)."""
        super().__init__(request_id, model, token_strings, n)
        self._echo = echo
        self._text_offset: dict[int, int] = {}
        self._echoed: set[int] = set()

    def _logprobs(self, index: int, tokens: Sequence[SampledToken] | None) -> dict[str, Any] | None:
        if tokens is None:
            return None
        strs = self.token_strings([t.token_id for t in tokens])
        offsets = []
        for s in strs:
            offsets.append(self._text_offset.get(index, 0))
            self._text_offset[index] = offsets[-1] + len(s)
        return {
            "tokens": strs,
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [
                dict(
                    zip(
                        self.token_strings([i for i, _ in t.top_logprobs]),
                        [lp for _, lp in t.top_logprobs],
                        strict=True,
                    )
                )
                for t in tokens
            ],
            "text_offset": offsets,
        }

    def _prefix(self, index: int) -> str:
        if self._echo is None or index in self._echoed:
            return ""
        self._echoed.add(index)
        return self._echo[index // self.n]

    def chunk(self, index: int, out: RequestOutput) -> dict[str, Any] | None:
        prefix = self._prefix(index)
        if not prefix and not out.new_text and not out.finished and out.new_logprobs is None:
            return None
        choice = {
            "index": index,
            "text": prefix + out.new_text,
            "logprobs": self._logprobs(index, out.new_logprobs),
            "finish_reason": finish_reason(out),
            "stop_reason": out.stop_reason,
        }
        return self._envelope(self.chunk_object_name, [choice])

    def response(self, finals: Mapping[int, RequestOutput]) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "text": self._prefix(i) + out.text,
                "logprobs": self._logprobs(i, out.logprobs),
                "finish_reason": finish_reason(out),
                "stop_reason": out.stop_reason,
            }
            for i, out in sorted(finals.items())
        ]
        body = self._envelope(self.object_name, choices)
        body["usage"] = usage(finals, self.n)
        return body


class ChatFormatter(_Formatter):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(
        self,
        request_id: str,
        model: str,
        token_strings: TokenStrings,
        n: int = 1,
        parse_tools: bool = False,
        forced: Sequence[str] = (),
    ) -> None:
        """``forced``: the tool names a grammar forces (``forced_names``), so a call cut
        short still comes back as a call."""
        super().__init__(request_id, model, token_strings, n)
        self._parse_tools = parse_tools
        self._forced = tuple(forced)
        self._sent_role: set[int] = set()
        self._tools: dict[int, ToolCallStream] = {}
        self._num_calls: dict[int, int] = {}

    def _entry(self, token_id: int, logprob: float | None) -> dict[str, Any]:
        s = self.token_strings([token_id])[0]
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

    def _logprobs(self, tokens: Sequence[SampledToken] | None) -> dict[str, Any] | None:
        if tokens is None:
            return None
        return {
            "content": [
                {
                    **self._entry(t.token_id, t.logprob),
                    "top_logprobs": [self._entry(i, lp) for i, lp in t.top_logprobs],
                }
                for t in tokens
            ]
        }

    def chunk(self, index: int, out: RequestOutput) -> dict[str, Any] | None:
        delta: dict[str, Any] = {}
        if index not in self._sent_role:
            delta["role"] = "assistant"
            self._sent_role.add(index)
        text, calls = out.new_text, list[ParsedCall]()
        if self._parse_tools:
            stream = self._tools.setdefault(index, ToolCallStream(self._forced))
            text, calls = stream.feed(out.new_text, out.finished)
        if text:
            delta["content"] = text
        if calls:
            first = self._num_calls.get(index, 0)
            self._num_calls[index] = first + len(calls)
            delta["tool_calls"] = [
                {"index": first + k, **c.as_message()} for k, c in enumerate(calls)
            ]
        if not delta and not out.finished and out.new_logprobs is None:
            return None
        if "role" in delta and "tool_calls" not in delta:
            delta.setdefault("content", "")
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": self._logprobs(out.new_logprobs),
            "finish_reason": finish_reason(out, self._num_calls.get(index, 0) > 0),
        }
        return self._envelope(self.chunk_object_name, [choice])

    def response(self, finals: Mapping[int, RequestOutput]) -> dict[str, Any]:
        choices = []
        for i, out in sorted(finals.items()):
            content: str | None = out.text
            calls: list[ParsedCall] = []
            if self._parse_tools:
                content, calls = parse_tool_calls(out.text, self._forced)
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if calls:
                message["tool_calls"] = [c.as_message() for c in calls]
            else:
                message["content"] = content or ""
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": self._logprobs(out.logprobs),
                    "finish_reason": finish_reason(out, bool(calls)),
                    "stop_reason": out.stop_reason,
                }
            )
        body = self._envelope(self.object_name, choices)
        body["usage"] = usage(finals, self.n)
        return body


Formatter = CompletionFormatter | ChatFormatter
