"""A request continued from an earlier run of it (request migration): the earlier run's
outputs ride at the end of the prompt ids, and this says how many of them there are.

    prompt_token_ids given to the engine:  | original prompt ....... | g1 .. gk |
                                                                      └ num_generated_tokens

The KV path treats all of it as a prompt (prefilled, transferred, cached like any other);
everything that depends on what was *generated* counts g1..gk as outputs: max/min tokens,
stop token checks, penalties, grammar state, the seeded generator's position (the sampler
draws token i's noise from (seed, i)), and the detokenizer, which replays them and hands out
only the text after ``emitted_text`` (what the client already has; the rest was held back
for a stop string that may complete across the switch).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResumeState:
    num_generated_tokens: int  # the last this many prompt ids are outputs already streamed
    emitted_text: str = ""  # the text already streamed for them

    def validate(self, num_prompt_ids: int, max_tokens: int | None) -> None:
        """Raises ValueError naming the problem."""
        k = self.num_generated_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"resume: num_generated_tokens must be >= 0, got {k!r}")
        if k >= num_prompt_ids:
            raise ValueError(
                f"resume: {k} generated tokens leave no prompt in {num_prompt_ids} prompt ids"
            )
        if max_tokens is not None and k >= max_tokens:
            raise ValueError(
                f"resume: {k} tokens already generated, max_tokens is {max_tokens}: "
                "nothing is left to generate"
            )
