"""What the router needs from whatever serves the model: the ``Backend`` protocol.

One implementation today, ``LocalEngineBackend`` (an engine in the router's process, the
colocated mode); the disaggregated backend (prefill + decode workers) implements the same.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from router.tokenizer_ops import DEFAULT_CHAT_OPTIONS, ChatTemplateOptions


@dataclass(frozen=True)
class GenerateRequest:
    """One validated request as the router hands it to a backend (exactly one prompt form)."""

    request_id: str
    sampling_params: SamplingParams
    prompt: str | None = None
    prompt_token_ids: Sequence[int] | None = None
    priority: int = 0  # lower is served first
    arrival_time: float = field(default_factory=time.monotonic)  # at the router (metrics)
    id_field: str = "request_id"  # where the client gave the id (its errors name it)


@dataclass(frozen=True)
class Load:
    """What the serving side holds right now, summed over every engine behind the backend."""

    num_blocks: int
    num_free_blocks: int
    num_running_requests: int
    num_waiting_requests: int


@dataclass(frozen=True)
class ModelInfo:
    model: str  # the name clients pass as ``model`` (the first served name)
    architecture: str
    dtype: str
    max_model_len: int
    vocab_size: int
    block_size: int
    eos_token_ids: tuple[int, ...] = field(default=())
    served_names: tuple[str, ...] = ()  # every name /v1/models lists (``model`` first)
    model_path: str = ""  # also accepted as a name, as vLLM accepts its --model string


def served_names(served: str | Sequence[str] | None, model_path: str) -> tuple[str, ...]:
    """The names a model is served under: each ``--served-model-name`` (repeatable), else
    the model folder's name."""
    if isinstance(served, str):
        served = [served]
    names = tuple(dict.fromkeys(n for n in served or () if n))
    return names or (Path(model_path).name,)


class Backend(Protocol):
    """The router's only view of the serving side. Every method is called on the router's
    event loop; implementations must not block it for longer than a tokenizer call."""

    async def start(self) -> None:
        """Connect/warm up on the router's event loop before the servers accept requests."""
        ...

    def model_info(self) -> ModelInfo:
        """Static facts about the served model."""
        ...

    def load(self) -> Load:
        """A current snapshot of KV blocks and request counts (cheap: no round trip)."""
        ...

    def is_healthy(self) -> bool:
        """False once the backend cannot serve (engine thread gone, workers unreachable)."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        """Stream the request's per-step outputs; the last has ``finished`` set.

        Raises ValueError, whose message starts with the offending field's name, before
        yielding anything when the request is invalid (e.g. the prompt is too long), and
        ``router.errors.RequestError`` for its own failures (e.g. UNAVAILABLE while shutting
        down). Closing or cancelling the generator early aborts the request and frees its
        blocks.
        """
        ...

    def abort(self, request_id: str) -> None:
        """Abort a request wherever it is. Idempotent; unknown ids are ignored."""
        ...

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` exactly as a text prompt would be tokenized."""
        ...

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        """The text of each token on its own (for logprobs and Tokenize)."""
        ...

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions = DEFAULT_CHAT_OPTIONS,
    ) -> list[int]:
        """Prompt token ids for a chat (and its tools, when the template renders them), from
        the tokenizer's chat template, as ``options`` say (by default with the assistant's
        generation prompt appended). Raises ValueError naming the field."""
        ...

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` together (special tokens included)."""
        ...

    async def close(self) -> None:
        """Abort everything and release the backend's resources. Idempotent."""
        ...
