"""Preemption policies: which running request gives up its blocks, and how (swap or recompute)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

from engine.request import Request

PreemptionMode = Literal["swap", "recompute"]


class PreemptionPolicy(Protocol):
    def choose_victim(self, running: Sequence[Request]) -> Request:
        """The running request to preempt when blocks run out."""
        ...

    def choose_mode(self, victim: Request, can_swap: bool) -> PreemptionMode:
        """How to preempt it; ``can_swap`` says whether the host tier has room."""
        ...


class _VictimByPolicy:
    def __init__(self, queue_policy: str) -> None:
        self._by_priority = queue_policy == "priority"

    def choose_victim(self, running: Sequence[Request]) -> Request:
        # Lowest priority (largest value) first, then the latest arrival.
        if self._by_priority:
            return max(running, key=lambda r: (r.priority, r.arrival_time))
        return max(running, key=lambda r: r.arrival_time)


class SwapPreemption(_VictimByPolicy):
    """Always swap when the host tier has room; recompute otherwise."""

    def choose_mode(self, victim: Request, can_swap: bool) -> PreemptionMode:
        return "swap" if can_swap else "recompute"


class RecomputePreemption(_VictimByPolicy):
    def choose_mode(self, victim: Request, can_swap: bool) -> PreemptionMode:
        return "recompute"


class AutoPreemption(_VictimByPolicy):
    """Swap long contexts (re-prefill would cost more than the copy), recompute short ones."""

    def __init__(self, queue_policy: str, swap_threshold_tokens: int) -> None:
        super().__init__(queue_policy)
        self._threshold = swap_threshold_tokens

    def choose_mode(self, victim: Request, can_swap: bool) -> PreemptionMode:
        if can_swap and victim.num_computed_tokens >= self._threshold:
            return "swap"
        return "recompute"


def make_preemption_policy(
    mode: str, queue_policy: str, swap_threshold_tokens: int
) -> PreemptionPolicy:
    if mode == "swap":
        return SwapPreemption(queue_policy)
    if mode == "recompute":
        return RecomputePreemption(queue_policy)
    if mode == "auto":
        return AutoPreemption(queue_policy, swap_threshold_tokens)
    raise ValueError(f"unknown preemption mode {mode!r}")
