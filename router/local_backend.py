"""The colocated backend: one ``AsyncEngine`` in the router's own process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from engine.async_engine import AsyncEngine, EngineShutdownError
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from router.backend import GenerateRequest, Load, ModelInfo, served_names
from router.errors import ErrorKind, RequestError
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions, TokenizerOps


class LocalEngineBackend:
    """Implements ``router.backend.Backend`` with an engine thread in this process.

    The engine's tokenizer belongs to the engine thread; the router gets its own copy,
    used on the event loop for chat templates, Tokenize and logprob token strings.
    """

    def __init__(
        self,
        config: EngineConfig,
        served_model_name: str | Sequence[str] | None = None,
        chat_template: str | None = None,
    ) -> None:

        engine = LLMEngine(config)
        mc = engine.model_config
        self._engine = AsyncEngine(engine)
        self._text = TokenizerOps(mc.path, chat_template)
        names = served_names(served_model_name, mc.path)
        self._info = ModelInfo(
            model=names[0],
            architecture=mc.architecture,
            dtype=mc.dtype_str,
            max_model_len=engine.max_model_len,
            vocab_size=mc.vocab_size,
            block_size=engine.block_manager.block_size,
            eos_token_ids=tuple(mc.eos_token_ids),
            served_names=names,
            model_path=config.model or mc.path,
        )

    @property
    def async_engine(self) -> AsyncEngine:
        """The engine thread's handle (metrics read its snapshots)."""
        return self._engine

    async def start(self) -> None:
        return None  # the engine thread started in __init__

    def model_info(self) -> ModelInfo:
        return self._info

    def load(self) -> Load:
        s = self._engine.stats
        return Load(
            num_blocks=s.num_blocks,
            num_free_blocks=s.num_free_blocks,
            num_running_requests=s.num_running + s.num_swapped,
            num_waiting_requests=s.num_waiting,
        )

    def is_healthy(self) -> bool:
        return self._engine.is_running

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        stream = self._engine.generate(
            request.request_id,
            prompt=request.prompt,
            sampling_params=request.sampling_params,
            prompt_token_ids=request.prompt_token_ids,
            priority=request.priority,
        )
        try:
            async with contextlib.aclosing(stream):  # closing this generator aborts the request
                async for out in stream:
                    yield out
        except EngineShutdownError as e:
            raise RequestError(ErrorKind.UNAVAILABLE, f"the server is shutting down: {e}") from None

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._text.tokenize(text, add_special_tokens)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return self._text.token_strings(token_ids)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        return self._text.render_chat(messages, tools, options)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._text.detokenize(token_ids)

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.shutdown)
