"""What the engine hands back per request per step: plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.block_hash import BlockHash
from engine.sampler import SampledToken


@dataclass(frozen=True)
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(frozen=True)
class RequestOutput:
    """A request's state after a step. ``new_*`` fields hold only this step's delta."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every generated token so far
    text: str  # all generated text so far (stable, stop strings applied)
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[SampledToken] | None = None  # per generated token, when requested
    new_logprobs: list[SampledToken] | None = None
    num_cached_tokens: int = 0
    prompt: str | None = None
    metrics: RequestMetrics | None = field(default=None, compare=False)

    @property
    def cumulative_logprob(self) -> float | None:
        if not self.logprobs:
            return None
        return sum(t.logprob or 0.0 for t in self.logprobs)


@dataclass(frozen=True)
class RemotePrefillReservation:
    """Decode role: blocks reserved for a prompt that another worker prefills.

    ``block_ids[i]`` receives the KV of prompt tokens ``[i * block_size, (i + 1) * block_size)``;
    ``cached_blocks`` maps the indices this worker already holds (prefix cache) to their hashes.
    """

    request_id: str
    block_ids: tuple[int, ...]
    cached_blocks: dict[int, BlockHash]
    num_prompt_tokens: int
    prompt_token_ids: tuple[int, ...]


@dataclass(frozen=True)
class PrefillProgress:
    """Prefill role: after a step, the first ``num_computed_tokens`` tokens of the request have
    KV in ``block_ids`` (full blocks ``0 .. num_computed_tokens // block_size - 1`` are final).
    ``first_token_id`` is set on the step that finished the prompt."""

    request_id: str
    num_computed_tokens: int
    block_ids: tuple[int, ...]
    block_hashes: tuple[BlockHash, ...]
    is_prompt_done: bool
    first_token_id: int | None = None
