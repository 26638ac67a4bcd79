"""Everything needed to build an engine, in one place, each field with its help text.

This dataclass is the one source of the engine's options: ``pdserve.options`` derives the
command-line flags (name, type, choices, help) from its fields and turns a config back into
argv for a worker process or a Helm chart, so no flag list is ever written twice. A field's
``metadata`` may give ``help``, ``choices`` and ``flag`` (an explicit flag, e.g. the
``--no-...`` form of a boolean that defaults to True).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, get_args

from engine.scheduler_config import BatchingName, PreemptionModeName, QueuePolicyName

T = TypeVar("T")


def opt(default: T, help: str, **extra: object) -> T:
    """A dataclass field with its command-line help (and ``choices`` / ``flag``)."""
    return field(default=default, metadata={"help": help, **extra})  # type: ignore[no-any-return]


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = opt(None, "Hugging Face model folder (default: the built-in demo model)")
    dtype: str = opt(
        "auto", "weights and KV dtype", choices=("auto", "float32", "bfloat16", "float16")
    )
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    attention_backend: str | None = opt(
        None,
        "attention kernels (default: by device)",
        choices=("torch", "cpu", "triton"),
    )
    block_size: int = opt(16, "tokens per KV block")
    num_kv_blocks: int | None = opt(None, "device KV blocks (default: from --kv-cache-memory-gb)")
    kv_cache_memory_gb: float = opt(1.0, "device memory for the KV cache, GiB")
    num_host_blocks: int | None = opt(None, "host (swap) KV blocks (default: from --swap-space-gb)")
    swap_space_gb: float = opt(0.5, "host memory for swapped-out KV blocks, GiB")
    kv_cache_prefault: bool = opt(
        True,
        "write the whole KV pool at start on the CPU: its memory is committed then, and no step "
        "pays a page's first touch",
        flag="--no-kv-cache-prefault",
    )
    enable_prefix_caching: bool = opt(
        True, "reuse the KV blocks of shared prompt prefixes", flag="--no-prefix-caching"
    )
    max_num_seqs: int = opt(128, "most requests in the running batch")
    max_num_batched_tokens: int = opt(
        2048, "per-step token budget (decode tokens plus prefill chunks)"
    )
    max_model_len: int | None = opt(None, "longest prompt + output (default: the model's)")
    enable_chunked_prefill: bool = opt(
        True, "split long prompts across steps", flag="--no-chunked-prefill"
    )
    long_prefill_token_threshold: int = opt(
        0, "cap on one request's prefill chunk per step (0: the budget alone)"
    )
    max_prefill_tokens_with_decodes: int | None = opt(
        None,
        "in a step that also decodes, at most this many prompt tokens, so a long prompt stalls "
        "the streams less (default: 512 on the CPU, the budget alone on a GPU; 0: the budget "
        "alone)",
    )
    scheduling_policy: QueuePolicyName = opt(
        "fcfs", "waiting-queue order", choices=get_args(QueuePolicyName)
    )
    preemption_mode: PreemptionModeName = opt(
        "auto",
        "when blocks run out: swap to host memory, recompute, or auto (swap long contexts)",
        choices=get_args(PreemptionModeName),
    )
    swap_threshold_tokens: int = opt(256, "auto preemption swaps contexts of this many tokens")
    batching: BatchingName = opt(
        "continuous",
        "static: a new batch only after the last one drained (a benchmark baseline)",
        choices=get_args(BatchingName),
    )
    skip_tokenizer_init: bool = opt(False, "load no tokenizer (token-id prompts only)")
    seed: int = opt(0, "random seed of the engine (unseeded sampling)")
    num_threads: int | None = opt(None, "CPU: torch intra-op threads (default: torch's)")
    check_invariants: bool = opt(
        False, "check the KV pool's invariants after every step (always when idle)"
    )
