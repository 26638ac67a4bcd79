"""One public description of a request in the engine: everything needed to continue it
elsewhere (request migration) or to report it, as plain data.

    prompt_token_ids + output_token_ids   the tokens so far (outputs already sampled)
    remaining_max_tokens / _min_tokens    what is left of the budget
    seed, num_sampled_tokens              a seeded generator that has drawn this many tokens
                                          is replayed to the same state elsewhere
    emitted_text, held_back_text          text already streamed, and text decoded but held
                                          back (a stop string may still complete there)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestSnapshot:
    request_id: str
    status: str  # a RequestStatus value
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    priority: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    remaining_max_tokens: int | None  # None: up to the model's length limit
    remaining_min_tokens: int
    seed: int | None
    num_sampled_tokens: int
    emitted_text: str
    held_back_text: str
    stop_reason: int | str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (lists for tuples; sampling params as their fields)."""
        d = dataclasses.asdict(self)
        d["prompt_token_ids"] = list(self.prompt_token_ids)
        d["output_token_ids"] = list(self.output_token_ids)
        params = dataclasses.asdict(self.sampling_params)
        params["stop"] = list(self.sampling_params.stop)
        params["stop_token_ids"] = list(self.sampling_params.stop_token_ids)
        d["sampling_params"] = params
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestSnapshot:
        """Inverse of ``to_dict``; raises ValueError (naming the field) for a bad value."""
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(d)
        if missing:
            raise ValueError(f"{sorted(missing)[0]}: missing from the request snapshot")
        values = {k: d[k] for k in fields}
        values["prompt_token_ids"] = tuple(int(t) for t in d["prompt_token_ids"])
        values["output_token_ids"] = tuple(int(t) for t in d["output_token_ids"])
        values["sampling_params"] = SamplingParams(**d["sampling_params"])
        return cls(**values)
