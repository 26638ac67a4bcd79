"""Cost models: seconds for an engine step, a KV transfer and a swap, from a profile's fitted
coefficients. Plain arithmetic (the simulator calls ``StepCost.seconds`` for every step it
plans), no numpy.

Step time, for a step of shape s (``pdserve.plan.step_shape``)::

    t(s) = base_s
         + per_token_s          x s.num_tokens
         + per_seq_s            x s.num_seqs
         + per_sampled_s        x s.num_sampled
         + per_context_token_s  x s.context_tokens
         + per_attention_pair_s x s.attention_pairs

The first term is what a step costs whatever it holds (reading the weights once: the decode
floor); the next three are the linear layers, per-request work and the lm_head/sampler; the
last two are attention (KV gathered per request, and the causal query x key work of a
prefill). A prefill step of n fresh tokens is ``base + (per_token + ...) n + pair n^2/2``; a
decode step of batch B at total context K is ``base + (per_token + per_seq + per_sampled) B
+ per_context_token K``: the two measured curves the issue names, one model for mixed steps.

``roofline_tokens`` > 0 makes the linear layers' term ``per_token_s x max(0, num_tokens -
roofline_tokens)``: on hardware whose small batches are bound by reading the weights (a GPU,
a CPU's memory bus), the first tokens ride along for free and ``base_s`` is the floor.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pdserve.plan.step_shape import StepShape

COEFFICIENTS = (
    "base_s",
    "per_token_s",
    "per_seq_s",
    "per_sampled_s",
    "per_context_token_s",
    "per_attention_pair_s",
)


@dataclass(frozen=True)
class StepCost:
    base_s: float = 0.0
    per_token_s: float = 0.0
    per_seq_s: float = 0.0
    per_sampled_s: float = 0.0
    per_context_token_s: float = 0.0
    per_attention_pair_s: float = 0.0
    roofline_tokens: int = 0
    fit: dict[str, Any] = field(default_factory=dict, compare=False)  # how it was fitted

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            if getattr(self, name) < 0:
                raise ValueError(f"step.{name} must not be negative, got {getattr(self, name)}")
        if self.roofline_tokens < 0:
            raise ValueError("step.roofline_tokens must not be negative")

    def seconds(self, s: StepShape) -> float:
        tokens = s.num_tokens - self.roofline_tokens if self.roofline_tokens else s.num_tokens
        return (
            self.base_s
            + self.per_token_s * (tokens if tokens > 0 else 0)
            + self.per_seq_s * s.num_seqs
            + self.per_sampled_s * s.num_sampled
            + self.per_context_token_s * s.context_tokens
            + self.per_attention_pair_s * s.attention_pairs
        )

    def decode_seconds(self, batch: int, context_tokens: int) -> float:
        """A pure decode step: ``batch`` requests, one token each, ``context_tokens`` in all
        (their KV after this step's token)."""
        return self.seconds(StepShape(batch, batch, batch, context_tokens, 0.0, 0))

    def decode_slope(self, batch: int) -> float:
        """How much a pure decode step's time grows per step (each context grows by one)."""
        return self.per_context_token_s * batch

    def features(self, s: StepShape) -> list[float]:
        """The regressors multiplying each coefficient (in ``COEFFICIENTS`` order)."""
        tokens = max(0, s.num_tokens - self.roofline_tokens)
        return [
            1.0,
            float(tokens),
            float(s.num_seqs),
            float(s.num_sampled),
            float(s.context_tokens),
            float(s.attention_pairs),
        ]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any], where: str = "step") -> StepCost:
        known = {f.name for f in fields(StepCost)}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"{where}: unknown key(s) {', '.join(bad)}")
        return StepCost(**d)


@dataclass(frozen=True)
class TransferCost:
    """Moving ``n`` bytes of KV to a decode worker over one transport:
    ``latency_s + n / bytes_per_s`` (0 bytes_per_s = infinitely fast: latency only)."""

    latency_s: float = 0.0
    bytes_per_s: float = 0.0

    def seconds(self, num_bytes: float) -> float:
        if self.bytes_per_s <= 0:
            return self.latency_s
        return self.latency_s + num_bytes / self.bytes_per_s


@dataclass(frozen=True)
class SwapCost:
    """Copying ``n`` KV blocks between the device pool and the host tier (either way)."""

    latency_s: float = 0.0
    per_block_s: float = 0.0

    def seconds(self, num_blocks: int) -> float:
        return 0.0 if num_blocks <= 0 else self.latency_s + self.per_block_s * num_blocks
