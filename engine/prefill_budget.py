"""The prefill tokens a step may take: all of the step's budget, or, in a step that also
decodes, ``SchedulerConfig.max_prefill_tokens_with_decodes``.

A decoding request's next token waits for the whole step, so a step that prefills a long chunk
is a stall in every stream it carries (Sarathi-Serve's "stall-free batching" bounds the chunk for
the same reason). A step with nothing to decode still takes the whole budget, so a burst of new
prompts prefills at full size. Plain integers: the planner's simulated scheduler
(``pdserve/plan/step_plan.py``) runs the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.request import Request


def to_compute(request: Request) -> int:
    """Tokens ``request`` has left to compute: more than one while a prompt (or a recomputed
    context) is prefilled; a decoding request is one token behind."""
    return request.num_tokens - request.num_computed_tokens


def any_decoding(running: Iterable[Request]) -> bool:
    """Whether some running request decodes (a prompt's last token counts so too)."""
    return any(to_compute(r) <= 1 for r in running)


class PrefillBudget:
    """``budget``: the step's token budget; ``cap``: prefill tokens in a step that decodes (0:
    none beyond the budget; the caller passes 0 where a prompt must go whole)."""

    def __init__(self, budget: int, cap: int) -> None:
        self.budget = budget
        self.cap = cap
        self.left = budget

    def start_step(self, decodes: bool) -> None:
        """Reset for a new step; ``decodes``: some request in it decodes."""
        self.left = min(self.cap, self.budget) if decodes and self.cap > 0 else self.budget

    def limit(self, remaining: int, num_new: int) -> int:
        """``num_new`` tokens for a request with ``remaining`` to compute, cut to what prefill
        has left if it prefills."""
        return min(num_new, self.left) if remaining > 1 else num_new

    def charge(self, remaining: int, num_new: int) -> None:
        """Tokens just scheduled for a request with ``remaining`` to compute."""
        if remaining > 1:
            self.left -= num_new

    def refund(self, remaining: int, num_new: int) -> None:
        """Tokens taken back from a request preempted in the same step."""
        self.charge(remaining, -num_new)
