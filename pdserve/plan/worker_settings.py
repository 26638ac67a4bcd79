"""One pool's engine settings: the scheduler knobs of ``engine.scheduler_config`` that decide
the simulated steps, with the same names and defaults as the engine's flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.scheduler_config import CPU_PREFILL_TOKENS_WITH_DECODES

PreemptionMode = Literal["auto", "swap", "recompute"]


@dataclass(frozen=True)
class WorkerSettings:
    max_num_seqs: int = 128  # --max-num-seqs
    max_num_batched_tokens: int = 2048  # --max-num-batched-tokens (the step's token budget)
    enable_chunked_prefill: bool = True  # --no-chunked-prefill turns it off
    long_prefill_token_threshold: int = 0  # cap on one request's chunk per step (0 = none)
    # --max-prefill-tokens-with-decodes: prefill tokens in a step that also decodes (0 = the
    # budget alone); the engine's default on the CPU, where the profiles are measured
    max_prefill_tokens_with_decodes: int = CPU_PREFILL_TOKENS_WITH_DECODES
    preemption_mode: PreemptionMode = "auto"  # --preemption-mode
    swap_threshold_tokens: int = 256  # auto: swap contexts at least this long
    num_kv_blocks: int | None = None  # --num-kv-blocks (None = the profile's kv.num_blocks)
    num_host_blocks: int | None = None  # None = the profile's kv.num_host_blocks
    max_model_len: int = 8192  # prompt + output are capped here, as the engine does

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.preemption_mode not in ("auto", "swap", "recompute"):
            raise ValueError(
                f"preemption_mode must be auto, swap or recompute, got {self.preemption_mode!r}"
            )
        if min(self.long_prefill_token_threshold, self.swap_threshold_tokens,
               self.max_prefill_tokens_with_decodes) < 0:  # fmt: skip
            raise ValueError("thresholds must not be negative")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when chunked prefill is off "
                f"({self.max_num_batched_tokens} < {self.max_model_len})"
            )
