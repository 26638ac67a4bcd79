"""Everything needed to build an engine, in one place (the CLI and services fill it in)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.scheduler_config import BatchingName, PreemptionModeName, QueuePolicyName


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # Hugging Face folder; None = the built-in demo model
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    attention_backend: str | None = None  # None = by device (cpu kernels or torch; triton)
    block_size: int = 16
    num_kv_blocks: int | None = None  # None = sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = 1.0
    num_host_blocks: int | None = None  # None = sized from swap_space_gb
    swap_space_gb: float = 0.5
    enable_prefix_caching: bool = True
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: QueuePolicyName = "fcfs"
    preemption_mode: PreemptionModeName = "auto"
    swap_threshold_tokens: int = 256
    batching: BatchingName = "continuous"  # static: the baseline for benchmarks only
    skip_tokenizer_init: bool = False
    seed: int = 0
    num_threads: int | None = None  # CPU: torch intra-op threads (None = torch's default)
