"""The engine's one public description of itself: a frozen snapshot of its pool, queues and
counters. Everything outside ``engine/`` (services, metrics, the router's load) reads this,
never the scheduler or the block manager."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    block_size: int
    num_blocks: int
    num_free_blocks: int  # cached-but-unused blocks count as free
    num_host_blocks: int
    num_free_host_blocks: int
    num_running: int
    num_waiting: int  # in the waiting queue (new and recompute-preempted)
    num_waiting_for_remote_kv: int
    num_swapped: int
    num_delayed_free: int  # finished; blocks still used by the KV connector
    num_steps: int
    # Monotonic counters.
    num_preemptions_swap: int = 0
    num_preemptions_recompute: int = 0
    num_blocks_swapped_out: int = 0
    num_blocks_swapped_in: int = 0
    num_prefix_query_blocks: int = 0
    num_prefix_hit_blocks: int = 0
    num_invariant_checks: int = 0
    num_invariant_failures: int = 0

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def num_unfinished(self) -> int:
        return (
            self.num_running
            + self.num_waiting
            + self.num_waiting_for_remote_kv
            + (self.num_swapped)
        )
