"""What the engine hands back per request per step: plain data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float | None = None  # log-probability of token_id under the model (raw logits)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the n most likely (token id, logprob)


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
    error: str | None = None  # finish_reason "error": what went wrong

    @property
    def cumulative_logprob(self) -> float | None:
        if not self.logprobs:
            return None
        return sum(t.logprob or 0.0 for t in self.logprobs)
