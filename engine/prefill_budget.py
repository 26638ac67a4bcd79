"""The prefill tokens a step may take: all of the step's budget, or, in a step that also
decodes, ``SchedulerConfig.max_prefill_tokens_with_decodes``.

A decoding request's next token waits for the whole step, so a step that prefills a long chunk
is a stall in every stream it carries (Sarathi-Serve's "stall-free batching" bounds the chunk for
the same reason). A step with nothing to decode still takes the whole budget, so a burst of new
prompts prefills at full size.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.request import Request
from engine.scheduler_config import SchedulerConfig


def to_compute(request: Request) -> int:
    """Tokens ``request`` has left to compute: more than one while a prompt (or a recomputed
    context) is prefilled; a decoding request is one token behind."""
    return request.num_tokens - request.num_computed_tokens


class PrefillBudget:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.left = config.max_num_batched_tokens

    def start_step(self, running: Iterable[Request]) -> None:
        """Reset for a new step over the running batch as it stands."""
        c = self.config
        cap = c.max_prefill_tokens_with_decodes
        capped = cap > 0 and c.enable_chunked_prefill and c.batching == "continuous"
        if capped and any(to_compute(r) <= 1 for r in running):
            self.left = min(cap, c.max_num_batched_tokens)
        else:
            self.left = c.max_num_batched_tokens

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
