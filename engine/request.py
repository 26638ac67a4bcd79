"""The one request state the scheduler tracks: no prefill/decode phases, just token counts.

    token_ids:  | prompt ........................ | output ........ |
                0                          num_prompt_tokens   num_tokens
    computed:   |<-------- num_computed_tokens -------->|
                                                        ^ next token to run through the model

A request "far behind" (many uncomputed tokens) is a prefill; one token behind is a decode.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.block_hash import ROOT_BLOCK_HASH, BlockHash, hash_block
from engine.kv_connector.params import KVTransferParams
from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is; exactly one place (queue) per status.

        WAITING ──admit──────────────────────────▶ RUNNING ──stop / length──▶ FINISHED_*
           │ admit (import: KV comes from elsewhere)   ▲  │  ▲
           ▼                                           │  │  └─swap in── SWAPPED ◀─ preempt
        WAITING_FOR_REMOTE_KV ──KV loaded──────────────┘  │                         (swap)
        PREEMPTED ◀── preempt (recompute): back in the ───┘
        waiting queue, blocks dropped; admitted again like WAITING

    Any status can end in FINISHED_ABORTED (abort) or FINISHED_ERROR (a failed import). A
    finished request's blocks are freed at once, or kept while the KV connector still uses them
    (an export being read, an import being written): ``Scheduler.delayed_free``.
    """

    WAITING = "waiting"  # in the waiting queue, never admitted
    PREEMPTED = "preempted"  # in the waiting queue again, blocks dropped (recompute)
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"  # blocks held, KV arriving from elsewhere
    RUNNING = "running"
    SWAPPED = "swapped"  # blocks on the host tier
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self.value in ("stop", "length", "abort", "error")

    @property
    def is_queued(self) -> bool:
        """In the waiting queue (new or recompute-preempted)."""
        return self in (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0  # lower value = served first (as in vLLM)
    extra_keys: tuple[str, ...] = ()  # mixed into block hashes (e.g. an adapter id)
    max_total_tokens: int = 0  # prompt + output cap from max_model_len, set by the engine
    kv_transfer: KVTransferParams | None = None  # KV enters or leaves through the connector

    token_ids: list[int] = field(init=False)
    num_prompt_tokens: int = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    error: str | None = None  # why a FINISHED_ERROR request failed
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_exported_blocks: int = 0  # export: leading prompt blocks already handed to save_kv

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def is_export(self) -> bool:
        return self.kv_transfer is not None and self.kv_transfer.role == "export"

    @property
    def is_import(self) -> bool:
        return self.kv_transfer is not None and self.kv_transfer.role == "import"

    def append_output_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def update_block_hashes(self, block_size: int) -> list[BlockHash]:
        """Extend ``block_hashes`` to cover every full block of ``token_ids``; return them."""
        num_full = len(self.token_ids) // block_size
        while len(self.block_hashes) < num_full:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else ROOT_BLOCK_HASH
            chunk = self.token_ids[i * block_size : (i + 1) * block_size]
            self.block_hashes.append(hash_block(parent, chunk, self.extra_keys))
        return self.block_hashes
