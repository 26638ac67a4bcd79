"""Scheduler knobs (see the seeds: token budget, prefill budget, concurrency, length limits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

CPU_PREFILL_TOKENS_WITH_DECODES = 512
"""The engine's ``max_prefill_tokens_with_decodes`` on the CPU (docs/benchmarks.md: with
vLLM's client at concurrency 32, ITL p99 0.5 s against 1.8 s at the budget alone, and no
throughput lost)."""


def prefill_tokens_with_decodes(flag: int | None, device_type: str) -> int:
    """``max_prefill_tokens_with_decodes`` from its flag, or by device when unset: a GPU's step
    over the whole budget takes milliseconds, a CPU's seconds."""
    if flag is not None:
        return flag
    return CPU_PREFILL_TOKENS_WITH_DECODES if device_type == "cpu" else 0


QueuePolicyName = Literal["fcfs", "priority"]
PreemptionModeName = Literal["swap", "recompute", "auto"]
BatchingName = Literal["continuous", "static"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    """Most requests in the running batch at once."""
    max_num_batched_tokens: int = 2048
    """Per-step token budget: decode tokens plus prefill chunk tokens."""
    max_model_len: int = 2048
    """Longest prompt + output a request may reach."""
    enable_chunked_prefill: bool = True
    """Split long prompts across steps; off = a prompt is admitted only if it fits the budget."""
    long_prefill_token_threshold: int = 0
    """Cap on one request's prefill chunk per step (0 = only the budget caps it)."""
    max_prefill_tokens_with_decodes: int = 0
    """In a step that also decodes (some running request is one token behind), at most this
    many prefill tokens, all chunks together (0 = only the budget caps them). The decoding
    requests' next token waits for the whole step, so a full-budget chunk is a stall in every
    stream (on a 2-core CPU, ~1.7 s for 2,048 tokens of a 135M model); a step with nothing to
    decode still takes the whole budget. Chunked prefill and continuous batching only."""
    policy: QueuePolicyName = "fcfs"
    preemption_mode: PreemptionModeName = "auto"
    """swap: copy blocks to host memory; recompute: drop and re-prefill; auto: swap contexts of
    at least ``swap_threshold_tokens`` tokens when host blocks are free, recompute the rest."""
    swap_threshold_tokens: int = 256
    batching: BatchingName = "continuous"
    """continuous: requests join and leave the batch at every step (iteration-level batching).
    static: a batch is formed only when the previous one has fully drained (every request in it
    finished), then runs until its longest request ends: the baseline that continuous batching
    is measured against (benchmarks/batching.md). Finished requests leave the batch at once, so
    no compute is spent on padding: a generous static baseline."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.max_prefill_tokens_with_decodes < 0 or self.long_prefill_token_threshold < 0:
            raise ValueError(
                "max_prefill_tokens_with_decodes and long_prefill_token_threshold must not be "
                "negative"
            )
        if self.policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        if self.preemption_mode not in ("swap", "recompute", "auto"):
            raise ValueError(
                "preemption_mode must be 'swap', 'recompute' or 'auto', "
                f"got {self.preemption_mode!r}"
            )
        if self.batching not in get_args(BatchingName):
            raise ValueError(
                f"batching must be one of {get_args(BatchingName)}, got {self.batching!r}"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when chunked prefill is off "
                f"({self.max_num_batched_tokens} < {self.max_model_len})"
            )
