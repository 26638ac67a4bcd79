"""Per-request generation parameters, validated on construction.

Every invalid value raises ``ValueError`` whose message starts with the field's name, so the
services can map it to INVALID_ARGUMENT / HTTP 400 and the caller knows what to fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.structured.spec import StructuredOutput

_GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    ``temperature == 0`` means greedy. ``top_k == 0`` (or -1, as vLLM accepts) disables top-k;
    ``top_p == 1`` disables nucleus sampling. ``max_tokens=None`` means "until the model's
    length limit". ``logprobs=n`` returns the sampled token's logprob and the top ``n``.

    Penalties: ``presence_penalty`` / ``frequency_penalty`` (OpenAI's: subtracted from the
    logits of tokens already generated, once / per occurrence), ``repetition_penalty`` (HF's
    and vLLM's: logits of tokens in the prompt or the output divided by it when positive,
    multiplied when negative). ``logit_bias`` adds to the logits of given token ids.
    ``structured`` restricts every token to those its grammar allows. Logprobs are always
    those of the model's raw logits.
    """

    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()  # a str, list or tuple; stored as a tuple
    stop_token_ids: Sequence[int] = ()  # stored as a tuple
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] | Sequence[tuple[int, float]] = ()  # stored as sorted pairs
    structured: StructuredOutput | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        # Accept lists where tuples are expected (the frozen dataclass keeps tuples).
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, Mapping) else bias
        object.__setattr__(self, "logit_bias", tuple(sorted((t, b) for t, b in pairs)))
        self._validate()

    def _validate(self) -> None:
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens)
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        _check_int("top_k", self.top_k)
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 or -1 (disabled) or positive, got {self.top_k}")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not -(2**63) <= self.seed < 2**64:
                raise ValueError(f"seed must be in [-2**63, 2**64), got {self.seed}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must be non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t)
            if t < 0:
                raise ValueError(f"stop_token_ids must be non-negative, got {t}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= 20:
                raise ValueError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be positive, got {self.repetition_penalty}")
        for t, b in self.logit_bias:  # type: ignore[misc]
            _check_int("logit_bias", t)
            _check_number("logit_bias", b)
            if t < 0 or not -100.0 <= b <= 100.0:
                raise ValueError(
                    f"logit_bias maps token ids >= 0 to biases in [-100, 100], got {t}: {b}"
                )
        if self.structured is not None:
            if self.ignore_eos:
                raise ValueError(
                    f"ignore_eos cannot be combined with {self.structured.field}: the grammar "
                    "ends the output with an end-of-sequence token"
                )
            if self.min_tokens:
                raise ValueError(
                    f"min_tokens cannot be combined with {self.structured.field}: the grammar "
                    "decides where the output ends"
                )

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def needs_output_history(self) -> bool:
        """The sampler needs the output tokens so far (penalties, grammar replay)."""
        return self.has_penalties or self.structured is not None

    @property
    def needs_prompt_history(self) -> bool:
        """The sampler needs the prompt tokens (repetition penalty covers them too)."""
        return self.repetition_penalty != 1.0

    @property
    def is_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
