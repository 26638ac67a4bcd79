"""OpenAI-compatible HTTP client: ``/v1/completions`` or ``/v1/chat/completions`` streamed
over SSE with ``stream_options.include_usage``, so output tokens come from the server's count."""

from __future__ import annotations

import json
from typing import Any

import httpx

from pdserve.bench.client import StreamTimer
from pdserve.bench.records import CANCELLED, FAILED, OK, RequestRecord
from pdserve.bench.workload import BenchRequest, PromptRenderer


class OpenAIClient:
    """``base_url`` ends in ``/v1``. ``prompt_format`` "auto" sends token ids to completions
    (exact prompt lengths; pdserve and vLLM accept them) and text to chat; "text" always text."""

    def __init__(
        self,
        base_url: str,
        *,
        api: str = "completions",
        model: str | None = None,
        api_key: str | None = None,
        prompt_format: str = "auto",
        renderer: PromptRenderer | None = None,
        ignore_eos: bool = True,
        temperature: float = 0.0,
        extra_body: dict[str, Any] | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,  # tests script the server with it
    ) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be completions or chat, got {api!r}")
        if prompt_format not in ("auto", "text"):
            raise ValueError(f"prompt_format must be auto or text, got {prompt_format!r}")
        self.base_url = base_url.rstrip("/")
        self.api = api
        self._model = model
        self.prompt_format = prompt_format
        self.renderer = renderer or PromptRenderer()
        self.ignore_eos = ignore_eos
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # trust_env=False: a proxy from the environment must not sit between us and the server.
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            trust_env=False,
            transport=transport,
        )

    async def model_name(self) -> str:
        if self._model is None:
            r = await self._http.get(f"{self.base_url}/models")
            r.raise_for_status()
            self._model = str(r.json()["data"][0]["id"])
        return self._model

    def body(self, request: BenchRequest, model: str) -> dict[str, Any]:
        """The JSON body for ``request`` (public so the docs and tests can show it)."""
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": request.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": self.renderer.text(request)}]
        elif self.prompt_format == "auto" and request.prompt_token_ids is not None:
            body["prompt"] = list(request.prompt_token_ids)
        else:
            body["prompt"] = self.renderer.text(request)
        body.update(self.extra_body)
        return body

    async def send(self, request: BenchRequest, t0: float) -> RequestRecord:
        record = RequestRecord(
            index=request.index,
            start_s=0.0,
            num_prompt_tokens=request.num_prompt_tokens,
            has_shared_prefix=request.has_shared_prefix,
        )
        try:
            model = await self.model_name()
            body = self.body(request, model)
            url = f"{self.base_url}/{'chat/completions' if self.api == 'chat' else 'completions'}"
            timer = StreamTimer(record, t0)
            async with self._http.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    record.error = f"HTTP {resp.status_code}: {text[:500]}"
                    return record
                if await self._read_stream(resp, request, record, timer):
                    record.status = CANCELLED  # leaving the block closes the connection
                    timer.finish()
                    return record
            timer.finish()
            if record.error is None:
                record.status = OK
        except Exception as e:  # any failure is data, not a crash of the benchmark
            record.status, record.error = FAILED, f"{type(e).__name__}: {e}"
        return record

    async def _read_stream(
        self, resp: httpx.Response, request: BenchRequest, record: RequestRecord, timer: StreamTimer
    ) -> bool:
        """Read SSE events to ``[DONE]``; True when the request was cancelled on purpose. A stream
        that ends without ``[DONE]`` counts as complete only when a choice carried its
        ``finish_reason`` (some servers, e.g. transformers serve, omit the terminator, and the
        openai client accepts that); otherwise the server dropped it: ``record.error``."""
        is_done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                is_done = True
                break
            event = json.loads(data)
            if "error" in event:
                record.error = f"stream error: {json.dumps(event['error'])[:500]}"
                return False
            for choice in event.get("choices") or ():
                piece = choice.get("text") if self.api == "completions" else None
                if self.api == "chat":
                    piece = (choice.get("delta") or {}).get("content")
                if piece:
                    timer.chunk()
                if choice.get("finish_reason"):
                    record.finish_reason = str(choice["finish_reason"])
            if usage := event.get("usage"):
                record.usage_reported = True
                record.num_prompt_tokens = int(usage.get("prompt_tokens") or 0)
                record.num_output_tokens = int(usage.get("completion_tokens") or 0)
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    record.num_cached_tokens = int(details["cached_tokens"])
            cancel_at = request.cancel_after_tokens
            if cancel_at is not None and record.num_chunks >= cancel_at:
                record.num_output_tokens = record.num_chunks
                return True
        if not is_done and record.finish_reason is None:
            record.error = "the stream ended without a finish_reason or [DONE]"
        if not record.usage_reported:
            record.num_output_tokens = record.num_chunks  # server sent no usage: chunks
        return False

    async def aclose(self) -> None:
        await self._http.aclose()
