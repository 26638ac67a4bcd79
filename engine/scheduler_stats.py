"""The scheduler's counters: preemptions, swaps and prefix-cache lookups. No torch here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    num_preemptions_swap: int = 0
    num_preemptions_recompute: int = 0
    num_blocks_swapped_out: int = 0
    num_blocks_swapped_in: int = 0
    num_prefix_query_blocks: int = 0
    num_prefix_hit_blocks: int = 0

    @property
    def num_preemptions(self) -> int:
        return self.num_preemptions_swap + self.num_preemptions_recompute
