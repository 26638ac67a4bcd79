"""Scheduler knobs (see the seeds: token budget, prefill budget, concurrency, length limits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

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
