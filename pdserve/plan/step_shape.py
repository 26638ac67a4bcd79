"""What one engine step computes, in the numbers its time depends on: the cost model's input.

The same shape describes a real step (built from the scheduler's ``SchedulerOutput`` during
calibration) and a simulated one (built by the simulator's worker model), so a profile fitted
on the first predicts the second.

Per request in the step, with ``q`` new tokens over ``c`` tokens already in its KV::

    num_tokens       += q                    linear layers: one row per new token
    num_seqs         += 1                    per-request work (attention launch, metadata)
    num_sampled      += 1 if it samples      lm_head row + sampler
    context_tokens   += c + q                KV read by attention (gathered per request)
    attention_pairs  += q * (c + (q + 1)/2)  query x key pairs of a causal prefill (q > 1)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    num_tokens: int = 0
    num_seqs: int = 0
    num_sampled: int = 0
    context_tokens: int = 0
    attention_pairs: float = 0.0
    num_prefill_tokens: int = 0  # of num_tokens, those of requests with q > 1 (for reports)

    @staticmethod
    def of(chunks: list[tuple[int, int, bool]]) -> StepShape:
        """The shape of a step that computes ``(q new tokens, c cached tokens, samples)`` per
        request."""
        tokens = seqs = sampled = ctx = prefill = 0
        pairs = 0.0
        for q, c, samples in chunks:
            tokens += q
            seqs += 1
            sampled += samples
            ctx += c + q
            if q > 1:
                pairs += q * (c + (q + 1) / 2)
                prefill += q
        return StepShape(tokens, seqs, sampled, ctx, pairs, prefill)

    def __add__(self, other: StepShape) -> StepShape:
        return StepShape(
            self.num_tokens + other.num_tokens,
            self.num_seqs + other.num_seqs,
            self.num_sampled + other.num_sampled,
            self.context_tokens + other.context_tokens,
            self.attention_pairs + other.attention_pairs,
            self.num_prefill_tokens + other.num_prefill_tokens,
        )
