"""OpenAI response bodies built from engine outputs: whole responses and stream chunks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.outputs import RequestOutput, SampledToken

TokenStrings = Callable[[Sequence[int]], list[str]]

_FINISH = {"stop": "stop", "length": "length"}


def finish_reason(out: RequestOutput) -> str | None:
    if not out.finished:
        return None
    return _FINISH.get(out.finish_reason or "", out.finish_reason)


def usage(out: RequestOutput) -> dict[str, Any]:
    prompt, completion = len(out.prompt_token_ids), len(out.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


class _Formatter:
    object_name = ""
    chunk_object_name = ""

    def __init__(self, request_id: str, model: str, token_strings: TokenStrings) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.token_strings = token_strings

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def usage_chunk(self, final: RequestOutput) -> dict[str, Any]:
        body = self._envelope(self.chunk_object_name, [])
        body["usage"] = usage(final)
        return body


class CompletionFormatter(_Formatter):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, request_id: str, model: str, token_strings: TokenStrings) -> None:
        super().__init__(request_id, model, token_strings)
        self._text_offset = 0

    def _logprobs(self, tokens: Sequence[SampledToken] | None) -> dict[str, Any] | None:
        if tokens is None:
            return None
        strs = self.token_strings([t.token_id for t in tokens])
        offsets = []
        for s in strs:
            offsets.append(self._text_offset)
            self._text_offset += len(s)
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

    def chunk(self, out: RequestOutput) -> dict[str, Any] | None:
        if not out.new_text and not out.finished and out.new_logprobs is None:
            return None
        choice = {
            "index": 0,
            "text": out.new_text,
            "logprobs": self._logprobs(out.new_logprobs),
            "finish_reason": finish_reason(out),
            "stop_reason": out.stop_reason,
        }
        return self._envelope(self.chunk_object_name, [choice])

    def response(self, final: RequestOutput) -> dict[str, Any]:
        choice = {
            "index": 0,
            "text": final.text,
            "logprobs": self._logprobs(final.logprobs),
            "finish_reason": finish_reason(final),
            "stop_reason": final.stop_reason,
        }
        body = self._envelope(self.object_name, [choice])
        body["usage"] = usage(final)
        return body


class ChatFormatter(_Formatter):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, request_id: str, model: str, token_strings: TokenStrings) -> None:
        super().__init__(request_id, model, token_strings)
        self._sent_role = False

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

    def chunk(self, out: RequestOutput) -> dict[str, Any] | None:
        delta: dict[str, Any] = {}
        if not self._sent_role:
            delta["role"] = "assistant"
            self._sent_role = True
        if out.new_text:
            delta["content"] = out.new_text
        if not delta and not out.finished and out.new_logprobs is None:
            return None
        if "role" in delta:
            delta.setdefault("content", "")
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": self._logprobs(out.new_logprobs),
            "finish_reason": finish_reason(out),
        }
        return self._envelope(self.chunk_object_name, [choice])

    def response(self, final: RequestOutput) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": final.text},
            "logprobs": self._logprobs(final.logprobs),
            "finish_reason": finish_reason(final),
            "stop_reason": final.stop_reason,
        }
        body = self._envelope(self.object_name, [choice])
        body["usage"] = usage(final)
        return body


Formatter = CompletionFormatter | ChatFormatter
